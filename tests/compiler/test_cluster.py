"""cluster.yaml + device profiles -> ClusterModel: shipped profiles, valid clusters, every bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from edgec.compiler import cluster as cl
from edgec.compiler.cluster import (
    GFLOPS_KEYS,
    ClusterModel,
    LinkSpec,
    available_profiles,
    load_cluster,
    load_profile,
)
from edgec.compiler.errors import UserError

REQUIRED_PROFILES = ["rpi4", "rpi5", "jetson-nano", "jetson-orin-nano", "phone", "laptop", "edge-server"]


# --------------------------------------------------------------------------------------------------
# Shipped profiles


def test_required_profiles_ship():
    assert set(REQUIRED_PROFILES) <= set(available_profiles())


@pytest.mark.parametrize("name", sorted(set(REQUIRED_PROFILES) | set(available_profiles())))
def test_shipped_profile_loads(name):
    p = load_profile(name)
    assert p.name == name
    assert Path(p.path).name == f"{name}.yaml"
    assert p.description
    assert p.memory_mb > 0 and 0 < p.usable_memory_fraction <= 1
    assert 0 <= p.runtime_overhead_mb < p.memory_mb * p.usable_memory_fraction
    assert set(p.gflops) == set(GFLOPS_KEYS) and all(v > 0 for v in p.gflops.values())
    assert p.memory_gbps > 0 and p.op_overhead_us > 0
    # shipped profiles carry numbers for power and say where every figure comes from
    assert p.power_idle_w is not None and p.power_busy_w is not None and 0 < p.power_idle_w <= p.power_busy_w
    assert len(p.sources) >= 3
    text = " ".join(p.sources)
    for figure in ("conv", "depthwise_conv", "gemm", "other", "memory_gbps", "op_overhead_us", "power_w"):
        assert figure in text, f"{name}: sources do not say where {figure} comes from"
    assert p.layers == {}


def test_jetson_profiles_say_cpu_or_gpu():
    for name in ("jetson-nano", "jetson-orin-nano"):
        p = load_profile(name)
        assert "CPU EP" in p.description
        assert any("CPU, not GPU" in s for s in p.sources)


def test_profile_is_hashable_and_frozen():
    p = load_profile("rpi5")
    hash(p)
    with pytest.raises(AttributeError):
        p.memory_mb = 1  # type: ignore[misc]


def test_profile_by_path_and_env_override(tmp_path, monkeypatch):
    src = Path(load_profile("rpi4").path)
    (tmp_path / "custom.yaml").write_text(src.read_text().replace("name: rpi4", "name: custom"))
    p = load_profile("custom.yaml", base_dir=tmp_path)
    assert p.name == "custom"
    assert load_profile(str(tmp_path / "custom.yaml")).name == "custom"
    monkeypatch.setenv("EDGEC_PROFILES", str(tmp_path))
    assert available_profiles() == ["custom"]
    assert load_profile("custom").name == "custom"
    with pytest.raises(UserError, match=r"unknown profile 'rpi4' \(available: custom\)"):
        load_profile("rpi4")


def test_null_power_is_unknown(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(_profile_yaml(power_w={"idle": None, "busy": None}))
    p = load_profile(str(f))
    assert p.power_idle_w is None and p.power_busy_w is None
    f.write_text(_profile_yaml(drop="power_w"))
    p = load_profile(str(f))
    assert p.power_idle_w is None and p.power_busy_w is None


# --------------------------------------------------------------------------------------------------
# Valid clusters


def _write(tmp_path: Path, data, name="cluster.yaml") -> Path:
    f = tmp_path / name
    f.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return f


def _profile_dict(**over):
    d = {
        "name": "tiny",
        "description": "test board",
        "memory_mb": 1024,
        "usable_memory_fraction": 0.5,
        "runtime_overhead_mb": 100,
        "op_overhead_us": 10,
        "gflops": {"conv": 10.0, "depthwise_conv": 2.0, "gemm": 8.0, "other": 1.0},
        "memory_gbps": 4.0,
        "power_w": {"idle": 1.0, "busy": 3.0},
        "sources": ["made up for a test"],
        "layers": {},
    }
    drop = over.pop("drop", None)
    d.update(over)
    if drop:
        d.pop(drop)
    return d


def _profile_yaml(**over) -> str:
    return yaml.safe_dump(_profile_dict(**over), sort_keys=False)


VALID = """\
devices:
  - name: pi5-a
    profile: rpi5
    memory_mb: 4096
    address: tcp://192.168.1.20:7000
  - name: pi4-a
    profile: rpi4
    address: local
  - name: orin
    profile: jetson-orin-nano
    address: tcp://192.168.1.22:7000
