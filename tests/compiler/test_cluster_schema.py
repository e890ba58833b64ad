"""The schema behind cluster.yaml and profile files: strict types, bounds, unknown keys at any depth, and the
one-line message (file, key path, what is wrong and what was expected) that any schema error becomes."""

from __future__ import annotations

import copy
import random

import pytest
import yaml
from click.testing import CliRunner

from edgec import models
from edgec.compiler.cli import cli
from edgec.compiler.cluster import EFFICIENCY_KEYS, GFLOPS_KEYS, INT8_GFLOPS_KEYS, MEDIUMS, load_cluster, validate_profile_dict
from edgec.compiler.cluster.schema import GflopsDoc
from edgec.compiler.errors import UserError
from edgec.runtime.providers import CPU, CPU_ONLY, Provider

FIGURES = {"op_overhead_us": 5, "gflops": {"conv": 70, "depthwise_conv": 20, "gemm": 60, "other": 30}, "memory_gbps": 12}
PROFILE = {
    "name": "me", "memory_mb": 4096, "usable_memory_fraction": 0.8, "runtime_overhead_mb": 90, **copy.deepcopy(FIGURES),
    "power_w": {"idle": 2.0, "busy": 6.0}, "sources": ["made up for a test"],
    "efficiency": {"conv": [[1792, 0.6], [401408, 1.0]]},
    "threads": {1: copy.deepcopy(FIGURES), 2: copy.deepcopy(FIGURES)},
    "measurement": {"load": {"verdict": "quiet", "before": {"loadavg": [0.1, 0.2, 0.3]}},
                    "threads": {1: {"gflops.conv": {"runs": 9, "median_ms": 1.5, "spread": 0.01, "stable": True}}}},
}


def _profile(path: str, value):
    """PROFILE with the value at a '/'-separated path replaced."""
    doc = copy.deepcopy(PROFILE)
    *head, last = path.split("/")
    node = doc
    for k in head:
        node = node[int(k) if k.isdigit() else k]
    node[int(last) if last.isdigit() else last] = value
    return doc


