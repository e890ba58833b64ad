"""Unit tests without worker processes: inputs, transport, emulation, verification, import hygiene."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgec.runtime.device.emulate import DelayedLinks, pad_run
from edgec.runtime.errors import InputError
from edgec.runtime.coordinator.inputs import load_inputs, random_inputs
from edgec.runtime.manifest.types import Fragment, TensorSpec
from edgec.runtime.manifest.load import load_manifest
from edgec.runtime.wire.inbox import Inbox
from edgec.runtime.wire.protocol import parse
from edgec.runtime.wire.transport import bind_local, decode_tensor, send_tensor
from edgec.runtime.coordinator.verify import compare_outputs

REPO = Path(__file__).resolve().parents[2]
BANNED = ("edgec.compiler", "networkx", "ortools", "onnx_graphsurgeon", "onnx", "yaml")


# `edgec profile`'s benchmark models are built with onnx: the device installs it with the `profile` extra
# (runtime/dist), so only these modules may need it.
PROFILE_EXTRA = ("edgec.runtime.profile.",)


def test_runtime_imports_nothing_device_cannot_install():
    code = (
        "import importlib, pkgutil, sys, edgec.runtime as runtime\n"
        "names = [m.name for m in pkgutil.walk_packages(runtime.__path__, 'edgec.runtime.')]\n"
        "assert {'edgec.runtime.front.cli', 'edgec.runtime.device.worker', 'edgec.runtime.coordinator.pool',"
        " 'edgec.runtime.manifest', 'edgec.runtime.profile.measure'} <= set(names), names\n"
        f"extra = [n for n in names if n.startswith({PROFILE_EXTRA!r})]\n"
        "def bad(allowed=()):\n"
        f"    return sorted(m for m in sys.modules if (m in {BANNED!r} or m.split('.')[0] in {BANNED!r}"
        f" or m.startswith('edgec.compiler')) and m.split('.')[0] not in allowed)\n"
        "for n in names:\n"
        "    if n not in extra: importlib.import_module(n)\n"
        "print(len(names)); print(bad())\n"
        "for n in extra: importlib.import_module(n)\n"
        "print(bad(allowed=('onnx',)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    count, bad, bad_with_extra = proc.stdout.splitlines()
    assert int(count) >= 10 and bad == "[]", proc.stdout  # the runtime and the commands, without the extra
    assert bad_with_extra == "[]", proc.stdout  # the profile's measuring: onnx, and nothing else


def test_no_pickle_in_runtime_sources():
    paths = sorted((REPO / "runtime").rglob("*.py"))
    assert any(p.parent.name == "wire" for p in paths)  # the rooms are searched too
    for path in paths:
        text = path.read_text(encoding="utf-8")
        assert "pickle" not in text.replace("allow_pickle=False", ""), path
        assert "multiprocessing" not in text, path


def test_random_inputs_follow_names_shapes_dtypes():
    specs = [TensorSpec("input_ids", (2, 7), "int64"), TensorSpec("attention_mask", (2, 7), "int64"),
             TensorSpec("token_type_ids", (2, 7), "int64"), TensorSpec("pixels", (1, 3), "float16"),
             TensorSpec("flag", (4,), "bool")]
    a = random_inputs(specs, seed=5)
    assert {k: (v.shape, v.dtype.name) for k, v in a.items()} == {s.name: (s.shape, s.dtype) for s in specs}
    assert a["input_ids"].min() >= 0 and a["input_ids"].max() < 100
    assert (a["attention_mask"] == 1).all() and (a["token_type_ids"] == 0).all()
    b = random_inputs(specs, seed=5)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_inputs_options_errors(chain, tmp_path):
    m = load_manifest(chain.path, check_files=False)
    with pytest.raises(InputError, match="expected NAME=FILE.npy"):
        load_inputs(m, pairs=["data"])
    with pytest.raises(InputError, match="cannot be combined"):
        load_inputs(m, npz="x.npz", random=True)
    with pytest.raises(InputError, match="--random-inputs"):
        load_inputs(m)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match=r"junk.npz: cannot read as .npz"):
        load_inputs(m, npz=str(tmp_path / "junk.npz"))
    np.savez(tmp_path / "empty.npz", other=np.zeros(1))
    with pytest.raises(InputError, match="'other' is not a model input"):
        load_inputs(m, npz=str(tmp_path / "empty.npz"))


def _receive(pull: zmq.Socket):
    assert pull.poll(5000)
    header, payload = parse(pull.recv_multipart(copy=False), {"tensor"})
    return decode_tensor(header, payload)


def test_inbox_buffers_out_of_order_and_regions_are_contiguous():
    ctx = zmq.Context()
    try:
        pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        push.connect(bind_local(pull))
        big = np.arange(2 * 3 * 200 * 100, dtype=np.float32).reshape(2, 3, 200, 100)
        send_tensor(push, 1, "b", "late", big[:, :, :, 10:20])  # inner-axis view: copied to contiguous
        send_tensor(push, 0, "a", "first", big)
        inbox = Inbox({("a", "first"), ("b", "late")}, window=2, max_bytes=1 << 30)
        late, first = _receive(pull), _receive(pull)
        assert inbox.offer(late) is None and inbox.offer(first) is None
        assert np.array_equal(inbox.take((0, "a", "first")), big)
        assert np.array_equal(inbox.take((1, "b", "late")), big[:, :, :, 10:20])
        assert not inbox.buffer and inbox.bytes == 0
    finally:
        ctx.destroy(linger=0)


def test_inbox_keeps_only_expected_tensors_inside_the_window_and_the_byte_cap():
    from edgec.runtime.wire.inbox import FULL
    from edgec.runtime.wire.transport import TensorMsg

    def msg(req, src="a", name="t", n=4):
        return TensorMsg(req, src, name, np.zeros(n, np.float32), 4 * n)

    inbox = Inbox({("a", "t")}, window=2, max_bytes=40)
    assert "not a tensor" in inbox.offer(msg(0, src="x"))
    assert "not a tensor" in inbox.offer(msg(0, name="u"))
    assert "outside the window" in inbox.offer(msg(2))
    assert inbox.offer(msg(0)) is None and inbox.offer(msg(0)) == "duplicate"
    assert inbox.offer(msg(1, n=8)) == FULL  # 16 + 32 bytes > 40
    assert inbox.offer(msg(1, n=6)) is None and inbox.bytes == 40
    inbox.advance(0)  # request 0 done: the window moves to [1, 3)
    assert inbox.bytes == 24 and "outside the window" in inbox.offer(msg(0)) and inbox.offer(msg(2)) is None


def test_pad_run_and_delayed_links(chain):
    frag = Fragment("f", "d", "f.onnx", "0", (), (), predicted_ms=30.0)
    start = time.perf_counter()
    assert pad_run(frag, 0.001) == pytest.approx(0.030)
    assert time.perf_counter() - start >= 0.028
    assert pad_run(frag, 0.050) == 0.050
    chain.manifest["network"]["latency_ms"] = 25.0
    from edgec.runtime.manifest.load import parse_manifest

    links = DelayedLinks(parse_manifest(chain.manifest, chain.path), "pi5-a")
    sent: list[float] = []
    start = time.perf_counter()
    links.submit("pi4-a", 0, lambda: sent.append(time.perf_counter() - start))
    links.submit("pi4-a", 0, lambda: sent.append(time.perf_counter() - start))  # queues behind the first
    links.close()
    assert len(sent) == 2 and sent[0] >= 0.024 and sent[1] >= 0.049


def test_compare_outputs_tolerance_scales_with_reference():
    ref = {"a": np.array([1000.0, 0.0], np.float32), "b": np.array([0.5], np.float32)}
    ok = compare_outputs({"a": ref["a"] + np.float32(0.05), "b": ref["b"]}, ref, 1e-4)
    assert ok.passed and ok.worst_output == "a"
    bad = compare_outputs({"a": ref["a"], "b": ref["b"] + np.float32(0.01)}, ref, 1e-4)
    assert not bad.passed and bad.worst_output == "b" and bad.max_abs_diff == pytest.approx(0.01)
    assert not compare_outputs({"a": ref["a"][:1], "b": ref["b"]}, ref, 1e-4).passed
    nan = {"a": np.array([np.nan, 0.0]), "b": ref["b"]}
    assert compare_outputs(nan, nan, 1e-4).passed


@pytest.fixture(scope="module")
def zmq_pair():
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    push.connect(bind_local(pull))
    yield push, pull
    ctx.destroy(linger=0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(0, 5), min_size=0, max_size=4),
       dtype=st.sampled_from(["float32", "float16", "float64", "int64", "int8", "uint8", "bool"]),
       axis_cut=st.integers(0, 3), data=st.data())
def test_tensor_roundtrip_any_shape_dtype_and_region(zmq_pair, shape, dtype, axis_cut, data):
    push, pull = zmq_pair
    array = (np.arange(int(np.prod(shape)), dtype=np.int64) % 7).astype(dtype).reshape(shape)
    if shape and shape[axis_cut % len(shape)] > 0:  # also a (generally non-contiguous) region view
        axis = axis_cut % len(shape)
        start = data.draw(st.integers(0, shape[axis] - 1))
        array = np.take(array, range(start, shape[axis]), axis=axis) if axis == 0 else array.swapaxes(0, axis)[start:].swapaxes(0, axis)
    send_tensor(push, 7, "src", "t", array)
    got = _receive(pull).array
    assert got.dtype == array.dtype and got.shape == array.shape and np.array_equal(got, array)


# -- steady-state throughput ------------------------------------------------------------------------------------

def test_throughput_is_the_rate_of_outputs_after_the_first():
    from edgec.runtime.coordinator.window import steady_throughput

    # a two-stage pipeline: the first output after a 30 ms latency, then one every 10 ms
    done = [0.030 + 0.010 * i for i in range(20)]
    assert steady_throughput(0.0, done) == pytest.approx(100.0)  # requests / wall time would read 20 / 0.22 = 91
    # barrier mode: one at a time, each 25 ms: the rate is 1 / latency either way
    assert steady_throughput(0.0, [0.025 * (i + 1) for i in range(8)]) == pytest.approx(40.0)
    # one request, or outputs that came back at once: requests / time since the first was sent
    assert steady_throughput(1.0, [1.05]) == pytest.approx(20.0)
    assert steady_throughput(1.0, [1.05, 1.05]) == pytest.approx(40.0)