network:
  bandwidth_mbps: 100
  latency_ms: 1
  medium: switched
  links:
    - {a: pi5-a, b: pi4-a, bandwidth_mbps: 10, latency_ms: 5}
    - {a: orin, b: pi5-a, latency_ms: 0.5}
"""


def test_valid_cluster_defaults_and_overrides(tmp_path):
    c = load_cluster(_write(tmp_path, VALID))
    assert isinstance(c, ClusterModel)
    assert c.path == str(tmp_path / "cluster.yaml")
    assert [d.name for d in c.devices] == ["pi5-a", "pi4-a", "orin"]
    pi5, pi4 = c.device("pi5-a"), c.device("pi4-a")
    assert pi5.profile.name == "rpi5" and pi5.memory_mb == 4096 and pi5.address == "tcp://192.168.1.20:7000"
    assert pi4.memory_mb == pi4.profile.memory_mb == 4096 and pi4.address is None
    prof = pi5.profile
    assert pi5.usable_bytes == int(4096 * prof.usable_memory_fraction * 2**20) - int(prof.runtime_overhead_mb * 2**20)
    assert pi5.usable_bytes > 0
    assert c.bandwidth_mbps == 100 and c.latency_ms == 1 and c.medium == "switched"
    assert c.link("pi5-a", "pi4-a") == LinkSpec(10, 5)
    assert c.link("orin", "pi5-a") == LinkSpec(100, 0.5)  # missing bandwidth falls back to the default
    assert c.link("orin", "pi4-a") == LinkSpec(100, 1)  # no override: default
    assert set(c.links) == {frozenset({"pi5-a", "pi4-a"}), frozenset({"orin", "pi5-a"})}
    assert c.link("pi4-a", "pi4-a").latency_ms == 0 and math.isinf(c.link("pi4-a", "pi4-a").bandwidth_mbps)


def test_link_is_symmetric(tmp_path):
    c = load_cluster(_write(tmp_path, VALID))
    names = [d.name for d in c.devices]
    for a in names:
        for b in names:
            assert c.link(a, b) == c.link(b, a)
    with pytest.raises(KeyError):
        c.link("pi5-a", "nope")
    with pytest.raises(KeyError):
        c.device("nope")


def test_minimal_cluster_and_defaults(tmp_path):
    c = load_cluster(_write(tmp_path, {"devices": [{"name": "a", "profile": "rpi4"}], "network": {"bandwidth_mbps": 1000, "latency_ms": 0}}))
    assert c.medium == "switched" and c.links == {}
    assert c.device("a").profile.name == "rpi4"


def test_profile_path_relative_to_cluster_file(tmp_path):
    (tmp_path / "boards").mkdir()
    (tmp_path / "boards" / "tiny.yaml").write_text(_profile_yaml())
    sub = tmp_path / "conf"
    sub.mkdir()
    f = _write(
        sub,
        {
            "devices": [{"name": "t", "profile": "../boards/tiny.yaml"}, {"name": "u", "profile": "../boards/tiny.yaml", "memory_mb": 2048}],
            "network": {"bandwidth_mbps": 10, "latency_ms": 2, "medium": "shared"},
        },
    )
    c = load_cluster(f)
    assert c.device("t").profile.name == "tiny" and c.device("t").profile is c.device("u").profile
    assert c.device("u").memory_mb == 2048 and c.medium == "shared"


def test_to_dict_is_json_and_deterministic(tmp_path):
    c = load_cluster(_write(tmp_path, VALID))
    d = c.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["devices"][0] == {"name": "pi5-a", "profile": "rpi5", "memory_mb": 4096, "address": "tcp://192.168.1.20:7000",
                               "mode": "2400MHz", "power_w": {"idle": 3.1, "busy": 7.2},
                               "radio_nj_per_byte": {"tx": 4.0, "rx": 4.0}}
    assert d["devices"][1]["address"] is None
    assert d["network"] == {
        "bandwidth_mbps": 100,
        "latency_ms": 1,
        "medium": "switched",
        "links": [
            {"a": "orin", "b": "pi5-a", "bandwidth_mbps": 100, "latency_ms": 0.5},
            {"a": "pi4-a", "b": "pi5-a", "bandwidth_mbps": 10, "latency_ms": 5},
        ],
    }
    assert json.dumps(load_cluster(_write(tmp_path, VALID, "again.yaml")).to_dict(), sort_keys=True) == json.dumps(d, sort_keys=True)


# --------------------------------------------------------------------------------------------------
# Bad cluster files: each raises UserError naming the file


DEV = [{"name": "a", "profile": "rpi4"}, {"name": "b", "profile": "rpi5"}]
NET = {"bandwidth_mbps": 100, "latency_ms": 1}


def _c(devices=DEV, network=NET, **extra):
    d = {"devices": devices, "network": network}
    d.update(extra)
    return d


BAD_CLUSTERS = [
    ("yaml syntax", "devices: [\n  - {name: a\n", r"YAML syntax error: line \d+"),
    ("empty file", "", r"empty"),
    ("not a mapping", "- a\n- b\n", r"must be a mapping, got list"),
    ("unknown top key", _c(extra=1), r"unknown key 'extra' in cluster file \(allowed: devices, network, hosts\)"),
    ("missing devices", {"network": NET}, r"missing required key 'devices'"),
    ("missing network", {"devices": DEV}, r"missing required key 'network'"),
    ("no devices", _c(devices=[]), r"no devices"),
    ("null devices", _c(devices=None), r"no devices"),
    ("devices not a list", _c(devices={"a": 1}), r"devices must be a list"),
    ("device not a mapping", _c(devices=["a"]), r"devices\[0\] must be a mapping"),
    ("unknown device key", _c(devices=[{"name": "a", "profile": "rpi4", "cpu": 4}]), r"unknown key 'cpu' in devices\[0\] \(allowed: name, profile, memory_mb, address, threads, host, providers\)"),
    ("missing device name", _c(devices=[{"profile": "rpi4"}]), r"missing required key 'name' in devices\[0\]"),
    ("missing profile", _c(devices=[{"name": "a"}]), r"missing required key 'profile'"),
    ("name wrong type", _c(devices=[{"name": 5, "profile": "rpi4"}]), r"devices\[0\]\.name must be"),
    ("name with slash", _c(devices=[{"name": "a/b", "profile": "rpi4"}]), r"devices\[0\]\.name must be"),
    ("duplicate device", _c(devices=[{"name": "a", "profile": "rpi4"}, {"name": "a", "profile": "rpi5"}]), r"duplicate device name 'a'"),
    ("unknown profile", _c(devices=[{"name": "a", "profile": "rpi9"}]), r"unknown profile 'rpi9' \(available: .*rpi4.*rpi5"),
    ("profile wrong type", _c(devices=[{"name": "a", "profile": 3}]), r"profile must be a profile name or a path"),
    ("missing profile file", _c(devices=[{"name": "a", "profile": "nope.yaml"}]), r"profile file .*nope\.yaml.* not found"),
    ("memory zero", _c(devices=[{"name": "a", "profile": "rpi4", "memory_mb": 0}]), r"memory_mb must be positive"),
    ("memory negative", _c(devices=[{"name": "a", "profile": "rpi4", "memory_mb": -5}]), r"memory_mb must be positive"),
    ("memory string", _c(devices=[{"name": "a", "profile": "rpi4", "memory_mb": "4GB"}]), r"memory_mb must be a number, got str"),
    ("memory bool", _c(devices=[{"name": "a", "profile": "rpi4", "memory_mb": True}]), r"memory_mb must be a number, got bool"),
    ("memory too small for runtime", _c(devices=[{"name": "a", "profile": "rpi4", "memory_mb": 100}]), r"no usable memory"),
    ("address wrong type", _c(devices=[{"name": "a", "profile": "rpi4", "address": 7000}]), r"address must be a non-empty string"),
    ("network not a mapping", _c(network=[1]), r"network must be a mapping"),
    ("unknown network key", _c(network={**NET, "mtu": 1500}), r"unknown key 'mtu' in network \(allowed: bandwidth_mbps, latency_ms, medium, links\)"),
    ("missing bandwidth", _c(network={"latency_ms": 1}), r"missing required key 'bandwidth_mbps' in network"),
    ("missing latency", _c(network={"bandwidth_mbps": 1}), r"missing required key 'latency_ms' in network"),
    ("zero bandwidth", _c(network={**NET, "bandwidth_mbps": 0}), r"network\.bandwidth_mbps must be positive"),
    ("negative bandwidth", _c(network={**NET, "bandwidth_mbps": -1}), r"network\.bandwidth_mbps must be positive"),
    ("bandwidth string", _c(network={**NET, "bandwidth_mbps": "fast"}), r"must be a number, got str"),
    ("infinite bandwidth", _c(network={**NET, "bandwidth_mbps": float("inf")}), r"must be finite"),
    ("negative latency", _c(network={**NET, "latency_ms": -0.1}), r"network\.latency_ms must not be negative"),
    ("unknown medium", _c(network={**NET, "medium": "wifi"}), r"network\.medium must be one of switched, shared, got 'wifi'"),
    ("links not a list", _c(network={**NET, "links": {"a": "b"}}), r"network\.links must be a list"),
    ("link unknown key", _c(network={**NET, "links": [{"a": "a", "b": "b", "mtu": 1}]}), r"unknown key 'mtu' in network\.links\[0\]"),
    ("link missing end", _c(network={**NET, "links": [{"a": "a", "bandwidth_mbps": 1}]}), r"missing required key 'b' in network\.links\[0\]"),
    ("link unknown device", _c(network={**NET, "links": [{"a": "a", "b": "zz", "bandwidth_mbps": 1}]}), r"names unknown device 'zz'"),
    ("link self", _c(network={**NET, "links": [{"a": "a", "b": "a", "bandwidth_mbps": 1}]}), r"links device 'a' with itself"),
    (
        "duplicate link",
        _c(network={**NET, "links": [{"a": "a", "b": "b", "bandwidth_mbps": 1}, {"a": "b", "b": "a", "latency_ms": 2}]}),
        r"network\.links\[1\]: duplicate link between 'b' and 'a'",
    ),
    ("link zero bandwidth", _c(network={**NET, "links": [{"a": "a", "b": "b", "bandwidth_mbps": 0}]}), r"network\.links\[0\]\.bandwidth_mbps must be positive"),
    ("link negative latency", _c(network={**NET, "links": [{"a": "a", "b": "b", "latency_ms": -1}]}), r"network\.links\[0\]\.latency_ms must not be negative"),
]


@pytest.mark.parametrize("data,pattern", [pytest.param(d, p, id=i) for i, d, p in BAD_CLUSTERS])
def test_bad_cluster_raises_user_error_naming_the_file(tmp_path, data, pattern):
    f = _write(tmp_path, data)
    with pytest.raises(UserError, match=pattern) as ei:
        load_cluster(f)
    assert ei.value.path == str(f)
    assert str(ei.value).startswith(str(f) + ": ")
    assert "\n" not in str(ei.value)


def test_missing_and_unreadable_cluster_file(tmp_path):
    with pytest.raises(UserError, match="cluster file not found") as ei:
        load_cluster(tmp_path / "nope.yaml")
    assert ei.value.path == str(tmp_path / "nope.yaml")
    with pytest.raises(UserError, match="is a directory") as ei:
        load_cluster(tmp_path)
    assert ei.value.path == str(tmp_path)
    f = tmp_path / "bin.yaml"
    f.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(UserError, match="cannot read") as ei:
        load_cluster(f)
    assert ei.value.path == str(f)


def test_yaml_error_reports_line(tmp_path):
    f = _write(tmp_path, "devices:\n  - name: a\n    profile: rpi4\nnetwork: {bandwidth_mbps: 1, latency_ms: [}\n")
    with pytest.raises(UserError, match=r"line 4") as ei:
        load_cluster(f)
    assert ei.value.path == str(f)


# --------------------------------------------------------------------------------------------------
# Bad profile files: each raises UserError naming the profile file


BAD_PROFILES = [
    ("unknown key", _profile_dict(cores=4), r"unknown key 'cores' in profile \(allowed: name, description, memory_mb"),
    ("missing name", _profile_dict(drop="name"), r"missing required key 'name' in profile"),
    ("missing gflops", _profile_dict(drop="gflops"), r"missing required key 'gflops'"),
    ("missing memory_gbps", _profile_dict(drop="memory_gbps"), r"missing required key 'memory_gbps'"),
    ("zero memory", _profile_dict(memory_mb=0), r"memory_mb must be positive"),
    ("fraction zero", _profile_dict(usable_memory_fraction=0), r"usable_memory_fraction must be a number in \(0, 1\], got (int 0|float 1\.5)"),
    ("fraction above one", _profile_dict(usable_memory_fraction=1.5), r"usable_memory_fraction must be a number in \(0, 1\], got (int 0|float 1\.5)"),
    ("negative runtime", _profile_dict(runtime_overhead_mb=-1), r"runtime_overhead_mb must not be negative"),
    ("runtime too big", _profile_dict(runtime_overhead_mb=600), r"runtime_overhead_mb \(600\) leaves no usable memory"),
    ("negative op overhead", _profile_dict(op_overhead_us=-3), r"op_overhead_us must not be negative"),
    ("gflops unknown key", _profile_dict(gflops={"conv": 1, "depthwise_conv": 1, "gemm": 1, "other": 1, "pool": 1}), r"unknown key 'pool' in gflops \(allowed: conv, depthwise_conv, gemm, other, conv_int8, depthwise_conv_int8, gemm_int8\)"),
    ("gflops missing key", _profile_dict(gflops={"conv": 1, "depthwise_conv": 1, "gemm": 1}), r"missing required key 'other' in gflops"),
    ("gflops zero", _profile_dict(gflops={"conv": 0, "depthwise_conv": 1, "gemm": 1, "other": 1}), r"gflops\.conv must be positive"),
    ("gflops not mapping", _profile_dict(gflops=[1, 2]), r"gflops must be a mapping"),
    ("gflops string", _profile_dict(gflops={"conv": "1e3", "depthwise_conv": 1, "gemm": 1, "other": 1}), r"gflops\.conv must be a number.*write floats with a dot"),
    ("memory_gbps negative", _profile_dict(memory_gbps=-1), r"memory_gbps must be positive"),
    ("power unknown key", _profile_dict(power_w={"idle": 1, "peak": 2}), r"unknown key 'peak' in power_w \(allowed: idle, busy\)"),
    ("power zero", _profile_dict(power_w={"idle": 0, "busy": 2}), r"power_w\.idle must be positive"),
    ("power busy below idle", _profile_dict(power_w={"idle": 5, "busy": 2}), r"power_w\.busy \(2\) is below power_w\.idle \(5\)"),
    ("sources not list", _profile_dict(sources="a datasheet"), r"sources must be a list of non-empty strings"),
    ("name empty", _profile_dict(name=""), r"name must be a non-empty string"),
    ("layers bad value", _profile_dict(layers={"abc": {"conv1": "fast"}}), r"layers\['abc'\]\['conv1'\] must be a number"),
    ("layers negative", _profile_dict(layers={"abc": {"conv1": -1.0}}), r"must not be negative"),
    ("not a mapping", ["rpi"], r"a profile must be a mapping, got list"),
]


@pytest.mark.parametrize("data,pattern", [pytest.param(d, p, id=i) for i, d, p in BAD_PROFILES])
def test_bad_profile_raises_user_error_naming_the_profile(tmp_path, data, pattern):
    prof = _write(tmp_path, data, "board.yaml")
    with pytest.raises(UserError, match=pattern) as ei:
        load_profile(str(prof))
    assert ei.value.path == str(prof)
    # the same problem found through a cluster file still names the profile file
    cf = _write(tmp_path, {"devices": [{"name": "a", "profile": "board.yaml"}], "network": NET})
    with pytest.raises(UserError, match=pattern) as ei:
        load_cluster(cf)
    assert ei.value.path == str(prof)


def test_profile_yaml_syntax_error_and_missing(tmp_path):
    prof = _write(tmp_path, "name: x\ngflops: {conv: 1\n", "board.yaml")
    with pytest.raises(UserError, match=r"YAML syntax error: line \d+") as ei:
        load_profile(str(prof))
    assert ei.value.path == str(prof)
    with pytest.raises(UserError, match="profile file not found"):
        load_profile(str(tmp_path / "absent.yaml"))
    with pytest.raises(UserError, match=r"unknown profile 'absent' \(available: "):
        load_profile("absent")


def test_layers_table_loads(tmp_path):
    prof = _write(tmp_path, _profile_dict(layers={"ab" * 32: {"conv1": 1.5, "relu1": 0.0}}), "board.yaml")
    p = load_profile(str(prof))
    assert p.layers == {"ab" * 32: {"conv1": 1.5, "relu1": 0.0}}


def test_profiles_dir_default():
    assert cl.PROFILES_DIR == Path(cl.__file__).resolve().parents[2] / "profiles" or "EDGEC_PROFILES" in __import__("os").environ


def test_duplicate_yaml_key_is_an_error(tmp_path):
    f = _write(tmp_path, "devices:\n  - {name: a, profile: rpi4}\nnetwork: {bandwidth_mbps: 1, latency_ms: 1}\nnetwork: {bandwidth_mbps: 2, latency_ms: 1}\n")
    with pytest.raises(UserError, match=r"YAML syntax error: line 4, column 1: duplicate key 'network'") as ei:
        load_cluster(f)
    assert ei.value.path == str(f)


# --------------------------------------------------------------------------------------------------
# One device needs no network; hostile files end in one UserError, never a Python exception


def test_one_device_cluster_needs_no_network(tmp_path):
    c = load_cluster(_write(tmp_path, {"devices": [{"name": "a", "profile": "rpi4"}]}))
    assert c.device_names == ("a",) and not c.has_network and c.links == {}
    assert c.link("a", "a").latency_ms == 0.0
    d = json.loads(json.dumps(c.to_dict(), allow_nan=False))  # strict JSON: no Infinity in the manifest
    assert d["network"] == {"bandwidth_mbps": None, "latency_ms": None, "medium": "switched", "links": []}
    with_net = load_cluster(_write(tmp_path, {"devices": [{"name": "a", "profile": "rpi4"}], "network": NET}))
    assert with_net.has_network and with_net.to_dict()["network"]["bandwidth_mbps"] == 100


def test_two_devices_still_need_a_network(tmp_path):
    with pytest.raises(UserError, match=r"missing required key 'network' in cluster file \(2 devices need one\)"):
        load_cluster(_write(tmp_path, {"devices": DEV}))


@pytest.mark.parametrize("text", ["[" * 20000 + "]" * 20000, "devices:\n" + "  " * 1 + "- " * 2000 + "x\n",
                                  "devices: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n"],
                         ids=["flow list", "block list", "flow mapping"])
def test_deep_nesting_is_a_user_error(tmp_path, text):
    f = _write(tmp_path, text)
    with pytest.raises(UserError, match=r"YAML nested more than 32 levels deep \(line \d+, column \d+\)") as ei:
        load_cluster(f)
    assert ei.value.path == str(f)


def test_deep_profile_is_a_user_error_naming_the_profile(tmp_path):
    prof = _write(tmp_path, "name: " + "[" * 20000 + "]" * 20000 + "\n", "board.yaml")
    cf = _write(tmp_path, {"devices": [{"name": "a", "profile": "board.yaml"}]})
    with pytest.raises(UserError, match="nested more than 32 levels") as ei:
        load_cluster(cf)
    assert ei.value.path == str(prof)


def test_oversized_files_are_refused_before_parsing(tmp_path):
    f = tmp_path / "huge.yaml"
    with open(f, "wb") as fh:  # sparse: 2 GiB on paper, nothing on disk
        fh.truncate(2 << 30)
    with pytest.raises(UserError, match=r"cluster file is larger than 1 MiB, the limit for a cluster file"):
        load_cluster(f)
    prof = tmp_path / "board.yaml"
    prof.write_text("# padding\n" * (2 << 20))
    with pytest.raises(UserError, match=r"profile file is larger than 16 MiB") as ei:
        load_profile(str(prof))
    assert ei.value.path == str(prof)


@pytest.mark.parametrize("value,pattern", [
    ("2001-99-99", r"line 2, column \d+: invalid timestamp '2001-99-99': month must be in 1\.\.12"),
    ("!!int x", r"invalid int 'x'"),
    ("!!float nope", r"invalid float 'nope'"),
    ("9" * 400, r"memory_mb must be finite, got 9999"),
    ("9" * 5000, r"invalid int '9999.*Exceeds the limit"),
    ("1.0e+305", r"memory_mb must be at most 1e\+12"),
    ("1.0e-300", r"memory_mb must be at least 1e-09"),
    (".nan", r"memory_mb must be finite"),
])
def test_out_of_range_numbers_are_user_errors(tmp_path, value, pattern):
    f = _write(tmp_path, f"devices:\n  - {{name: a, profile: rpi4, memory_mb: {value}}}\n")
    with pytest.raises(UserError, match=pattern) as ei:
        load_cluster(f)
    assert ei.value.path == str(f) and "\n" not in str(ei.value) and len(str(ei.value)) < 400


def test_long_values_are_shortened_in_messages(tmp_path):
    f = _write(tmp_path, {"devices": [{"name": "a", "profile": "rpi4", "memory_mb": "x" * 100000}]})
    with pytest.raises(UserError, match=r"memory_mb must be a number, got str 'xxx.*\.\.\..*x'$") as ei:
        load_cluster(f)
    assert len(str(ei.value)) < 300


def test_alias_bomb_is_not_expanded_in_messages(tmp_path):
    # 10 ** 10 leaves on paper, a few dozen nodes in memory: quoting the value must not expand it
    anchors = ["&a0 [x, x, x, x, x, x, x, x, x, x]"]
    anchors += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    f = _write(tmp_path, f"devices:\n  - name: a\n    profile: rpi4\n    memory_mb: [{', '.join(anchors)}]\n")
    with pytest.raises(UserError, match=r"memory_mb must be a number, got list \[\['x', ") as ei:
        load_cluster(f)
    assert len(str(ei.value)) < 400


def test_yaml_merge_keys_work(tmp_path):
    f = _write(tmp_path, "devices:\n  - &d {name: a, profile: rpi4, memory_mb: 512}\n  - {<<: *d, name: b}\n"
                         "network: {bandwidth_mbps: 5, latency_ms: 1}\n")
    c = load_cluster(f)
    assert [d.memory_mb for d in c.devices] == [512, 512] and c.device_names == ("a", "b")


def test_a_device_without_address_beside_remote_ones_must_say_local(tmp_path):
    """A device with no address in a cluster whose other devices have one would run on the coordinator's
    machine unnoticed ("3 worker(s) ready (1 local)"): refused in one line naming it, unless `address: local`."""
    text = VALID.replace("    address: local\n", "")
    with pytest.raises(UserError, match=r"device 'pi4-a' has no address while 'pi5-a', 'orin' have one: .*address: local"):
        load_cluster(_write(tmp_path, text))
    assert load_cluster(_write(tmp_path, VALID)).device("pi4-a").address is None  # local: no address in the manifest
    everywhere_local = VALID.replace("    address: tcp://192.168.1.20:7000\n", "").replace(
        "    address: tcp://192.168.1.22:7000\n", "")
    assert all(d.address is None for d in load_cluster(_write(tmp_path, everywhere_local)).devices)