PROFILE_CASES = [
    (_profile("threads/2/memory_gbps", True), "threads.2.memory_gbps must be a number, got bool True"),
    (_profile("memory_mb", "3"), "memory_mb must be a number, got str '3'"),
    (_profile("threads/1/gflops/gemm", float("inf")), "threads.1.gflops.gemm must be finite, got inf"),
    (_profile("efficiency/conv/1/1", float("nan")), "efficiency.conv[1] fraction must be finite, got nan"),
    (_profile("threads/1/colour", 3), "unknown key 'colour' in threads.1 (allowed: op_overhead_us, gflops, memory_gbps, "
                                      "weight_gbps, gemm_weight_gbps, op_ms_per_melem, efficiency, layers)"),
    (_profile("threads/2/gflops/pool", 1), "unknown key 'pool' in threads.2.gflops (allowed: conv, depthwise_conv, gemm, other, conv_int8, depthwise_conv_int8, gemm_int8)"),
    (_profile("cores", 4), "unknown key 'cores' in profile (allowed: name, description, memory_mb, usable_memory_fraction, "
                           "runtime_overhead_mb, op_overhead_us, gflops, memory_gbps, weight_gbps, gemm_weight_gbps, shared_weight_gbps, layout_conversions, power_w, radio_nj_per_byte, mode, modes, sources, layers, "
                           "op_ms_per_melem, efficiency, threads, runtime, measurement, cpu_quota, providers, cpu, cpu_nodes)"),
    (_profile("weight_gbps", 0), "weight_gbps must be positive, got 0"),
    (_profile("threads/1/weight_gbps", -2), "threads.1.weight_gbps must be positive, got -2"),
    (_profile("efficiency/lstm", [[1, 1.0]]), "unknown key 'lstm' in efficiency (allowed: conv, conv_positions, depthwise_conv, gemm)"),
    (_profile("efficiency/conv/0", {"output_size": 1, "fraction": 1}),
     "efficiency.conv[0] must be an [output size, fraction] pair, got dict {'fraction': 1, 'output_size': 1}"),
    (_profile("efficiency/conv/0", [1, 0.5, 7]), "efficiency.conv[0] must be an [output size, fraction] pair, got list [1, 0.5, 7]"),
    (_profile("efficiency/conv", [[7168, 0.9], [1792, 0.6]]),
     "efficiency.conv: output sizes must increase from point to point, got 1792 after 7168"),
    (_profile("op_ms_per_melem", {"Softmax": 1e13}), "op_ms_per_melem['Softmax'] must be at most 1e+12, got 10000000000000.0"),
    (_profile("layers", {"ab": {"conv1": "x"}}), "layers['ab']['conv1'] must be a number, got str 'x'"),
    (_profile("threads", {1: FIGURES, 4097: FIGURES}), "threads: keys must be thread counts, integers 1 to 4096, got int 4097"),
    (_profile("layers", {7: {}}), "layers: keys must be strings, got int 7"),
    (_profile("sources", ["a", " "]), "sources[1] must be a non-empty string, got str ' '"),
    (_profile("power_w/idle", -1), "power_w.idle must be positive, got -1"),
    (_profile("power_w/busy", 1e-10), "power_w.busy must be at least 1e-09, got 1e-10"),
    (_profile("measurement/window", 2.0), "measurement.window must be a positive integer, got float 2.0"),
    (_profile("measurement/load/cpus", None), "measurement.load.cpus must be a number, got null"),
    (_profile("measurement/load/before/loadavg/2", -0.5), "measurement.load.before.loadavg[2] must not be negative, got -0.5"),
    (_profile("measurement/threads/1/gflops.conv/spread", "low"),
     "measurement.threads.1['gflops.conv'].spread must be a number, got str 'low'"),
    (_profile("runtime", {"message_ms": -0.1}), "runtime.message_ms must be a number of milliseconds from 0 to 10000, got float -0.1"),
    (_profile("runtime", {"request_ms": 1e5}), "runtime.request_ms must be a number of milliseconds from 0 to 10000, got float 100000.0"),
    (_profile("runtime", {"message_ms_per_mb": float("nan")}), "runtime.message_ms_per_mb must be a number of milliseconds from 0 to 10000, got float nan"),
    (_profile("runtime", {"message_ms": "0.3"}), "runtime.message_ms must be a number of milliseconds from 0 to 10000, got str '0.3'"),
    (_profile("runtime", {"hop_ms": 1}), "unknown key 'hop_ms' in runtime (allowed: message_ms, message_ms_per_mb, "
                                         "request_ms, run_ms, message_cpu_ms, message_cpu_ms_per_mb, request_cpu_ms)"),
    (_profile("runtime", {"request_cpu_ms": -1}), "runtime.request_cpu_ms must be a number of milliseconds from 0 to 10000, got int -1"),
    (_profile("name", 5), "name must be a non-empty string, got int 5"),
    (_profile("gflops", None), "gflops must be a mapping, got null"),
]


@pytest.mark.parametrize("doc, message", PROFILE_CASES, ids=[m[:50] for _, m in PROFILE_CASES])
def test_profile_schema_error_is_one_exact_line(doc, message):
    with pytest.raises(UserError) as ei:
        validate_profile_dict(doc, "board.yaml")
    assert str(ei.value) == f"board.yaml: {message}"
    assert ei.value.path == "board.yaml"


def test_the_good_profile_is_accepted_and_typed():
    p = validate_profile_dict(copy.deepcopy(PROFILE), "board.yaml")
    assert p.memory_mb == 4096 and isinstance(p.memory_mb, float)  # ints in the file are floats in the model
    assert p.efficiency == {"conv": ((1792.0, 0.6), (401408.0, 1.0))} and type(p.efficiency["conv"][0]) is tuple
    assert list(p.threads) == [1, 2] and p.threads[2].gflops["conv"] == 70.0
    assert p.measurement is not None and p.measurement["load"]["verdict"] == "quiet"


def _cluster(tmp_path, text: str):
    f = tmp_path / "cluster.yaml"
    f.write_text(text)
    return f


