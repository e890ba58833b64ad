"""runtime.compress: bitwise round trips, bounded decoding of hostile payloads, and the auto chooser."""

from __future__ import annotations

import struct
import time
import tracemalloc

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from edgec.runtime.wire import chooser
from edgec.runtime.wire.chooser import Calibration, Chooser, CodecSpeed
from edgec.runtime.wire.compress import PayloadError, decode, decode_array, encode, expected_nbytes, parse_mode
from edgec.runtime.errors import InputError

CODECS = ("none", "lz4", "zstd")
MiB = 1 << 20


def _arrays():
    rng = np.random.default_rng(7)
    relu = np.maximum(rng.standard_normal((2, 16, 9, 9), dtype=np.float32), 0)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3.4e38], np.float32)
    special = np.concatenate([special, np.frombuffer(struct.pack("<I", 0x7FC00123), np.float32)])  # a NaN payload
    big = rng.standard_normal((64, 64, 64), dtype=np.float32)
    return {
        "float32-relu": relu,
        "float32-special-bits": special,
        "float32-transposed": relu.transpose(0, 2, 3, 1),  # non-contiguous
        "float32-strided": big[:, ::3, 1:40:2],  # non-contiguous, inner axis strided
        "float32-fortran": np.asfortranarray(big[:7, :5, :3]),
        "float16": rng.standard_normal((3, 5, 7)).astype(np.float16),
        "float16-reversed": rng.standard_normal((4, 33)).astype(np.float16)[:, ::-1],
        "int64": rng.integers(-2**62, 2**62, (5, 11), dtype=np.int64),
        "int64-ids": rng.integers(0, 100, (1, 128), dtype=np.int64),
        "int64-column": rng.integers(0, 9, (10, 6), dtype=np.int64)[:, 2],
        "empty-float32": np.zeros((0, 3), np.float32),
        "empty-int64": np.zeros((4, 0, 2), np.int64),
        "scalar-0d": np.array(3.5, np.float32),
        "bool": rng.integers(0, 2, 37).astype(bool),
    }


ARRAYS = _arrays()


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_round_trip_is_bitwise(codec, name):
    arr = ARRAYS[name]
    payload = encode(codec, arr)
    out = decode_array(codec, payload, arr.dtype.name, list(arr.shape))
    assert out.dtype == arr.dtype and out.shape == arr.shape
    assert out.tobytes() == np.ascontiguousarray(arr).tobytes()  # bit for bit, NaN payloads and -0.0 included
    assert out.flags.c_contiguous
    # a non-contiguous view encodes to what its contiguous copy encodes to
    assert bytes(encode(codec, arr)) == bytes(encode(codec, arr.copy(order="C")))


@pytest.mark.parametrize("codec", CODECS)
def test_bytes_like_inputs(codec):
    data = bytes(range(256)) * 40
    empty_2d = memoryview(np.zeros((0, 3), np.float32))  # memoryview.cast("B") refuses this one
    for buf in (data, bytearray(data), memoryview(data), memoryview(data)[::2], np.frombuffer(data, np.uint8),
                memoryview(np.frombuffer(data, np.float64).reshape(16, -1)),
                memoryview(np.frombuffer(data, ">f4")), empty_2d, b""):
        expected = memoryview(buf).tobytes()
        assert bytes(decode(codec, encode(codec, buf), len(expected))) == expected


def test_none_is_zero_copy():
    arr = np.arange(1000, dtype=np.float32)
    view = encode("none", arr)
    assert len(view) == arr.nbytes and np.shares_memory(np.frombuffer(view, np.float32), arr)
    assert decode("none", view, arr.nbytes) is view


def test_compression_shrinks_activations():
    arr = ARRAYS["float32-relu"]
    for codec in ("lz4", "zstd"):
        assert len(encode(codec, arr)) < 0.9 * arr.nbytes


# -- hostile and wrong payloads ------------------------------------------------------------------------

