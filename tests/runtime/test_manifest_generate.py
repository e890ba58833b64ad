"""The manifest of a generative build (version 2): its `generate` block and its fragments' `state` are parsed,
checked against the rest (one line naming the manifest), and written back by manifest_json unchanged."""

from __future__ import annotations

import copy
import json

import pytest

from edgec.runtime.errors import InputError
from edgec.runtime.manifest.load import manifest_json, parse_manifest

PATH = "/builds/lm/manifest.json"


def _state(i: int, kind: str) -> dict:
    return {"input": f"past.{i}.{kind}", "output": f"present.{i}.{kind}", "dtype": "float32", "shape": [1, 2, 0, 8],
            "axis": 2, "max_length": 32}


def _manifest() -> dict:
    """Two stages of a two-layer decoder: each fragment keeps its layer's cache; a decode step's shapes."""
    return {
        "format": "edgec.manifest", "version": 2,
        "model": {"path": "lm.onnx", "sha256": "0" * 64},
        "inputs": [{"name": "input_ids", "shape": [1, 1], "dtype": "int64"},
                   {"name": "attention_mask", "shape": [1, 20], "dtype": "int64"},
                   {"name": "position_ids", "shape": [1, 1], "dtype": "int64"}],
        "outputs": [{"name": "logits", "shape": [1, 1, 64], "dtype": "float32", "device": "b"}],
        "devices": [{"name": "a", "profile": "rpi5", "memory_mb": 100, "address": None},
                    {"name": "b", "profile": "rpi5", "memory_mb": 100, "address": None}],
        "network": {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched", "links": []},
        "fragments": [
            {"id": "f0", "device": "a", "file": "a.f0.onnx", "sha256": "1" * 64, "predicted_ms": 1.0,
             "inputs": ["input_ids", "attention_mask", "position_ids", "past.0.key", "past.0.value"],
             "outputs": ["hidden", "present.0.key", "present.0.value"],
             "state": [_state(0, "key"), _state(0, "value")]},
            {"id": "f1", "device": "b", "file": "b.f1.onnx", "sha256": "2" * 64, "predicted_ms": 1.0,
             "inputs": ["hidden", "attention_mask", "position_ids", "past.1.key", "past.1.value"],
             "outputs": ["logits", "present.1.key", "present.1.value"],
             "state": [_state(1, "key"), _state(1, "value")]}],
        "transfers": [
            {"tensor": t, "src": "a", "dst": "b", "shape": s, "dtype": d, "bytes": n, "region": None}
            for t, s, d, n in (("hidden", [1, 1, 16], "float32", 64), ("attention_mask", [1, 20], "int64", 160),
                               ("position_ids", [1, 1], "int64", 8))],
        "steps": {
            "a": [{"op": "recv", "tensor": "input_ids", "from": "@host"},
                  {"op": "recv", "tensor": "attention_mask", "from": "@host"},
                  {"op": "recv", "tensor": "position_ids", "from": "@host"},
                  {"op": "run", "fragment": "f0"},
                  *({"op": "send", "tensor": t, "to": "b"} for t in ("hidden", "attention_mask", "position_ids"))],
            "b": [*({"op": "recv", "tensor": t, "from": "a"} for t in ("hidden", "attention_mask", "position_ids")),
                  {"op": "run", "fragment": "f1"},
                  {"op": "send", "tensor": "logits", "to": "@host"}]},
        "predicted": {"latency_ms": 3.0, "throughput_ips": 500.0, "tpot_ms": 3.0, "tokens_per_s": 500.0, "ttft_ms": 4.0},
        "generate": {
            "prompt_len": 8, "max_context": 32, "priced_past": 19,
            "phases": {"prefill": {"seq": 8, "past": 0}, "decode": {"seq": 1, "past": 19}},
            "token": {"input": "input_ids", "dtype": "int64"},
            "logits": {"output": "logits", "fragment": "f1"},
            "feeds": {"input_ids": "token", "position_ids": "positions", "attention_mask": "mask"},
            "shapes": {"input_ids": [1, "seq"], "position_ids": [1, "seq"], "attention_mask": [1, "total"],
                       "logits": [1, "seq", 64], **{f"past.{i}.{k}": [1, 2, "past", 8] for i in (0, 1) for k in ("key", "value")},
                       **{f"present.{i}.{k}": [1, 2, "total", 8] for i in (0, 1) for k in ("key", "value")}}},
    }


def test_a_generative_manifest_parses_with_its_state_and_generate_block():
    m = parse_manifest(_manifest(), PATH)
    assert m.generate.token_input == "input_ids" and m.generate.logits_fragment == "f1"
    assert m.generate.feeds["attention_mask"] == "mask" and m.generate.shapes["present.0.key"] == (1, 2, "total", 8)
    assert m.generate.phases == {"prefill": {"seq": 8, "past": 0}, "decode": {"seq": 1, "past": 19}}
    f0 = m.fragments["f0"]
    assert [s.input for s in f0.state] == ["past.0.key", "past.0.value"]
    assert f0.state[0].output == "present.0.key" and f0.state[0].axis == 2 and f0.state[0].shape == (1, 2, 0, 8)
    assert f0.state_inputs == {"past.0.key", "past.0.value"}


def test_manifest_json_writes_a_generative_manifest_back_unchanged():
    m = parse_manifest(_manifest(), PATH)
    again = parse_manifest(json.loads(manifest_json(m)), PATH)
    assert again == m


def test_an_ordinary_manifest_has_no_generate_fields():
    m = _manifest()
    m["version"] = 1
    with pytest.raises(InputError, match="version 1 takes no `generate` block"):
        parse_manifest(m, PATH)
    del m["generate"]
    with pytest.raises(InputError, match=r"fragments\[0\]\.state: state belongs to a generative build"):
        parse_manifest(m, PATH)


def _broken(edit) -> str:
    m = copy.deepcopy(_manifest())
    edit(m)
    with pytest.raises(InputError) as info:
        parse_manifest(m, PATH)
    message = str(info.value)
    assert message.startswith(PATH + ": ") and "\n" not in message
    return message


@pytest.mark.parametrize("edit, expected", [
    (lambda m: m.pop("generate"), "version 2 needs a `generate` block"),
    (lambda m: m["fragments"][0]["state"][0].update(axis=1), "state[0].axis: expected an axis of the shape"),
    (lambda m: m["fragments"][0]["state"][0].update(axis=7), "state[0].axis"),
    (lambda m: m["fragments"][0]["state"][0].update(shape=[1, 2, 3, 8]), "whose length is 0"),
    (lambda m: m["fragments"][0]["state"][0].update(dtype="float8"), "unknown dtype"),
    (lambda m: m["fragments"][0]["state"][0].update(output="hidden2"), "must be an input and an output of the fragment"),
    (lambda m: m["fragments"][0]["state"][0].update(max_length=64), "beyond generate.max_context 32"),
    (lambda m: m["fragments"][0]["state"][0].update(colour="red"), "unknown key 'colour'"),
    (lambda m: m["fragments"][0].update(state=[]), "state: expected a non-empty list"),
    (lambda m: (m["fragments"][1]["state"].append(_state(0, "key")), m["fragments"][1]["inputs"].append("past.0.key"),
                m["fragments"][1]["outputs"].append("present.0.key")), "is the state of two fragments"),
    (lambda m: m["generate"]["feeds"].update(input_ids="positions"), "not a model input fed the token"),
    (lambda m: m["generate"]["feeds"].pop("position_ids"), "no feed for model input 'position_ids'"),
    (lambda m: m["generate"]["feeds"].update(position_ids="rope"), "generate.feeds.position_ids: expected one of"),
    (lambda m: m["generate"]["logits"].update(fragment="f0"), "fragment 'f0' does not give 'logits'"),
    (lambda m: m["generate"].update(max_context=8), "generate.max_context: expected an integer >= 9"),
    (lambda m: m["generate"]["shapes"].update(logits=[1, "width", 64]), "generate.shapes.logits"),
    (lambda m: m["generate"]["phases"].update(verify={"seq": 1, "past": 0}), "generate.phases.verify: expected"),
    (lambda m: m["generate"]["phases"]["decode"].update(past=40), "generate.phases.decode: seq + past is beyond"),
    (lambda m: m["generate"].pop("phases"), "generate: missing key 'phases'"),
])
def test_bad_state_and_generate_entries_are_one_line_naming_the_manifest(edit, expected):
    assert expected in _broken(edit)


def test_a_state_input_needs_no_recv_but_an_ordinary_input_does():
    """The schedule check counts a state input as on its device; the same name as an ordinary input is not."""
    def drop_state(m):
        m["fragments"][0]["state"] = m["fragments"][0]["state"][1:]
    assert "'past.0.key' is not in a's store" in _broken(drop_state)