TWO = "devices:\n  - {name: a, profile: rpi4}\n  - {name: b, profile: rpi5%s}\nnetwork: {bandwidth_mbps: 100, latency_ms: 1%s}\n"
CLUSTER_CASES = [
    (TWO % (", memory_mb: true", ""), "device 'b': memory_mb must be a number, got bool True"),
    (TWO % (", memory_mb: '3'", ""), "device 'b': memory_mb must be a number, got str '3'"),
    (TWO % (", threads: 1.5", ""), "device 'b': threads must be an integer from 1 to 4096 (the worker's intra-op "
                                   "threads), got float 1.5"),
    ("devices: [{name: a, profile: rpi4}]\nnetwork: {bandwidth_mbps: 1, latency_ms: .inf}\n",
     "network.latency_ms must be finite, got inf"),
    ("devices: [{name: a, profile: rpi4}]\nnetwork: {bandwidth_mbps: .nan, latency_ms: 1}\n",
     "network.bandwidth_mbps must be finite, got nan"),
    (TWO % ("", ", links: [{a: a, b: b, latency_ms: [1]}]"), "network.links[0].latency_ms must be a number, got list [1]"),
    (TWO % ("", ", links: !!set {a, b}"), "network.links must be a list, got set"),
    (TWO % (", colour: red", ""), "unknown key 'colour' in devices[1] (allowed: name, profile, memory_mb, address, threads, host, providers)"),
    # a misspelt key is reported as unknown, with the allowed keys, rather than as the key it replaces missing
    ("devices:\n  - {nmae: a, profile: rpi4}\n",
     "unknown key 'nmae' in devices[0] (allowed: name, profile, memory_mb, address, threads, host, providers)"),
    ("devices:\n  - {name: a}\n", "missing required key 'profile' in devices[0]"),
    (TWO % (", providers: []", ""), "device 'b': providers must be a non-empty list of execution providers, got list []"),
    (TWO % (", providers: CUDAExecutionProvider", ""),
     "device 'b': providers must be a non-empty list of execution providers, got str 'CUDAExecutionProvider'"),
    (TWO % (", providers: [CUDA]", ""), "device 'b': providers[0]: keys must be an onnxruntime execution provider "
                                       "name (e.g. CUDAExecutionProvider), got str 'CUDA'"),
    (TWO % (", providers: [{OpenVINOExecutionProvider: {device_type: CPU}, CPUExecutionProvider: {}}]", ""),
     "device 'b': providers[0] must be a provider name, or {provider name: {option: value}}, got dict "
     "{'CPUExecutionProvider': {}, 'OpenVINOExecutionProvider': {'device_type': 'CPU'}}"),
    (TWO % (", providers: [{OpenVINOExecutionProvider: {enable_qdq_optimizer: true}}]", ""),
     "device 'b': providers[0]['OpenVINOExecutionProvider']['enable_qdq_optimizer']: is a boolean: write it as the "
     "provider spells it, as a string (e.g. 'true' or '1')"),
    (TWO % (", providers: [CPUExecutionProvider, {CPUExecutionProvider: {}}]", ""),
     "device 'b': providers lists CPUExecutionProvider twice"),
    ("devices:\n  - {name: a, profile: rpi4, address: \"\\udc00\"}\n",
     "device 'a': address must be valid Unicode text, got '\\udc00'"),
    ("devices:\n  - {name: a, profile: rpi4}\n2: x\n", "cluster file: keys must be strings, got int 2"),
    # $ would match before the final newline; a device name ends up in file names
    ("devices:\n  - {name: \"a\\n\", profile: rpi4}\n",
     "devices[0].name must be 1-64 characters from [A-Za-z0-9._-] starting with a letter or digit, got str 'a\\n'"),
]


@pytest.mark.parametrize("text, message", CLUSTER_CASES, ids=[m[:50] for _, m in CLUSTER_CASES])
def test_cluster_schema_error_is_one_exact_line(tmp_path, text, message):
    f = _cluster(tmp_path, text)
    with pytest.raises(UserError) as ei:
        load_cluster(f)
    assert str(ei.value) == f"{f}: {message}"


def test_schema_error_through_compile_is_one_line_exit_2(tmp_path):
    f = _cluster(tmp_path, TWO % (", memory_mb: true", ""))
    res = CliRunner().invoke(cli, ["compile", str(models.ensure("tinychain")), "--devices", str(f), "-o",
                                   str(tmp_path / "out")], prog_name="edgec")
    assert res.exit_code == 2, res.output
    assert res.stderr == f"edgec: {f}: device 'b': memory_mb must be a number, got bool True\n"
    assert not (tmp_path / "out").exists()


ODD = [None, True, 0, -1, 1e-300, 1e300, 10**400, float("nan"), "3", "1e3", "", " ", [], [1, 2, 3], {}, {"k": 1},
       {1: 2}, "\ud83d", 4097, 2.5]


def _mutate(tree, rng: random.Random) -> None:
    containers, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (dict, list)):
            containers.append(node)
            stack.extend(node.values() if isinstance(node, dict) else node)
    node = rng.choice(containers)
    keys = list(node) if isinstance(node, dict) else list(range(len(node)))
    if isinstance(node, dict) and (not keys or rng.random() < 0.2):
        node[rng.choice(["extra", 7, "conv", "LRN"])] = rng.choice(ODD)
    elif keys and rng.random() < 0.2:
        del node[rng.choice(keys)]
    elif keys:
        node[rng.choice(keys)] = copy.deepcopy(rng.choice(ODD))


