"""`edgec profile`: measure this machine (quick mode), write the YAML, load it back.

Each quick-profile test runs twice: on scripted timings (profile_scripted.py: the profile's deciding code on
fixed numbers, in the README's test command) and measured for real (`slow`: CI runs it on an idle machine; on
a busy one a real timing is whatever the other tenants leave)."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from edgec.compiler.cluster import EFFICIENCY_KEYS, GFLOPS_KEYS, load_cluster, load_profile, validate_profile_dict
from edgec.compiler.errors import UserError
from edgec.runtime.errors import InputError
from edgec.compiler.profile import write_profile
from edgec.runtime.profile import host
from edgec.runtime.profile.measure import measure_host
from edgec.runtime.profile.nodes import measure_layers
from tests.compiler.profile_scripted import script_runtime_costs, script_timings
from tests.compiler.test_profile_stability import ScriptedProbe


@pytest.fixture(scope="module")
def measured_profile():
    """A quick profile of this machine, timed for real (the `slow` tests')."""
    lines: list[str] = []
    p = measure_host(quick=True, threads=1, progress=lines.append)
    return p, lines


@pytest.fixture(scope="module")
def scripted_profile():
    """The same quick profile on scripted timings and a quiet scripted load probe: nothing timed."""
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        script_timings(mp)
        script_runtime_costs(mp)
        p = measure_host(quick=True, threads=1, progress=lines.append, probe=ScriptedProbe(0.0))
    return p, lines


@pytest.fixture(scope="module", params=["scripted", pytest.param("measured", marks=pytest.mark.slow)])
def quick_profile(request):
    return request.getfixturevalue(f"{request.param}_profile")


def test_measure_host_quick(quick_profile):
    p, lines = quick_profile
    # gemm_weight_gbps is left out where the cold chain took no longer than its layers hot (weights cached);
    # shared_weight_gbps on a machine of one core (nothing shares it)
    assert ("shared_weight_gbps" in p) == (host.all_cores(host.cpuinfo()) > 1)
    assert set(p) - {"gemm_weight_gbps", "shared_weight_gbps"} == {
        "name", "description", "memory_mb", "usable_memory_fraction", "runtime_overhead_mb",
        "op_overhead_us", "gflops", "memory_gbps", "weight_gbps", "layout_conversions",
        "power_w", "sources", "layers", "op_ms_per_melem", "efficiency", "threads", "measurement", "runtime", "cpu_quota",
    }
    assert p["name"] and p["description"]
    assert p["memory_mb"] > 0 and 0 < p["usable_memory_fraction"] <= 1
    assert 0 < p["runtime_overhead_mb"] < p["memory_mb"]
    assert p["op_overhead_us"] > 0
    # the int8 kernels measured too: conv and gemm (depthwise_conv_int8 is left to the float figure)
    assert set(p["gflops"]) == set(GFLOPS_KEYS) | {"conv_int8", "gemm_int8"} and all(v > 0 for v in p["gflops"].values())
    assert p["memory_gbps"] > 0 and p["weight_gbps"] > 0
    assert isinstance(p["layout_conversions"], bool)
    assert any(s.startswith("weight_gbps: a batch-1 MatMul") for s in p["sources"])
    assert any(s.startswith("gemm_weight_gbps: a chain of 12 MatMuls") for s in p["sources"])
    assert p.get("gemm_weight_gbps", 1.0) > 0 and p.get("gemm_weight_gbps") == p["threads"][1].get("gemm_weight_gbps")
    assert p["power_w"] == {"idle": None, "busy": None}
    assert p["layers"] == {}
    assert p["sources"][0].startswith("edgec profile on ") and "onnxruntime" in p["sources"][0]
    assert "intra-op threads 1;" in p["sources"][0]
    assert any("GFLOP/s" in s for s in lines) and any("GB/s" in s for s in lines)


def test_measure_host_quick_runtime_costs(quick_profile):
    """The runtime's own costs, measured through its sockets and coordinator, timed like every figure."""
    p, lines = quick_profile
    rt = p["runtime"]
    assert set(rt) - {"message_cpu_ms_per_mb"} == {"message_ms", "message_ms_per_mb", "request_ms", "run_ms",
                                                         "request_cpu_ms"}
    # CPU time of every thread of the coordinator and its workers, bounded like the time figures
    assert 0 < rt["request_cpu_ms"] < 1000
    if "message_cpu_ms_per_mb" in rt:
        assert 0 < rt["message_cpu_ms_per_mb"] < 1000
    else:  # left out where noise swamped it (the time figure stands in), and said
        assert any(w.startswith("runtime message_cpu_ms_per_mb not written") for w in p["measurement"]["warnings"])
    # a hand-off through CURVE and ZeroMQ takes microseconds at least, and less than a second on any host
    assert 0.001 < rt["message_ms"] < 1000 and 0.001 < rt["request_ms"] < 1000 and rt["message_ms_per_mb"] >= 0
    timings = p["measurement"]["runtime"]
    assert set(timings) == {"message_small", "message_large", "run_in_plan", "run_alone", "request", "cpu_small",
                            "cpu_large", "cpu_request"}
    assert all(t["runs"] >= 3 and t["median_ms"] > 0 for t in timings.values())
    assert any(s.startswith("runtime: message_ms") for s in p["sources"])
    assert any("ms per request" in s for s in lines)
    loaded = validate_profile_dict(p, "quick.yaml").runtime
    assert (loaded.message_ms, loaded.message_ms_per_mb, loaded.request_ms, loaded.run_ms) == (
        rt["message_ms"], rt["message_ms_per_mb"], rt["request_ms"], rt["run_ms"])
    assert (loaded.message_cpu_ms, loaded.message_cpu_ms_per_mb, loaded.request_cpu_ms) == (
        None, rt["message_cpu_ms_per_mb"], rt["request_cpu_ms"])
    assert "message_cpu_ms" not in loaded.to_dict()  # the manifest's network.costs keep the time figures only


def test_measure_host_quick_per_thread_figures(quick_profile):
    """One `threads:` entry per count; the top level repeats the largest count's figures for old readers."""
    p, _ = quick_profile
    assert list(p["threads"]) == [1]
    t1 = p["threads"][1]
    for key in ("op_overhead_us", "gflops", "memory_gbps", "weight_gbps", "op_ms_per_melem", "efficiency"):
        assert p[key] == t1[key], key
    assert set(t1["op_ms_per_melem"]) == {"LRN", "Softmax", "LayerNormalization", "LayerNormalization:skip", "Erf",
                                           "Resize", "Resize:linear", "Clip"}
    assert all(v > 0 for v in t1["op_ms_per_melem"].values())
    # conv_positions replaced the conv curve by output elements, which old profiles still carry
    assert set(t1["efficiency"]) == set(EFFICIENCY_KEYS) - {"conv"}
    assert [p for p, _ in t1["efficiency"]["conv_positions"]] == [7, 14, 49, 56, 784]
    for curve in t1["efficiency"].values():
        elems = [e for e, _ in curve]
        assert elems == sorted(set(elems)) and len(elems) >= 5
        assert all(0 < f <= 4 for _, f in curve)


@pytest.mark.slow
def test_measured_lrn_costs_far_more_per_element_than_softmax(measured_profile):
    """LRN's size-5 window costs far more per element than a row softmax: the reason the table exists (a
    property of the machine's kernels: measured, so in the slow set)."""
    t1 = measured_profile[0]["threads"][1]
    assert t1["op_ms_per_melem"]["LRN"] > 3 * t1["op_ms_per_melem"]["Softmax"]


def test_measure_host_quick_measurement_section(quick_profile):
    p, _ = quick_profile
    m = p["measurement"]
    assert m["max_spread"] == 0.1 and m["window"] == 5
    assert m["load"]["verdict"] in ("quiet", "busy") and m["load"]["cpus"] >= 1
    assert m["load"]["before"]["other_cpus"] is not None and len(m["load"]["before"]["loadavg"]) == 3
    timings = m["threads"][1]
    assert {"gflops.conv", "gflops.gemm", "memory_gbps", "op_ms_per_melem.LRN", "efficiency.conv_positions.1x7",
            "efficiency.gemm.rows_8", "op_overhead_us.relu_chain_200"} <= set(timings)
    for name, t in timings.items():
        assert t["runs"] >= 3 and t["median_ms"] > 0 and t["spread"] >= 0, name
        assert t["spread"] <= 0.1 or not t["stable"], name
        assert t["other_cpus"] is None or t["other_cpus"] >= 0  # None: the timing took less than one jiffy
    unstable = [name for name, t in timings.items() if not t["stable"]]
    unstable += [name for name, t in m["runtime"].items() if not t["stable"]]
    assert len([w for w in m["warnings"] if "stayed above" in w or "rounds was stable" in w]) == len(unstable)


def test_written_profile_loads(quick_profile, tmp_path):
    p, _ = quick_profile
    out = tmp_path / "profiles" / "host.yaml"
    out.parent.mkdir()  # write_profile creates no folder (a typo in -o is refused before measuring)
    write_profile(p, out)
    assert sorted(os.listdir(out.parent)) == ["host.yaml"]  # no temp file left behind
    loaded = load_profile(str(out))
    assert loaded.name == p["name"]
    assert loaded.gflops == {k: float(v) for k, v in p["gflops"].items()}
    assert loaded.memory_gbps == p["memory_gbps"]
    assert loaded.power_idle_w is None and loaded.power_busy_w is None  # null = unknown
    assert loaded.sources == tuple(p["sources"])
    assert yaml.safe_load(out.read_text())["power_w"] == {"idle": None, "busy": None}
    assert "&id" not in out.read_text()  # figures shared by the top level and threads: written out, not aliased
    assert loaded.figures(1).gflops == loaded.gflops and loaded.threads[1].efficiency == loaded.efficiency
    assert loaded.op_ms_per_melem == p["op_ms_per_melem"]
    assert loaded.measurement["load"]["verdict"] == p["measurement"]["load"]["verdict"]
    # and a cluster can use it by path
    cf = tmp_path / "cluster.yaml"
    cf.write_text("devices:\n  - {name: me, profile: profiles/host.yaml}\nnetwork: {bandwidth_mbps: 100, latency_ms: 1}\n")
    assert load_cluster(cf).device("me").profile.name == p["name"]


def test_write_profile_with_power_and_overwrite(quick_profile, tmp_path):
    p, _ = quick_profile
    out = tmp_path / "host.yaml"
    out.write_text("old")
    write_profile({**p, "power_w": {"idle": 2.5, "busy": 6.0}}, out)
    loaded = load_profile(str(out))
    assert (loaded.power_idle_w, loaded.power_busy_w) == (2.5, 6.0)


def test_write_profile_rejects_invalid_and_leaves_file(quick_profile, tmp_path):
    p, _ = quick_profile
    out = tmp_path / "host.yaml"
    write_profile(p, out)
    before = out.read_text()
    bad = {**p, "gflops": {**p["gflops"], "conv": 0}}
    with pytest.raises(UserError, match=r"gflops\.conv must be positive") as ei:
        write_profile(bad, out)
    assert ei.value.path == str(out)
    assert out.read_text() == before


def test_measure_host_rejects_bad_threads():
    for bad in (0, [1, 0], [], "2", True):
        with pytest.raises(InputError, match="threads must be a positive integer"):
            measure_host(threads=bad, quick=True)


def _tiny_model(path):
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array([1, -1], dtype=np.int64), "shape"),
        numpy_helper.from_array(rng.standard_normal((16 * 32 * 32, 64)).astype(np.float32), "fc_w"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["a2"], name="add2"),
        helper.make_node("Sigmoid", ["a2"], ["s2"], name="sig2"),
        helper.make_node("Mul", ["a2", "s2"], ["m2"], name="mul2"),
        helper.make_node("Reshape", ["m2", "shape"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "fc_w"], ["y"], name="fc"),
    ]
    g = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return [n.name for n in nodes]


