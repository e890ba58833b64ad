"""Manifest parsing and validation: every rejected manifest gives one InputError line naming the file."""

from __future__ import annotations

import pytest

from edgec.runtime.errors import InputError
from edgec.runtime.manifest.types import HOST, Concat, Free, Recv, Region, Run, Send, Slice, region_ranges
from edgec.runtime.manifest.load import load_manifest, parse_manifest
from edgec.runtime.manifest.schedule import host_collects, host_feeds


def test_chain_parses(chain):
    m = load_manifest(chain.path)
    assert m.device_names == ("pi5-a", "pi4-a")
    assert m.steps["pi5-a"] == (Recv("data", HOST), Run("f0"), Send("t1", "pi4-a"), Free(("data", "t1")))
    assert m.fragments["f1"].inputs == ("t1",) and m.model_path == chain.folder / "model.onnx"
    assert host_feeds(m) == [("pi5-a", "data")] and host_collects(m) == {"prob": "pi4-a"}


def test_spatial_parses_every_op(spatial):
    m = load_manifest(spatial.path)
    ops = {type(s) for steps in m.steps.values() for s in steps}
    assert ops == {Recv, Run, Send, Slice, Concat, Free}
    send = m.steps["a"][3]
    assert send == Send("x", "c", Region(2, 4, 8), "x_bot") and send.name == "x_bot"


def test_box_region_parses_as_ranges(spatial):
    """A region may be a list of ranges on distinct axes (a 2-D tile's box); one range stays a Region."""
    box = [{"axis": 2, "start": 4, "stop": 8}, {"axis": 3, "start": 1, "stop": 5}]
    m = spatial.copy_manifest()
    m["steps"]["a"][3]["region"] = box
    m["transfers"][0]["region"] = box
    parsed = parse_manifest(m, spatial.path)
    ranges = (Region(2, 4, 8), Region(3, 1, 5))
    assert parsed.steps["a"][3].region == ranges and parsed.transfers[0].region == ranges
    assert region_ranges(ranges) == ranges and region_ranges(Region(2, 4, 8)) == (Region(2, 4, 8),)
    assert region_ranges(None) == ()


def test_network_link_overrides_default(chain):
    chain.manifest["network"]["links"] = [{"a": "pi4-a", "b": "pi5-a", "bandwidth_mbps": 8.0, "latency_ms": 5.0}]
    net = parse_manifest(chain.manifest, chain.path).network
    assert net.link("pi5-a", "pi4-a") == (8.0, 5.0)
    assert net.transfer_s("pi5-a", "pi4-a", 1_000_000) == pytest.approx(1.005)
    assert net.transfer_s("pi5-a", "other", 125_000) == pytest.approx(0.001)  # the 1000 Mbit/s default


def _drop(key):
    return lambda m: m.pop(key)


def _set(path, value):
    def mutate(m):
        *head, last = path
        target = m
        for k in head:
            target = target[k]
        target[last] = value
    return mutate


def _append_step(device, step):
    return lambda m: m["steps"][device].append(step)


