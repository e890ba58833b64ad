"""A decoder exported by standard tooling: transformers' LlamaForCausalLM through torch.onnx (models/torch_exports.py,
`tinylm_torch`), compiled with --generate onto 4 stages (each decoder layer's cache on its own stage), generates
exactly the whole model's tokens on local workers (greedy, against its decode loop written out here; and sampled,
verified by `edgec generate --verify`), and on keyed remote workers over 2 stages.

Optional, as the other torch exports: it runs where torch, transformers and onnxscript are installed (the project's
CI has none of them), and is slow (the export alone takes ~25 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

INSTALL = "the torch-exported decoder needs torch, transformers and onnxscript: pip install -e '.[torch]'"
for _module in ("torch", "transformers", "onnxscript"):
    pytest.importorskip(_module, reason=INSTALL)

import edgec  # noqa: E402 (after the skips: nothing to import for a skipped module)
from edgec import models  # noqa: E402
from edgec.runtime.wire.keys import keygen  # noqa: E402
from tests.runtime.test_distributed import Worker  # noqa: E402 (an `edgec worker` subprocess on loopback)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CLUSTERS = REPO / "tests" / "e2e" / "clusters"
PROMPT = [5, 17, 300, 4096, 12, 9, 1000, 8]
OTHER = [77, 3, 15000, 42, 901, 6, 2, 11000]
NEW = 8
MAX_CONTEXT = 24


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    return models.build("tinylm_torch", tmp_path_factory.mktemp("lm"))


def _compile(lm: Path, cluster: str, out: Path) -> Path:
    edgec.compile(lm, CLUSTERS / f"{cluster}.yaml", out, strategy="even", generate=True, max_context=MAX_CONTEXT,
                  prompt_len=len(PROMPT))
    return out


@pytest.fixture(scope="module")
def four(lm, tmp_path_factory) -> Path:
    return _compile(lm, "four", tmp_path_factory.mktemp("four") / "build")


@pytest.fixture(scope="module")
def whole(lm) -> dict[tuple[int, ...], list[int]]:
    """Greedy decoding with the whole exported model in onnxruntime, its caches fed back by hand."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(lm), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    out = {}
    for prompt in (PROMPT, OTHER):
        cache = {i.name: np.zeros([1, i.shape[1], 0, i.shape[3]], np.float32)
                 for i in sess.get_inputs() if i.name.startswith("past_key_values.")}
        tokens, fed, past = [], list(prompt), 0
        while len(tokens) < NEW:
            seq = len(fed)
            step = dict(zip(names, sess.run(None, {
                "input_ids": np.array([fed], np.int64), "position_ids": np.arange(past, past + seq, dtype=np.int64)[None],
                "attention_mask": np.ones((1, past + seq), np.int64), **cache})))
            cache = {n.replace("present", "past_key_values"): v for n, v in step.items() if n.startswith("present.")}
            past += seq
            tokens.append(int(step["logits"][0, -1].argmax()))
            fed = tokens[-1:]
        out[tuple(prompt)] = tokens
    assert out[tuple(PROMPT)] != out[tuple(OTHER)]  # else the test could not tell the sequences apart
    return out


def test_each_layers_cache_stays_on_its_own_stage(four):
    manifest = json.loads((four / "manifest.json").read_text())
    held = [sorted(s["input"] for s in f.get("state", [])) for f in manifest["fragments"]]
    assert len(held) == 4
    caches = [name for names in held for name in names]
    assert sorted(caches) == sorted(f"past_key_values.{i}.{kv}" for i in range(4) for kv in ("key", "value"))
    # torch reads every cache's shape at the top of the graph; were those reads not taken from the token and
    # mask inputs (ingest/cache_shapes.py), all four caches would sit on the first stage
    assert sum(1 for names in held if names) >= 3
    for names in held:  # a layer's key and value together
        layers = {kind: {n.rsplit(".", 1)[0] for n in names if n.endswith(kind)} for kind in (".key", ".value")}
        assert layers[".key"] == layers[".value"]


def test_four_stages_generate_the_whole_models_tokens(four, whole):
    report = edgec.generate(four, prompt_ids=[PROMPT, OTHER], max_new_tokens=NEW, threads=1, timeout=60, verify=True)
    assert [s["tokens"] for s in report["sequences"]] == [whole[tuple(PROMPT)], whole[tuple(OTHER)]]
    assert report["verify"]["passed"] and report["verify"]["tokens_match"], report["verify"]


def test_sampled_tokens_verify_from_the_command_line(four):
    proc = subprocess.run([sys.executable, "-m", "edgec.compiler", "generate", str(four), "--random-prompt", "8",
                           "--max-new-tokens", str(NEW), "--sequences", "2", "--temperature", "0.8", "--seed", "3",
                           "--threads", "1", "--verify", "--json"], capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verify"]["passed"] and report["verify"]["tokens_match"], report["verify"]
    assert [len(s["tokens"]) for s in report["sequences"]] == [NEW, NEW]


def test_keyed_remote_workers_generate_the_same_tokens(lm, whole, tmp_path):
    build = _compile(lm, "two", tmp_path / "build")
    keys = tmp_path / "keys"
    keygen(keys, ["coordinator", "pi5-a", "pi4-a"])
    workers = {n: Worker(tmp_path / n, "--keys", str(keys), "--name", n, "--threads", "1") for n in ("pi5-a", "pi4-a")}
    try:
        report = edgec.generate(build, prompt_ids=[PROMPT, OTHER], max_new_tokens=NEW, threads=1, timeout=60,
                                keys=keys, addresses={n: w.address for n, w in workers.items()}, verify=True)
        assert [s["tokens"] for s in report["sequences"]] == [whole[tuple(PROMPT)], whole[tuple(OTHER)]]
        assert report["verify"]["passed"]
        assert all(w.wait_for_log(f"run ended: {2 * NEW} request(s)") for w in workers.values())
    finally:
        codes = [w.stop() for w in workers.values()]
    assert codes == [0, 0]