def test_layers_table_from_a_model(tmp_path, monkeypatch):
    """The per-node table is onnxruntime's profiler's, run for real; the micro-benchmarks beside it are scripted."""
    model = tmp_path / "tiny.onnx"
    names = _tiny_model(model)
    script_timings(monkeypatch)
    script_runtime_costs(monkeypatch)
    p = measure_host(model_path=str(model), quick=True, threads=1, probe=ScriptedProbe(0.0))
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    assert list(p["layers"]) == [digest]
    table = p["layers"][digest]
    assert set(names) <= set(table)  # every node of the model is listed (fused/folded ones at 0.0)
    assert all(v >= 0 for v in table.values())
    assert sum(table.values()) > 0
    assert table["conv1"] > 0 and table["fc"] > 0  # nodes that keep their own kernel get time
    assert any("layers:" in s and digest[:12] in s for s in p["sources"])
    out = tmp_path / "host.yaml"
    write_profile(p, out)
    assert load_profile(str(out)).layers[digest]["fc"] == table["fc"]
    assert p["threads"][1]["layers"] == {digest: table}  # per thread count; the top level has the largest's
    assert load_profile(str(out)).figures(1).layers[digest]["fc"] == table["fc"]


def test_measure_layers_unnamed_nodes_and_bad_model(tmp_path):
    model = tmp_path / "tiny.onnx"
    _tiny_model(model)
    m = onnx.load(str(model))
    for n in m.graph.node:
        n.name = ""
    onnx.save(m, str(model))
    digest, table = measure_layers(model, threads=1, runs=2)
    assert set(table) == {f"{n.op_type}_{i}" for i, n in enumerate(m.graph.node)}
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(InputError, match=f"^{bad}: not an ONNX model"):
        measure_layers(bad)
    with pytest.raises(InputError, match="cannot read model"):
        measure_layers(tmp_path / "absent.onnx")


def test_the_skip_norm_price_times_the_kernel_onnxruntime_fuses(tmp_path):
    """The op case behind "LayerNormalization:skip" (a residual Add, then a LayerNormalization) is what
    onnxruntime turns into one SkipLayerNormalization: the price is that kernel's, as in a transformer."""
    import onnxruntime as ort

    from edgec.runtime.profile.tables import _op_cases
    from edgec.runtime.profile.timing import model, vi

    nodes, shape_in, shape_out, inits = _op_cases(True)["LayerNormalization:skip"]
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(model(nodes, [vi("x", shape_in)], [vi("y", shape_out)], inits), so,
                         providers=["CPUExecutionProvider"])
    assert [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node] == ["SkipLayerNormalization"]