def _peak_bytes_while(fn) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def bombs():
    """64 MiB of zeros, compressed: a few hundred KB (lz4) or a few KB (zstd)."""
    zeros = bytes(64 * MiB)
    out = {codec: encode(codec, zeros) for codec in ("lz4", "zstd")}
    # zstd again without the content size in its header, so only the output bound stops it
    out["zstd-no-size"] = zstandard.ZstdCompressor(level=1, write_content_size=False).compress(zeros)
    return out


@pytest.mark.parametrize("kind", ["lz4", "zstd", "zstd-no-size"])
def test_bomb_refused_without_big_allocation(bombs, kind):
    payload, codec = bombs[kind], kind.split("-")[0]
    assert len(payload) < MiB
    with pytest.raises(PayloadError):
        decode(codec, payload, 16)  # smallest: no big output buffer
    caught = []

    def attempt():
        try:
            decode(codec, payload, MiB)
        except PayloadError as exc:
            caught.append(exc)

    peak = _peak_bytes_while(attempt)
    assert caught, "a 64 MiB bomb decoded into a 1 MiB tensor"
    assert peak < 2 * MiB + 256 * 1024, f"decoding a bomb allocated {peak} bytes"


def _zstd_frame_claiming(size: int) -> bytes:
    """A zstd frame whose header claims `size` bytes of content, followed by one raw 4-byte block."""
    descriptor = 0b11_1_0_0_0_00  # 8-byte frame content size, single segment, no checksum, no dictionary
    block = 1 | (0 << 1) | (4 << 3)  # last block, raw, 4 bytes
    return (b"\x28\xb5\x2f\xfd" + bytes([descriptor]) + struct.pack("<Q", size)
            + block.to_bytes(3, "little") + b"abcd")


def test_zstd_header_claiming_a_terabyte_allocates_nothing():
    payload = _zstd_frame_claiming(1 << 40)
    assert zstandard.frame_content_size(payload) == 1 << 40
    peak = _peak_bytes_while(lambda: pytest.raises(PayloadError, decode, "zstd", payload, 4))
    assert peak < 64 * 1024
    assert decode("zstd", _zstd_frame_claiming(4), 4) == b"abcd"  # the hand-made frame itself is valid


def test_zstd_skippable_frame_refused():
    skippable = b"\x50\x2a\x4d\x18" + struct.pack("<I", 4) + b"abcd"
    for expected in (0, 4):
        with pytest.raises(PayloadError):
            decode("zstd", skippable, expected)