BAD = {
    "format": (_set(["format"], "other"), "format is 'other'"),
    "version": (_set(["version"], 3), "unsupported version 3"),  # 2 is a generative build (test_manifest_generate.py)
    "missing key": (_drop("fragments"), "missing key 'fragments'"),
    "bad shape": (_set(["inputs", 0, "shape"], [1, -3]), "inputs[0].shape"),
    "bad dtype": (_set(["inputs", 0, "dtype"], "float8"), "unknown dtype 'float8'"),
    "dup device": (lambda m: m["devices"].append(dict(m["devices"][0])), "duplicate name 'pi5-a'"),
    "dup fragment": (lambda m: m["fragments"].append(dict(m["fragments"][0])), "duplicate fragment id 'f0'"),
    "unknown op": (_append_step("pi4-a", {"op": "jump"}), "unknown op 'jump'"),
    "unknown step key": (_set(["steps", "pi5-a", 1, "fragmnet"], "f0"), "unknown key(s) 'fragmnet'"),
    "unknown fragment": (_set(["steps", "pi5-a", 1, "fragment"], "f9"), "unknown fragment 'f9'"),
    "foreign fragment": (_set(["steps", "pi5-a", 1, "fragment"], "f1"), "belongs to device pi4-a"),
    "unknown device": (_set(["steps", "pi5-a", 2, "to"], "pi9"), "unknown peer device 'pi9'"),
    "steps of unknown device": (_set(["steps", "ghost"], []), "steps.ghost"),
    "unknown tensor": (_set(["steps", "pi5-a", 2, "tensor"], "t9"), "tensor 't9' is not in pi5-a's store"),
    "use after free": (_append_step("pi5-a", {"op": "send", "tensor": "t1", "to": "pi4-a", "as": "t2"}),
                       "tensor 't1' is not in pi5-a's store"),
    "recv without send": (lambda m: m["steps"]["pi4-a"].insert(0, {"op": "recv", "tensor": "zz", "from": "pi5-a"}),
                          "recv of 'zz' from pi5-a has no matching send"),
    "send without recv": (lambda m: m["steps"]["pi5-a"].insert(3, {"op": "send", "tensor": "t1", "to": "pi4-a", "as": "t1b"}),
                          "send of 't1b' to pi4-a has no matching recv"),
    "host recv of non-input": (lambda m: m["steps"]["pi4-a"].insert(0, {"op": "recv", "tensor": "q", "from": "@host"}),
                               "'q' from @host, which is not a model input"),
    "output never sent": (lambda m: m["steps"]["pi4-a"].pop(), "no step sends it to @host"),
    "output from wrong device": (_set(["outputs", 0, "device"], "pi5-a"), "declared on pi5-a but sent by pi4-a"),
    "empty region": (_set(["steps", "pi5-a", 2, "region"], {"axis": 1, "start": 3, "stop": 3}), "must be < stop"),
    "empty box": (_set(["steps", "pi5-a", 2, "region"], []), "expected at least one range"),
    "box on one axis twice": (_set(["steps", "pi5-a", 2, "region"], [{"axis": 2, "start": 0, "stop": 3},
                                                                       {"axis": 2, "start": 1, "stop": 2}]),
                              "two ranges on one axis"),
    "empty range in a box": (_set(["transfers", 0, "region"], [{"axis": 2, "start": 0, "stop": 3},
                                                               {"axis": 3, "start": 2, "stop": 2}]),
                             "transfers[0].region[1]: start 2 must be < stop 2"),
    "deadlock": (lambda m: (m["steps"]["pi5-a"].insert(0, {"op": "recv", "tensor": "back", "from": "pi4-a"}),
                            m["steps"]["pi4-a"].append({"op": "send", "tensor": "t1", "to": "pi5-a", "as": "back"})),
                 "schedule deadlocks: pi5-a waits at step 0 for 'back' from pi4-a"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_rejects(chain, case):
    mutate, expected = BAD[case]
    m = chain.copy_manifest()
    mutate(m)
    with pytest.raises(InputError) as info:
        parse_manifest(m, chain.path)
    message = str(info.value)
    assert message.startswith(f"{chain.path}: ") and "\n" not in message
    assert expected in message


def test_rejects_invalid_json(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text('{"format": ', encoding="utf-8")
    with pytest.raises(InputError, match="not valid JSON"):
        load_manifest(path)


def test_sha_checked_only_for_requested_devices(chain):
    (chain.folder / "pi4-a.f1.onnx").write_bytes(b"changed")
    load_manifest(chain.path, devices=["pi5-a"])
    load_manifest(chain.path, check_files=False)
    with pytest.raises(InputError, match="fragment f1: pi4-a.f1.onnx sha256 mismatch"):
        load_manifest(chain.path)



def _one_device(chain) -> dict:
    """The chain's two fragments run in order on pi5-a alone."""
    m = chain.copy_manifest()
    m["devices"] = m["devices"][:1]
    next(f for f in m["fragments"] if f["id"] == "f1")["device"] = "pi5-a"
    m["outputs"][0]["device"] = "pi5-a"
    m["transfers"] = []
    m["steps"] = {"pi5-a": [{"op": "recv", "tensor": "data", "from": HOST}, {"op": "run", "fragment": "f0"},
                            {"op": "run", "fragment": "f1"}, {"op": "send", "tensor": "prob", "to": HOST}]}
    return m


def test_one_device_may_have_no_network(chain):
    m = _one_device(chain)
    m["network"].update(bandwidth_mbps=None, latency_ms=None, links=[])
    net = parse_manifest(m, chain.path).network
    assert net.transfer_s("pi5-a", HOST, 10**9) == 0.0  # no network: no hop is ever delayed


def test_two_devices_need_network_figures(chain):
    m = chain.copy_manifest()
    m["network"].update(bandwidth_mbps=None, latency_ms=None)
    with pytest.raises(InputError, match=r"network\.bandwidth_mbps: expected a finite number > 0, got None"):
        parse_manifest(m, chain.path)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 10**400])
def test_numbers_must_be_finite(chain, value):
    m = chain.copy_manifest()
    m["fragments"][0]["predicted_ms"] = value
    with pytest.raises(InputError, match=r"fragments\[0\]\.predicted_ms: expected a finite number >= 0"):
        parse_manifest(m, chain.path)


def test_unhashable_op_is_an_input_error(chain):
    m = chain.copy_manifest()
    m["steps"]["pi5-a"][0]["op"] = ["run"]
    with pytest.raises(InputError, match=r"unknown op \['run'\]"):
        parse_manifest(m, chain.path)


def test_huge_values_are_shortened_in_messages(chain):
    m = chain.copy_manifest()
    m["inputs"][0]["dtype"] = "f" * 100_000
    with pytest.raises(InputError, match=r"unknown dtype 'fff.*\.\.\.") as info:
        parse_manifest(m, chain.path)
    assert len(str(info.value)) < 500


@pytest.mark.parametrize("text", ["[" * 20000 + "]" * 20000, '{"a": ' * 20000 + "1" + "}" * 20000,
                                  '{"format": "edgec.manifest", "plan": ' + "[" * 900 + "]" * 900 + "}"],
                         ids=["past the decoder's recursion", "deep objects", "decodable but too deep"])
def test_deep_json_is_an_input_error(tmp_path, text):
    path = tmp_path / "manifest.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=r"JSON nested more than 64 levels deep") as info:
        load_manifest(path)
    assert str(info.value).startswith(f"{path}: ")


def test_huge_manifest_is_refused_unread(tmp_path):
    path = tmp_path / "manifest.json"
    with open(path, "wb") as fh:  # sparse: 2 GiB on paper
        fh.truncate(2 << 30)
    with pytest.raises(InputError, match=r"manifest is larger than 64 MiB, the limit for a manifest"):
        load_manifest(path)


def test_integer_beyond_digit_limit_is_invalid_json(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text('{"version": ' + "9" * 5000 + "}", encoding="utf-8")
    with pytest.raises(InputError, match=r"not valid JSON \(Exceeds the limit"):
        load_manifest(path)
