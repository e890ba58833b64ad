"""Split equals whole, for generation: the fragments of a 2- and a 3-stage generative build of tinylm, run by
hand in onnxruntime (prefill, then decode steps, each fragment keeping its own state, the token fed back to
the first stage), choose the same tokens as the whole model's decode loop, with the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml

from edgec.compiler.api import compile as compile_api
from edgec import models

ROOT = Path(__file__).resolve().parents[2]
TINYLM = models.ensure("tinylm")  # built if missing, as every zoo model
TOL = dict(rtol=1e-4, atol=1e-4)
PROMPT = np.array([[5, 17, 300, 4096, 12, 9, 1000]], dtype=np.int64)
NEW_TOKENS = 5



def _session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _feeds(gen: dict, token: np.ndarray, past: int) -> dict[str, np.ndarray]:
    """Each host input of a step as the manifest's `generate.feeds` says to make it."""
    seq = token.shape[1]
    made = {"token": token, "positions": np.arange(past, past + seq, dtype=np.int64)[None],
            "mask": np.ones((1, past + seq), dtype=np.int64)}
    return {name: made[how] for name, how in gen["feeds"].items()}


class SplitModel:
    """A generative build's fragments in stage order, each with the state it keeps between steps."""

    def __init__(self, build: Path):
        self.m = json.loads((build / "manifest.json").read_text())
        self.frags = self.m["fragments"]
        self.sessions = {f["id"]: _session(build / f["file"]) for f in self.frags}
        self.state = {f["id"]: {s["input"]: np.zeros(s["shape"], s["dtype"]) for s in f.get("state", [])}
                      for f in self.frags}

    def step(self, token: np.ndarray, past: int) -> np.ndarray:
        gen = self.m["generate"]
        store = _feeds(gen, token, past)
        for f in self.frags:
            own = self.state[f["id"]]
            feeds = {n: own[n] if n in own else store[n] for n in f["inputs"]}
            outs = dict(zip(f["outputs"], self.sessions[f["id"]].run(f["outputs"], feeds)))
            for s in f.get("state", []):
                own[s["input"]] = outs.pop(s["output"])  # kept on its fragment's device, never in the store
            store.update(outs)
        return store[gen["logits"]["output"]]


class WholeModel:
    def __init__(self, path: Path):
        self.sess = _session(path)
        self.names = [o.name for o in self.sess.get_outputs()]
        self.cache = {i.name: np.zeros([1, i.shape[1], 0, i.shape[3]], np.float32)
                      for i in self.sess.get_inputs() if i.name.startswith("past_key_values.")}

    def step(self, token: np.ndarray, past: int) -> np.ndarray:
        seq = token.shape[1]
        out = dict(zip(self.names, self.sess.run(None, {
            "input_ids": token, "position_ids": np.arange(past, past + seq, dtype=np.int64)[None],
            "attention_mask": np.ones((1, past + seq), np.int64), **self.cache})))
        self.cache = {n.replace("present", "past_key_values"): v for n, v in out.items() if n.startswith("present.")}
        return out["logits"]


def _generate(model, steps: int) -> tuple[list[int], list[np.ndarray]]:
    tokens, logits = [], []
    out = model.step(PROMPT, 0)
    past = PROMPT.shape[1]
    for _ in range(steps):
        logits.append(out[0, -1])
        token = int(out[0, -1].argmax())
        tokens.append(token)
        out = model.step(np.array([[token]], dtype=np.int64), past)
        past += 1
    return tokens, logits


def _cluster(tmp_path: Path, n: int) -> Path:
    doc = {"devices": [{"name": f"pi-{i}", "profile": "rpi5"} for i in range(n)],
           "network": {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched"}}
    path = tmp_path / f"cluster{n}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def whole():
    return _generate(WholeModel(TINYLM), NEW_TOKENS)


@pytest.mark.parametrize("stages", [2, 3])
def test_split_fragments_generate_the_whole_models_tokens(tmp_path, whole, stages):
    build = tmp_path / "build"
    summary = compile_api(TINYLM, _cluster(tmp_path, stages), build, strategy="even", generate=True,
                          max_context=64, prompt_len=PROMPT.shape[1])
    assert len(summary["stages"]) == stages
    split = SplitModel(build)
    held = [s["input"] for f in split.frags for s in f.get("state", [])]
    assert len(held) == 8 and len(set(held)) == 8  # every cache kept by exactly one fragment
    assert not {t["tensor"] for t in split.m["transfers"]} & {*held, *(h.replace("past_key_values", "present") for h in held)}
    tokens, logits = _generate(split, NEW_TOKENS)
    assert tokens == whole[0]
    for got, want in zip(logits, whole[1]):
        np.testing.assert_allclose(got, want, **TOL)