@pytest.mark.parametrize("codec", CODECS)
def test_wrong_sizes_refused(codec):
    data = np.arange(1000, dtype=np.float32)
    payload = encode(codec, data)
    assert bytes(decode(codec, payload, data.nbytes)) == data.tobytes()
    for wrong in (0, 1, data.nbytes - 4, data.nbytes - 1, data.nbytes + 1, 2 * data.nbytes):
        with pytest.raises(PayloadError):
            decode(codec, payload, wrong)
    with pytest.raises(PayloadError):
        decode(codec, payload, -1)
    with pytest.raises(PayloadError):
        decode(codec, payload, float(data.nbytes))
    with pytest.raises(PayloadError):
        decode(codec, payload, data.nbytes, limit=data.nbytes - 1)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_truncated_extended_and_empty_payloads_refused(codec):
    data = np.maximum(np.random.default_rng(1).standard_normal(5000, dtype=np.float32), 0)
    payload = bytes(encode(codec, data))
    for bad in (payload[:-1], payload[: len(payload) // 2], payload + b"\x00", payload + payload, b""):
        with pytest.raises(PayloadError):
            decode(codec, bad, data.nbytes)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_empty_tensor_payload_with_trailing_bytes_refused(codec):
    payload = bytes(encode(codec, b""))
    assert decode(codec, payload, 0) == b""
    for bad in (payload + b"\x00", payload + payload, payload + bytes(encode(codec, b"abc"))):
        with pytest.raises(PayloadError):
            decode(codec, bad, 0)


def test_zstd_frame_without_size_is_bounded_by_expected():
    data = bytes(range(200)) * 50
    payload = zstandard.ZstdCompressor(level=1, write_content_size=False).compress(data)
    assert decode("zstd", payload, len(data)) == data
    for wrong in (len(data) - 1, len(data) + 1):
        with pytest.raises(PayloadError):
            decode("zstd", payload, wrong)


def test_unknown_codecs_and_modes():
    with pytest.raises(PayloadError, match="unknown codec"):
        decode("gzip", b"x", 1)
    with pytest.raises(PayloadError):
        decode("lz4", 12345, 1)  # not bytes
    with pytest.raises(ValueError, match="unknown codec"):
        encode("gzip", b"x")
    assert [parse_mode(m) for m in ("none", "LZ4", " zstd ", "auto")] == ["none", "lz4", "zstd", "auto"]
    with pytest.raises(InputError) as info:
        parse_mode("brotli")
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    assert issubclass(PayloadError, ValueError) and PayloadError("x").exit_code == 3


@settings(max_examples=300, deadline=None)
@given(codec=st.sampled_from(CODECS), payload=st.binary(max_size=300), expected=st.integers(0, 4096))
def test_random_payloads_never_crash(codec, payload, expected):
    try:
        out = decode(codec, payload, expected)
    except PayloadError:
        return
    assert len(out) == expected


@settings(max_examples=200, deadline=None)
@given(codec=st.sampled_from(["lz4", "zstd"]), data=st.binary(min_size=1, max_size=2000), pos=st.integers(0),
       flip=st.integers(1, 255))
def test_corrupted_payloads_decode_exactly_or_are_refused(codec, data, pos, flip):
    payload = bytearray(encode(codec, data))
    payload[pos % len(payload)] ^= flip
    try:
        out = decode(codec, bytes(payload), len(data))
    except PayloadError:
        return
    assert len(out) == len(data)  # corruption may go unnoticed (no checksum) but never changes the size


def test_expected_nbytes_validates_headers():
    assert expected_nbytes("float32", [2, 3]) == 24
    assert expected_nbytes("int64", []) == 8
    assert expected_nbytes("float16", (0, 5)) == 0
    for dtype, shape in [("float32", [-1, 2]), ("float32", [2.0]), ("float32", [True]), ("float32", "ab"),
                         ("float32", [1] * 33), ("object", [1]), ("S4", [1]), ("V8", [1]), ("nonsense", [1]),
                         ([("a", "f4")], [1]), ("(2,)f4", [1]), ("datetime64[s]", [1])]:
        with pytest.raises(PayloadError):
            expected_nbytes(dtype, shape)
    with pytest.raises(PayloadError):
        expected_nbytes("float32", [1 << 40, 1 << 40], limit=1 << 30)
    with pytest.raises(PayloadError):
        decode_array("none", b"\x00" * 8, "object", [1])


# -- the chooser ----------------------------------------------------------------------------------------

def _calibration(compress_mbs=300.0, decompress_mbs=1000.0) -> Calibration:
    """Injected speeds: lz4 2x faster than zstd, zstd compresses 20% better; dense data barely at all."""
    mbs = 1e6

    def codec(speed, ratio_sparse, ratio_dense):
        return (CodecSpeed(ratio_sparse, speed * compress_mbs * mbs, speed * decompress_mbs * mbs),
                CodecSpeed(ratio_dense, 10 * speed * compress_mbs * mbs, 10 * speed * decompress_mbs * mbs))

    return Calibration(points={"lz4": codec(2.0, 0.65, 1.0), "zstd": codec(1.0, 0.52, 0.93)},
                       overhead_s={"lz4": 2e-6, "zstd": 4e-6},
                       priors={"float32": {"lz4": 0.65, "zstd": 0.52}, "float16": {"lz4": 0.8, "zstd": 0.6},
                               "int64": {"lz4": 0.5, "zstd": 0.25}})


def test_chooser_none_on_a_fast_link_a_codec_on_a_slow_one():
    cal = _calibration()
    nbytes = 4 * MiB
    assert Chooser("auto", 10_000, calibration=cal).choose("act", "float32", nbytes) == "none"
    assert Chooser("auto", 10, calibration=cal).choose("act", "float32", nbytes) == "zstd"
    # at 1 Gbps the faster codec wins: zstd's extra compress time costs more than its smaller output saves
    mid = Chooser("auto", 1000, calibration=cal)
    times = {c: mid.predict(nbytes, c, cal.priors["float32"].get(c, 1.0), 1000) for c in CODECS}
    assert mid.choose("act", "float32", nbytes) == min(times, key=times.get)
    assert mid.choose("act", "float32", nbytes) == "lz4"
    # a CPU 30x slower turns compression off on the same 100 Mbps link
    assert Chooser("auto", 100, calibration=cal).choose("act", "float32", nbytes) == "zstd"
    slow = _calibration(compress_mbs=10.0, decompress_mbs=33.0)
    assert Chooser("auto", 100, calibration=slow).choose("act", "float32", nbytes) == "none"
    # the receiver's decompress speed counts: a fast sender to a very slow receiver
    crawl = _calibration(compress_mbs=300.0, decompress_mbs=5.0)
    assert Chooser("auto", 100, calibration=cal, peer_calibration=crawl).choose("act", "float32", nbytes) == "none"


def test_chooser_follows_the_formula():
    cal = _calibration()
    ch = Chooser("auto", 10, calibration=cal)
    nbytes = MiB
    c_pb, _ = cal.costs("zstd", 0.52)
    _, d_pb = cal.costs("zstd", 0.52)
    expected = 4e-6 + nbytes * (c_pb + d_pb) + nbytes * 0.52 / (10e6 / 8)
    assert ch.predict(nbytes, "zstd", 0.52, 10) == pytest.approx(expected)
    assert ch.predict(nbytes, "none", 1.0, 10) == pytest.approx(nbytes / (10e6 / 8))
    # speeds interpolate between the sample points by ratio
    mid_c, _ = cal.costs("lz4", (0.65 + 1.0) / 2)
    assert mid_c == pytest.approx((1 / 600e6 + 1 / 6000e6) / 2)


def test_chooser_tiny_tensors_and_fixed_modes():
    cal = _calibration()
    assert Chooser("auto", 1, calibration=cal).choose("t", "float32", 100) == "none"
    assert Chooser("auto", 1, calibration=cal).choose("t", "float32", 0) == "none"
    for mode in CODECS:
        ch = Chooser(mode)  # a fixed mode needs neither a bandwidth nor a calibration
        assert ch.choose("t", "float32", 10 * MiB) == mode and ch._cal is None
    with pytest.raises(ValueError):
        Chooser("brotli")
    with pytest.raises(ValueError):
        Chooser("auto", 0)
    with pytest.raises(ValueError):
        Chooser("auto", calibration=cal).choose("t", "float32", MiB)  # no bandwidth anywhere
    assert Chooser("auto", calibration=cal).choose("t", "float32", MiB, bandwidth_mbps=10) == "zstd"


def test_chooser_learns_ratio_per_tensor_name():
    cal = _calibration()
    ch = Chooser("auto", 100, calibration=cal, alpha=0.5, reprobe_every=5)
    nbytes = 4 * MiB
    assert ch.choose("dense", "float32", nbytes) == "zstd"  # prior: optimistic
    ch.observe("dense", "zstd", nbytes, nbytes)  # the first observation replaces the prior
    assert ch.ratio("dense", "float32", "zstd") == 1.0
    assert ch.choose("dense", "float32", nbytes) == "none"
    # lz4's estimate for the name follows zstd's history, scaled by the calibration priors
    assert ch.ratio("dense", "float32", "lz4") == pytest.approx(ch.ratio("dense", "float32", "zstd") * 0.65 / 0.52)
    # another name keeps its own history
    assert ch.choose("sparse", "float32", nbytes) == "zstd"
    ch.observe("sparse", "zstd", nbytes, int(nbytes * 0.3))
    assert ch.choose("sparse", "float32", nbytes) == "zstd"
    # a 5% saving still pays on 100 Mbps: dense data compresses at GB/s
    ch.observe("nearly", "zstd", nbytes, int(nbytes * 0.95))
    assert ch.choose("nearly", "float32", nbytes) == "zstd"
    # after reprobe_every raw transfers, the dense tensor is tried once more with the prior's best codec
    decisions = []
    for _ in range(5):
        codec = ch.choose("dense", "float32", nbytes)
        decisions.append(codec)
        ch.observe("dense", codec, nbytes, nbytes)
    assert decisions == ["none", "none", "none", "none", "zstd"]
    # the probe found compressible data: the average moves and compression resumes
    ch.observe("dense", "zstd", nbytes, int(nbytes * 0.2))
    assert ch.ratio("dense", "float32", "zstd") == pytest.approx(0.5 * 1.0 + 0.5 * 0.2)  # then an average
    assert ch.choose("dense", "float32", nbytes) == "zstd"


def test_chooser_history_is_bounded():
    ch = Chooser("auto", 10, calibration=_calibration(), max_names=3)
    for i in range(10):
        ch.observe(f"t{i}", "zstd", 1000, 500)
    assert list(ch._history) == ["t7", "t8", "t9"]


def test_chooser_encode_round_trips_and_sends_raw_when_compression_does_not_shrink():
    ch = Chooser("auto", 1, calibration=_calibration())
    sparse = np.maximum(np.random.default_rng(3).standard_normal(64 * 1024, dtype=np.float32), 0)
    codec, payload = ch.encode("relu", sparse)
    assert codec == "zstd" and len(payload) < sparse.nbytes
    assert np.array_equal(decode_array(codec, payload, sparse.dtype, sparse.shape), sparse)
    noise = np.random.default_rng(4).integers(0, 256, 256 * 1024, dtype=np.uint8)  # incompressible
    codec, payload = ch.encode("noise", noise)
    assert codec == "none" and len(payload) == noise.nbytes
    assert ch.ratio("noise", noise.dtype, "zstd") >= 1.0  # learnt: the next transfer will not try
    assert ch.choose("noise", noise.dtype, noise.nbytes) == "none"
    codec, payload = Chooser("lz4").encode("noise", noise)  # a fixed mode also falls back to raw
    assert codec == "none"


def test_calibration_serialises_and_rejects_malformed_data():
    cal = _calibration()
    again = Calibration.from_dict(cal.to_dict())
    assert again.points == cal.points and again.priors == cal.priors and again.overhead_s == cal.overhead_s
    data = cal.to_dict()
    for broken in ({}, {**data, "points": {"lz4": data["points"]["lz4"]}},
                   {**data, "points": {**data["points"], "zstd": [[0.5, -1.0, 1.0]]}},
                   {**data, "priors": {"float32": {"lz4": 0.5}}}, {**data, "overhead_s": "x"}):
        with pytest.raises(PayloadError):
            Calibration.from_dict(broken)


def test_real_calibration_is_cached_and_sane():
    """What the calibration finds about the data (sizes, compression ratios) and that it is measured once; its
    speeds are the machine's (the slow test below)."""
    cal = chooser._measure()
    for codec in ("lz4", "zstd"):
        assert len(cal.points[codec]) == 4 and cal.overhead_s[codec] > 0
        assert all(p.compress_bps > 0 and p.decompress_bps > 0 for p in cal.points[codec])
        assert cal.priors["float32"][codec] < 0.9  # post-ReLU activations compress
    assert cal.priors["float32"]["zstd"] < cal.priors["float32"]["lz4"]
    assert chooser.calibrate() is chooser.calibrate()
    assert Chooser("auto", 10).calibration is chooser.calibrate()


@pytest.mark.slow
def test_real_calibration_is_fast():
    """The calibration every run pays on first use: under a second, codecs at 10 MB/s and more, a call's
    overhead under a millisecond. Slow: these time this machine (a busy one may miss them)."""
    t0 = time.perf_counter()
    cal = chooser._measure()
    assert time.perf_counter() - t0 < 1.0
    for codec in ("lz4", "zstd"):
        assert cal.overhead_s[codec] < 1e-3
        assert all(p.compress_bps > 10e6 and p.decompress_bps > 10e6 for p in cal.points[codec])
