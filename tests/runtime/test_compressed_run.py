"""`edgec run --compress`: device-to-device tensors compressed by the sending worker and decoded by the
receiving one (runtime/wire/compress.py through runtime/wire/transport.py and runtime/device/session.py). Every mode gives
bitwise the outputs of `none`; the wire bytes shrink and are reported per device; auto follows the link's
bandwidth; --emulate delays a send by its compressed size; a forged payload that decodes to the wrong size
is dropped and the worker carries on; a bad mode is one line and exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import lz4.block
import msgpack
import numpy as np
import pytest
import zmq
import zstandard
from click.testing import CliRunner

import edgec
from edgec.runtime.front.api import execute
from edgec.runtime.front.cli import run as run_cmd
from edgec.runtime.coordinator.pool import WorkerPool
from edgec.runtime.errors import InputError
from edgec.runtime.coordinator.inputs import random_inputs
from edgec.runtime.manifest.load import load_manifest
from edgec.runtime.wire.transport import BadMessage, decode_tensor, pack, tensor_frames, tensor_header
from edgec.runtime.coordinator.verify import reference_outputs

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
CLUSTERS = REPO / "tests" / "e2e" / "clusters"
MODES = ("none", "lz4", "zstd", "auto")


@pytest.fixture(scope="module")
def tinyconv(tmp_path_factory) -> Path:
    """tinyconv as a two-stage pipeline pi5-a -> pi5-b, its one cut a post-ReLU activation."""
    out = tmp_path_factory.mktemp("tinyconv") / "build"
    edgec.compile(MODELS / "tinyconv.onnx", CLUSTERS / "four.yaml", out, strategy="pipeline", objective="throughput")
    m = load_manifest(out / "manifest.json")
    assert [(t.src, t.dst) for t in m.transfers] == [("pi5-a", "pi5-b")]
    return out


def with_link(build: Path, dest: Path, mbps: float) -> Path:
    """A copy of `build` whose devices talk over `mbps` (the manifest's only link, and the default)."""
    shutil.copytree(build, dest)
    path = dest / "manifest.json"
    doc = json.loads(path.read_text())
    doc["network"]["bandwidth_mbps"] = mbps
    for link in doc["network"]["links"]:
        link["bandwidth_mbps"] = mbps
    path.write_text(json.dumps(doc))
    return dest


def run_all(build: Path, requests: list[dict], mode: str) -> tuple[list[dict], dict]:
    """Outputs of every request (local workers), and the per-device report."""
    with WorkerPool(load_manifest(build / "manifest.json"), timeout=60, compress=mode) as c:
        outputs = [out for out, _, _ in c.stream(requests)]
    return outputs, c.device_report()


# -- runs ------------------------------------------------------------------------------------------------------
def test_every_mode_gives_bitwise_the_outputs_of_none(tinyconv):
    m = load_manifest(tinyconv / "manifest.json")
    requests = [random_inputs(m.inputs, seed) for seed in range(4)]
    plain, report = run_all(tinyconv, requests, "none")
    assert report["pi5-a"]["bytes_sent"] == report["pi5-a"]["bytes_sent_raw"] > 0
    assert report["pi5-a"]["sends_compressed"] == 0
    for mode in ("lz4", "zstd", "auto"):
        got, report = run_all(tinyconv, requests, mode)
        for want, out in zip(plain, got):
            assert want.keys() == out.keys()
            assert all(np.array_equal(want[k], out[k]) and want[k].dtype == out[k].dtype for k in want), mode
        a, b = report["pi5-a"], report["pi5-b"]
        assert a["bytes_sent"] == b["bytes_received"]  # pi5-a sends only to pi5-b (outputs come from pi5-b)
        assert a["bytes_sent_raw"] == b["bytes_received_raw"]
        if mode != "auto":  # the manifest's 1000 Mbps link: auto's choice depends on this machine's speed
            assert a["sends_compressed"] == len(requests)
            assert a["bytes_sent"] < a["bytes_sent_raw"], (mode, a)  # post-ReLU activations shrink
    want = reference_outputs(m, requests[0])
    assert all(np.allclose(plain[0][k], want[k], atol=1e-5) for k in want)


def test_auto_compresses_on_a_slow_link_and_not_on_a_fast_one(tinyconv, tmp_path):
    m = load_manifest(tinyconv / "manifest.json")
    requests = [random_inputs(m.inputs, seed) for seed in range(3)]
    slow = with_link(tinyconv, tmp_path / "slow", 0.1)
    fast = with_link(tinyconv, tmp_path / "fast", 100_000.0)
    raw, _ = run_all(slow, requests, "none")
    slow_out, slow_report = run_all(slow, requests, "auto")
    fast_out, fast_report = run_all(fast, requests, "auto")
    assert slow_report["pi5-a"]["sends_compressed"] == len(requests)
    assert slow_report["pi5-a"]["bytes_sent"] < slow_report["pi5-a"]["bytes_sent_raw"]
    assert fast_report["pi5-a"]["sends_compressed"] == 0
    assert fast_report["pi5-a"]["bytes_sent"] == fast_report["pi5-a"]["bytes_sent_raw"]
    for want, a, b in zip(raw, slow_out, fast_out):
        assert all(np.array_equal(want[k], a[k]) and np.array_equal(want[k], b[k]) for k in want)


def test_emulated_links_carry_the_compressed_bytes(chain):
    """Zero inputs make t1 = relu(bias): 1024 raw bytes that zstd writes in a few dozen. At 0.02 Mbit/s the
    raw tensor takes 410 ms on the emulated link, the compressed one a few ms."""
    chain.manifest["network"]["links"] = [{"a": "pi4-a", "b": "pi5-a", "bandwidth_mbps": 0.02, "latency_ms": 0.0}]
    chain.write()
    zeros = {"data": np.zeros((1, 3, 8, 8), np.float32)}
    latency = {}
    for mode in ("none", "zstd"):
        _, result, _ = execute(chain.folder, arrays=zeros, emulate=True, compress=mode)
        latency[mode] = result.latency_ms
        sent = result.devices["pi5-a"]
        if mode == "zstd":
            assert sent["bytes_sent"] < 100 <= sent["bytes_sent_raw"], sent
    assert latency["none"] >= 400.0, latency
    assert latency["zstd"] < latency["none"] / 2, latency


# -- hostile payloads -----------------------------------------------------------------------------------------
def forged(req: int, src: str, name: str, shape: tuple[int, ...]) -> list[list[bytes]]:
    """Well-formed tensor messages for an expected tensor whose compressed payload does not decode to
    shape x float32 bytes: too short, too long (with and without a declared size), corrupt."""
    nbytes = int(np.prod(shape)) * 4
    header = {"t": "tensor", "req": req, "src": src, "tensor": name, "dtype": "float32", "shape": list(shape)}
    zstd_no_size = zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * (nbytes * 64))
    payloads = [
        ("zstd", zstandard.ZstdCompressor().compress(b"\1" * (nbytes // 2))),  # declares half the size
        ("zstd", zstandard.ZstdCompressor().compress(b"\1" * (nbytes * 2))),  # declares twice the size
        ("zstd", zstd_no_size),  # no declared size: a 64x bomb, stopped at nbytes
        ("lz4", lz4.block.compress(b"\0" * (nbytes * 64), store_size=False)),  # a 64x bomb
        ("lz4", lz4.block.compress(b"\0" * (nbytes - 4), store_size=False)),  # 4 bytes short
        ("zstd", b"\x28\xb5\x2f\xfd" + b"\xff" * 40),  # a zstd magic number, then garbage
    ]
    return [[pack({**header, "codec": codec}), payload] for codec, payload in payloads]


# What the worker logs for forged()'s payloads (each reason's first few drops are warnings: protocol.DropLog)
WHYS = ("zstd frame declares 512 bytes, expected 1024", "zstd frame declares 2048 bytes, expected 1024",
        "zstd payload is corrupt or decodes to more than 1024 bytes",
        "lz4 payload is corrupt or decodes to more than 1024 bytes", "lz4 payload decodes to 1020 bytes")


def _log(worker) -> str:
    worker.log.seek(0)
    return worker.log.read().decode(errors="replace")


def test_a_forged_payload_of_the_wrong_size_is_dropped_and_the_run_goes_on(chain):
    """Before any request runs, pi4-a's data socket gets compressed t1 tensors for request 0 (the one it
    will wait for) that decode to the wrong size. Each is dropped and logged; request 0 then computes
    from the real t1, and the next requests too."""
    m = load_manifest(chain.path)
    requests = [random_inputs(m.inputs, seed) for seed in range(3)]
    messages = forged(0, "pi5-a", "t1", (1, 4, 8, 8))
    with WorkerPool(m, timeout=60, compress="zstd") as c:
        push = c.ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        # The run made its own keys (no --keys): pose as pi5-a with pi5-a's, to reach the payload checks.
        c.keys.member("pi5-a").connect_to(push, c.workers["pi4-a"].key)
        push.connect(c.workers["pi4-a"].data_addr)
        for frames in messages:
            push.send_multipart(frames)
        worker = c.workers["pi4-a"]
        # handled before request 0's real t1 is even computed: waited for (bounded), however busy the machine
        deadline = time.monotonic() + 60
        while not all(f"malformed: {why}" in _log(worker) for why in WHYS) and time.monotonic() < deadline:
            time.sleep(0.01)
        got = [out for out, _, _ in c.stream(requests)]
        assert worker.proc.poll() is None
        worker.log.seek(0)
        log = worker.log.read().decode(errors="replace")
    assert c.device_report()["pi4-a"]["dropped"] >= len(messages)
    assert "Traceback" not in log, log
    for why in WHYS:
        assert f"dropped a message (malformed: {why}" in log, (why, log)
    for inputs, out in zip(requests, got):
        want = reference_outputs(m, inputs)
        assert all(np.allclose(out[k], want[k], atol=1e-5) for k in want)


def test_the_transport_refuses_a_compressed_payload_of_the_wrong_size_or_too_large():
    array = np.maximum(np.random.default_rng(0).standard_normal((4, 256)), 0).astype(np.float32)
    for codec in ("lz4", "zstd"):
        header, payload = tensor_frames(7, "a", "x", array, codec)
        msg = decode_tensor(_unpacked(header), _Frame(bytes(payload)))
        assert np.array_equal(msg.array, array) and msg.codec == codec and msg.nbytes == len(payload) < array.nbytes
        wrong = {**_unpacked(header), "shape": [4, 255]}
        with pytest.raises(BadMessage, match="decodes|declares|corrupt"):
            decode_tensor(wrong, _Frame(bytes(payload)))
    huge = {"t": "tensor", "req": 0, "src": "a", "tensor": "x", "dtype": "float32", "shape": [1 << 40], "codec": "zstd"}
    with pytest.raises(BadMessage, match="more than the 4096 allowed"):
        tensor_header(huge, max_bytes=4096)  # refused before any payload is decoded


def _unpacked(frame) -> dict:
    return msgpack.unpackb(frame, raw=False)


class _Frame:
    """What decode_tensor reads from a zmq.Frame: its buffer, and no CURVE User-Id."""

    def __init__(self, data: bytes):
        self.buffer = memoryview(data)

    def get(self, what):
        raise zmq.ZMQError(zmq.EINVAL)


# -- bad input --------------------------------------------------------------------------------------------------
def test_a_bad_compress_mode_is_one_line_and_exit_2(chain):
    proc = subprocess.run([sys.executable, "-m", "edgec.runtime", str(chain.path), "--random-inputs", "--compress",
                           "gzip"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgec: ") and "--compress" in lines[0] and "gzip" in lines[0]
    with pytest.raises(InputError, match="--compress 'gzip': expected one of none, lz4, zstd, auto"):
        edgec.run(chain.folder, random_inputs=True, compress="gzip")


def test_json_reports_the_mode_and_raw_and_wire_bytes_per_device(chain):
    res = CliRunner().invoke(run_cmd, [str(chain.path), "--random-inputs", "--json", "--compress", "ZSTD"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["compress"] == "zstd"
    a, b = report["devices"]["pi5-a"], report["devices"]["pi4-a"]
    assert a["sends_compressed"] == 2  # warm-up and one timed request
    assert a["bytes_sent"] == b["bytes_received"] < a["bytes_sent_raw"] == b["bytes_received_raw"] == 2 * 1024
    assert b["bytes_sent"] == b["bytes_sent_raw"] == 2 * 40  # the output goes to the coordinator raw