@pytest.mark.parametrize("seed", range(300))
def test_every_schema_error_reads_as_one_plain_line(seed):
    """Whatever pydantic reports, the message is ours: one line, the file, no pydantic wording or URL."""
    rng = random.Random(seed)
    doc = copy.deepcopy(PROFILE)
    for _ in range(rng.randrange(1, 3)):
        _mutate(doc, rng)
    try:
        validate_profile_dict(yaml.safe_load(yaml.safe_dump(doc)) if rng.random() < 0.5 else doc, "board.yaml")
    except UserError as e:
        text = str(e)
        assert text.startswith("board.yaml: ") and "\n" not in text and len(text) < 500, text
        for pydantic_words in ("Input should", "pydantic", "http", "For further information", "[type="):
            assert pydantic_words not in text, text


def test_providers_parse_in_order_with_options_as_strings(tmp_path):
    f = _cluster(tmp_path, TWO % (", providers: [{OpenVINOExecutionProvider: {device_type: CPU, num_of_threads: 2}},"
                                  " CPUExecutionProvider]", ""))
    c = load_cluster(f)
    assert c.device("a").providers == CPU_ONLY
    assert c.device("b").providers == (Provider("OpenVINOExecutionProvider", (("device_type", "CPU"),
                                                                               ("num_of_threads", "2"))), Provider(CPU))
    devices = c.to_dict()["devices"]
    assert "providers" not in devices[0]
    assert devices[1]["providers"] == [{"name": "OpenVINOExecutionProvider",
                                        "options": {"device_type": "CPU", "num_of_threads": "2"}},
                                       {"name": CPU}]
    assert c.device("a").traits != c.device("b").traits  # not interchangeable for the planners


def test_schema_names_the_keys_the_compiler_reads(tmp_path):
    assert tuple(GflopsDoc.model_fields) == GFLOPS_KEYS + INT8_GFLOPS_KEYS
    doc = validate_profile_dict(_profile("efficiency", {k: [[1, 1.0]] for k in EFFICIENCY_KEYS}), "board.yaml")
    assert tuple(doc.efficiency) == EFFICIENCY_KEYS
    for medium in MEDIUMS:
        f = _cluster(tmp_path, f"devices: [{{name: a, profile: rpi4}}]\n"
                               f"network: {{bandwidth_mbps: 1, latency_ms: 0, medium: {medium}}}\n")
        assert load_cluster(f).medium == medium


def test_a_device_whose_providers_its_profile_was_not_measured_with_is_priced_at_the_profile_and_said(tmp_path,
                                                                                                       caplog):
    """The pricing rule (cluster.provider_note): the profile's figures price every node, and compile says so."""
    f = _cluster(tmp_path, "devices:\n  - {name: ov, profile: rpi5, providers: [OpenVINOExecutionProvider]}\n"
                           "  - {name: j, profile: jetson-orin-nano-cuda}\n"
                           "  - {name: g, profile: jetson-orin-nano-cuda, providers: [CUDAExecutionProvider]}\n"
                           "  - {name: c, profile: rpi5}\n"
                           "network: {bandwidth_mbps: 100, latency_ms: 1}\n")
    with caplog.at_level("WARNING", logger="edgec.compiler.cluster.cluster"):
        c = load_cluster(f)
    assert c.device("j").profile.providers == ("CUDAExecutionProvider", CPU)
    assert c.device("c").profile.providers == (CPU,)
    assert c.device("ov").provider_note == ("device 'ov' runs OpenVINOExecutionProvider, but profile rpi5 was measured "
                                            "with CPUExecutionProvider: the plan prices its every node at the "
                                            "profile's figures")
    assert c.device("j").provider_note.startswith("device 'j': profile jetson-orin-nano-cuda's figures are for "
                                                  "CUDAExecutionProvider, which the device does not list")
    assert c.device("g").provider_note is None and c.device("c").provider_note is None
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"{f}: {c.device('ov').provider_note}", f"{f}: {c.device('j').provider_note}"]


def test_a_profile_names_its_providers_by_the_schema():
    doc = _profile("providers", ["CUDA"])
    with pytest.raises(UserError, match="providers\\[0\\] must be an onnxruntime execution provider name"):
        validate_profile_dict(doc, "board.yaml")
    assert validate_profile_dict(_profile("providers", ["OpenVINOExecutionProvider"]), "b.yaml").providers == \
        ("OpenVINOExecutionProvider",)
