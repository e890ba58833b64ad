"""`edgec generate` on local and keyed remote workers: a 1-, 2- and 3-stage build of tinylm generates exactly the
whole model's tokens (its decode loop written out here, apart from the runtime's), each sequence of several in
flight gets the tokens it gets alone, sampling verifies against the whole model's draws, every token verifies with
4 sequences in flight, each token goes from the device that chose it straight to the first stage (the direct
path: the coordinator sends input_ids for the prefills alone), the last stage sends nothing but token ids, --json
prints exactly its keys and bad input is one line; then the parts without workers (the sequence messages and the
token path's fields, the worker's per-sequence state, the token's routes, the step inputs, the prompt checks,
verification)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
import yaml
import zmq
from click.testing import CliRunner

import edgec
from edgec.runtime.coordinator import window
from edgec.runtime.coordinator.pool import WorkerPool
from edgec.runtime.device.choose import Sampler
from edgec.runtime.device.sequences import Sequences, keep_state, token_device, token_routes
from edgec.runtime.device.session import Session
from edgec.runtime.errors import InputError, RunError
from edgec.runtime.front.generate_cli import generate as generate_cmd
from edgec.runtime.generate.api import check_fits, prompts_of
from edgec.runtime.generate.feeds import step_inputs, vocab_size
from edgec.runtime.generate import pool as generate_pool
from edgec.runtime.generate.failover import Failover
from edgec.runtime.generate.loop import Sequence, decode
from edgec.runtime.generate.pool import GeneratePool
from edgec.runtime.generate.reference import verify_sequences
from edgec.runtime.manifest.load import load_manifest
from edgec.runtime.wire.keys import keygen
from edgec.runtime.wire.protocol import parse
from edgec.runtime.wire.transport import BadMessage, pack
from tests.runtime.test_distributed import Worker  # an `edgec worker` subprocess on loopback
from edgec import models

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
TINYLM = models.ensure("tinylm")  # built if missing, as every zoo model
PROMPT = [5, 17, 300, 4096, 12, 9, 1000]
OTHER = [77, 3, 15000, 42]
NEW = 5
MAX_CONTEXT = 16




def whole_model_tokens(prompt: list[int], steps: int) -> list[int]:
    """Greedy decoding with the whole model in onnxruntime, its caches fed back by hand."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(TINYLM), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    cache = {i.name: np.zeros([1, i.shape[1], 0, i.shape[3]], np.float32)
             for i in sess.get_inputs() if i.name.startswith("past_key_values.")}
    tokens, fed, past = [], list(prompt), 0
    while len(tokens) < steps:
        seq = len(fed)
        out = dict(zip(names, sess.run(None, {
            "input_ids": np.array([fed], np.int64), "position_ids": np.arange(past, past + seq, dtype=np.int64)[None],
            "attention_mask": np.ones((1, past + seq), np.int64), **cache})))
        cache = {n.replace("present", "past_key_values"): v for n, v in out.items() if n.startswith("present.")}
        past += seq
        tokens.append(int(out["logits"][0, -1].argmax()))
        fed = tokens[-1:]
    return tokens


def _build(folder: Path, names: list[str]) -> Path:
    folder.mkdir(parents=True)
    cluster = folder / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"devices": [{"name": n, "profile": "rpi5"} for n in names],
                                       "network": {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched"}}))
    out = folder / "build"
    summary = edgec.compile(TINYLM, cluster, out, strategy="even", generate=True, max_context=MAX_CONTEXT,
                            prompt_len=len(PROMPT))
    assert len(summary["stages"]) == len(names)
    return out


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("lm")
    return {n: _build(root / f"s{n}", [f"pi5-{c}" for c in "abc"[:n]]) for n in (1, 2, 3)}


@pytest.fixture(scope="module")
def whole() -> dict[tuple[int, ...], list[int]]:
    return {tuple(p): whole_model_tokens(p, NEW) for p in (PROMPT, OTHER)}


def _generate(build: Path, **kwargs) -> dict:
    return edgec.generate(build, max_new_tokens=NEW, threads=1, timeout=60, **kwargs)


@pytest.mark.parametrize("stages", [1, 2, 3])
def test_the_split_build_generates_the_whole_models_tokens(builds, whole, stages):
    report = _generate(builds[stages], prompt_ids=PROMPT, verify=True)
    assert report["sequences"] == [{"prompt": PROMPT, "tokens": whole[tuple(PROMPT)]}]
    checked = report["verify"]
    assert checked["passed"] and checked["tokens_match"] and checked["mismatch"] is None
    assert report["ttft_ms"] > 0 and report["tpot_ms"] > 0 and report["tokens_per_s"] > 0


def test_two_sequences_in_flight_each_get_their_tokens_alone(builds, whole):
    report = _generate(builds[2], prompt_ids=[PROMPT, OTHER], verify=True)
    assert [s["tokens"] for s in report["sequences"]] == [whole[tuple(PROMPT)], whole[tuple(OTHER)]]
    assert whole[tuple(PROMPT)] != whole[tuple(OTHER)]  # else the test could not tell the sequences apart
    assert report["verify"]["passed"]


def test_sampling_is_reproducible(builds, whole):
    report = _generate(builds[2], prompt_ids=[PROMPT, OTHER], temperature=1.5, seed=7, verify=True)
    # The whole model's loop, drawing with the same seeds (per sequence and token number), drew the same tokens.
    assert report["verify"]["passed"] and report["verify"]["tokens_match"]
    assert report["sequences"][0]["tokens"] != whole[tuple(PROMPT)]  # sampled, not greedy


# S = 1 and 2 on every build run above and in test_the_token_takes_the_direct_path; here S = 4 greedy and sampled
# on each (two of them in the quick set), and the rest of the matrix in the slow set.
QUICK_FOUR = {(2, 1.5), (3, 0.0)}


@pytest.mark.parametrize("stages, sequences, temperature", [
    pytest.param(n, s, t, id=f"{n}stage-S{s}-{'sampled' if t else 'greedy'}",
                 marks=[] if s == 4 and (n, t) in QUICK_FOUR else [pytest.mark.slow])
    for n in (1, 2, 3) for s in (1, 2, 4) for t in (0.0, 1.5)])
def test_every_token_verifies_with_sequences_in_flight(builds, stages, sequences, temperature):
    report = _generate(builds[stages], random_prompt=len(PROMPT), sequences=sequences, temperature=temperature,
                       seed=11, verify=True)
    assert report["verify"]["passed"] and report["verify"]["tokens_match"], report["verify"]
    assert len(report["sequences"]) == sequences and all(len(s["tokens"]) == NEW for s in report["sequences"])
    assert len({tuple(s["prompt"]) for s in report["sequences"]}) == sequences  # each its own random prompt


@pytest.mark.parametrize("stages", [1, 3])
def test_the_token_takes_the_direct_path(builds, whole, monkeypatch, stages):
    """The coordinator sends input_ids for the prefills alone; every decode step's token goes from the device
    that chose it to the first stage (over the data sockets, or into its own inbox on one device)."""
    sent = []
    real = window.send_tensor

    def counting(sock, req, src, name, array, *args, **kwargs):
        sent.append(name)
        return real(sock, req, src, name, array, *args, **kwargs)

    monkeypatch.setattr(window, "send_tensor", counting)
    m = load_manifest(builds[stages] / "manifest.json", generative=True)
    with Failover(m, sampler=Sampler(), sequences=2, threads=1, timeout=60) as plans:
        pool = plans.pool
        seqs, _ = decode(pool, m, [PROMPT, OTHER], NEW, None, plans)
    assert [s.tokens for s in seqs] == [whole[tuple(PROMPT)], whole[tuple(OTHER)]]
    decode_steps = 2 * (NEW - 1)
    assert sent.count("input_ids") == 2 and sent.count("position_ids") == 2 * NEW
    report = pool.device_report()
    working = [d for d in m.device_names if m.steps.get(d)]
    first, last = working[0], working[-1]  # one device: the same
    assert report[last]["tokens_sent"] == decode_steps and report[first]["tokens_received"] == decode_steps
    for middle in working[1:-1]:
        assert report[middle]["tokens_sent"] == report[middle]["tokens_received"] == 0
    if stages > 1:
        assert report[first]["tokens_sent"] == 0 and report[last]["tokens_received"] == 0


def test_keyed_remote_workers_generate_the_same_tokens(builds, whole, tmp_path):
    keys = tmp_path / "keys"
    keygen(keys, ["coordinator", "pi5-a", "pi5-b"])
    workers = [Worker(tmp_path / n, "--keys", str(keys), "--name", n, "--threads", "1") for n in ("pi5-a", "pi5-b")]
    try:
        addresses = {"pi5-a": workers[0].address, "pi5-b": workers[1].address}
        report = _generate(builds[2], prompt_ids=[PROMPT, OTHER], keys=keys, addresses=addresses)
        assert [s["tokens"] for s in report["sequences"]] == [whole[tuple(PROMPT)], whole[tuple(OTHER)]]
        assert workers[1].wait_for_log(f"run ended: {2 * NEW} request(s)")
        # The last stage chose every token: all it sent is one int64 id per step to the coordinator, and one per
        # decode step to the first stage (CURVE, as every peer send), no logits.
        sent = 2 * NEW * 8 + 2 * (NEW - 1) * 8
        assert re.search(rf"run ended: {2 * NEW} request\(s\);.* decoded\), {sent} sent ", workers[1].log())
        assert "inflight 4" in workers[0].log()  # two steps of each sequence in the stages at once
    finally:
        codes = [w.stop() for w in workers]
    assert codes == [0, 0]


def edgec_generate(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgec.compiler", "generate", *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=REPO)


def test_json_prints_exactly_the_report(builds, whole):
    proc = edgec_generate(builds[2], "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", NEW,
                          "--sequences", 2, "--verify", "--threads", 1, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report) == {"sequences", "ttft_ms", "tpot_ms", "tokens_per_s", "verify", "failovers"}
    assert report["failovers"] == []
    assert report["sequences"] == [{"prompt": PROMPT, "tokens": whole[tuple(PROMPT)]}] * 2
    assert set(report["verify"]) == {"passed", "tokens_match", "max_abs_diff", "tolerance", "mismatch"}
    assert report["verify"]["passed"]


def test_one_sequence_streams_its_tokens_to_stdout(builds, whole):
    proc = edgec_generate(builds[1], "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", NEW)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(t) for t in whole[tuple(PROMPT)]]


def _invoke(*args) -> str:
    """The command in this process: its one line on stderr, after checking it exited 2 with nothing on stdout."""
    res = CliRunner().invoke(generate_cmd, [str(a) for a in args])
    assert res.exit_code == 2 and res.stdout == "", (res.exit_code, res.output)
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgec: ") and "Traceback" not in res.stderr, res.stderr
    return lines[0]


@pytest.mark.parametrize("args, message", [
    (["--prompt-ids", "5,x"], "'x' is not a token id"),
    (["--prompt-ids", "5,16384"], "16384 is not a token id"),
    (["--prompt-ids", "5,-1"], "'-1' is not a token id"),
    (["--prompt-ids", ",".join(["1"] * 12)], "exceed the build's max_context 16"),
    ([], "--prompt-ids or --random-prompt"),
    (["--prompt-ids", "5", "--random-prompt", "3"], "--prompt-ids or --random-prompt"),
])
def test_bad_input_is_one_line_and_exit_2(builds, args, message):
    assert message in _invoke(builds[2], *args, "--max-new-tokens", NEW)


def test_a_build_that_does_not_generate_is_refused(tmp_path):
    out = tmp_path / "build"
    edgec.compile(MODELS / "tinychain.onnx", REPO / "tests/e2e/clusters/two.yaml", out, strategy="pipeline")
    assert "not a generative build" in _invoke(out, "--prompt-ids", "1,2", "--max-new-tokens", 2)


# -- the parts, without workers --------------------------------------------------------------------------------
def _frames(msg: dict) -> list:
    return [zmq.Frame(pack(msg))]


BEGIN = {"t": "begin", "seq": 3, "temperature": 0.0, "seed": 0, "logits": False, "drawn": 0}


RUN = {"t": "run", "req": 4, "slow": 1.0, "seq": 0}


@pytest.mark.parametrize("msg", [{**BEGIN, "seq": -1}, {"t": "drop", "seq": "a"}, {"t": "begin", "seq": 0},
                                 {**BEGIN, "temperature": -1.0}, {**BEGIN, "temperature": float("nan")},
                                 {**BEGIN, "seed": -2}, {**BEGIN, "logits": 1}, {**BEGIN, "drawn": -1},
                                 {**RUN, "seq": True}, {**RUN, "next_req": 4}, {**RUN, "next_req": 3},
                                 {**RUN, "next_req": True}, {**RUN, "next_req": "5"}, {**RUN, "next_req": 1 << 62},
                                 {**RUN, "token_from": 5}, {**RUN, "token_from": ""}, {**RUN, "token_from": "x" * 129}])
def test_malformed_sequence_messages_are_refused(msg):
    with pytest.raises(BadMessage) as refused:
        parse(_frames(msg), {"begin", "drop", "run"})
    assert "\n" not in str(refused.value)


def test_a_session_checks_the_token_path_of_a_run(builds):
    s = _session(builds[2])  # pi5-a, the first stage; pi5-b chooses the tokens
    s.chooser, s.inbox.window = "pi5-b", 4
    s.on_control(_frames({**RUN, "req": 0, "next_req": 3, "token_from": "pi5-b"}))
    assert s.next_of == {0: 3} and s.token_from == {0: "pi5-b"}
    with pytest.raises(InputError, match=r"^device pi5-a: run request 1: token_from 'pi5-c' is not the device that "
                                         r"chooses the tokens \(pi5-b\)$"):
        s.on_control(_frames({**RUN, "req": 1, "token_from": "pi5-c"}))
    with pytest.raises(InputError, match="next_req 5 is beyond the window of 4 requests"):
        s.on_control(_frames({**RUN, "req": 1, "next_req": 5}))
    s.sequences = None
    for extra in ({"next_req": 2}, {"token_from": "pi5-b"}):
        with pytest.raises(InputError, match="names a token path, but the manifest is not a generative build"):
            s.on_control(_frames({"t": "run", "req": 1, "slow": 1.0, **extra}))


class _Daemon:
    endpoint = "tcp://127.0.0.1:1"

    def send_to(self, peer, frames):
        pass


def _session(build: Path, device: str = "pi5-a") -> Session:
    s = Session(_Daemon(), b"owner", "peer")
    s.manifest = load_manifest(build / "manifest.json", check_files=False, generative=True)
    s.device, s.state, s.inbox = device, "ready", SimpleNamespace(base=0, window=4)
    s.sequences = Sequences(s.manifest, device)
    return s


def test_a_session_keeps_state_per_sequence_and_refuses_what_does_not_fit(builds):
    s = _session(builds[2])
    s.on_control(_frames(BEGIN))
    with pytest.raises(InputError, match="sequence 3 is already open"):
        s.on_control(_frames(BEGIN))
    state = s.sequences.get(3).state
    frag = next(f for f in s.manifest.device_fragments("pi5-a") if f.state)
    assert all(a.shape[spec.axis] == 0 for spec, a in zip(frag.state, state[frag.id].values()))
    with pytest.raises(InputError, match="names no sequence in a generative session"):
        s.on_control(_frames({"t": "run", "req": 0, "slow": 1.0}))
    s.on_control(_frames({"t": "run", "req": 0, "slow": 1.0, "seq": 3}))
    assert s.seq_of == {0: 3} and list(s.queue) == [0]
    s.on_control(_frames({"t": "drop", "seq": 3}))
    with pytest.raises(RunError, match="sequence 3, which is not open"):
        s.sequences.get(3)
    with pytest.raises(InputError, match="not open"):
        s.on_control(_frames({"t": "drop", "seq": 3}))


def test_a_one_pass_session_refuses_sequences(builds, tmp_path):
    s = _session(builds[2])
    s.sequences = None
    with pytest.raises(InputError, match="not a generative build"):
        s.on_control(_frames(BEGIN))
    with pytest.raises(InputError, match="names a sequence"):
        s.on_control(_frames({"t": "run", "req": 0, "slow": 1.0, "seq": 0}))


def test_state_is_kept_out_of_the_store_and_bounded_by_max_length(builds):
    m = load_manifest(builds[2] / "manifest.json", check_files=False, generative=True)
    frag = next(f for f in m.fragments.values() if f.state)
    spec = frag.state[0]
    own = {s.input: np.zeros(s.shape, s.dtype) for s in frag.state}
    grown = list(spec.shape)
    grown[spec.axis] = 3
    store = {s.input: own[s.input] for s in frag.state} | {s.output: np.ones(grown, s.dtype) for s in frag.state}
    keep_state(frag, own, store, "pi5-a")
    assert store == {} and own[spec.input].shape[spec.axis] == 3
    grown[spec.axis] = spec.max_length + 1
    with pytest.raises(RunError, match="beyond its max_length"):
        keep_state(frag, own, {s.output: np.ones(grown, s.dtype) for s in frag.state}, "pi5-a")


def test_step_inputs_follow_the_generate_block(builds):
    m = load_manifest(builds[2] / "manifest.json", check_files=False, generative=True)
    feeds = step_inputs(m, [7], past=4)
    assert feeds["input_ids"].tolist() == [[7]] and feeds["position_ids"].tolist() == [[4]]
    assert feeds["attention_mask"].tolist() == [[1] * 5]
    assert vocab_size(m) == 16384


def test_the_token_goes_to_the_devices_fed_it_as_one_token(builds):
    m = load_manifest(builds[3] / "manifest.json", check_files=False, generative=True)
    assert token_device(m) == "pi5-c" and token_routes(m) == [("pi5-a", "input_ids", (1, 1), "int64")]
    for dims in ([1, "total"], [2, "seq"]):
        g = dataclasses.replace(m.generate, shapes={**m.generate.shapes, "input_ids": tuple(dims)})
        with pytest.raises(InputError, match=r"token input 'input_ids' is .*: expected seq and sizes of 1"):
            token_routes(dataclasses.replace(m, generate=g))


def test_a_local_first_stage_that_a_remote_chooser_sends_tokens_to_binds_outward(builds, monkeypatch):
    """pi5-a (local) receives only from pi5-b (local) in the manifest's steps, but its tokens come from pi5-c
    (remote): its data socket must be reachable from there, not bound on loopback."""
    monkeypatch.setattr(generate_pool, "outward_host", lambda ep: f"outward-to-{ep.host}")
    m = load_manifest(builds[3] / "manifest.json", check_files=False, generative=True)
    pool = GeneratePool(m, sampler=Sampler(), sequences=1, addresses={"pi5-c": "tcp://10.9.8.7:5555"})
    assert WorkerPool._local_data_host(pool, "pi5-a") is None  # the manifest's steps alone
    assert pool._local_data_host("pi5-a") == "outward-to-10.9.8.7"


def test_prompts_are_checked_before_any_worker_starts(builds):
    m = load_manifest(builds[1] / "manifest.json", check_files=False, generative=True)
    assert prompts_of(m, [[1, 2], [3]], None, 4, 1, 0) == [[1, 2], [3]]
    assert prompts_of(m, [1, 2], None, 4, 3, 0) == [[1, 2]] * 3
    drawn = prompts_of(m, None, 3, 4, 2, 5)
    assert drawn == prompts_of(m, None, 3, 4, 2, 5) and drawn[0] != drawn[1] and len(drawn[0]) == 3
    for args, message in [(([[1], [2]], None, 4, 3, 0), "2 prompts were given"), (([1], None, 0, 1, 0), ">= 1"),
                          (([True], None, 1, 1, 0), "is not a token id"), (([[]], None, 1, 1, 0), "is empty")]:
        with pytest.raises(InputError, match=message):
            prompts_of(m, *args)


def test_sequences_whose_caches_a_device_cannot_hold_are_refused(builds):
    m = load_manifest(builds[2] / "manifest.json", check_files=False, generative=True)
    frag = next(f for f in m.device_fragments("pi5-b") if f.state)
    cache = sum(np.prod([s.max_length if i == s.axis else n for i, n in enumerate(s.shape)]) * 4 for s in frag.state)
    weights = m.fragment_path(frag).stat().st_size
    mb = (weights + 3 * cache) / (1 << 20)  # room for three sequences' caches on pi5-b
    small = dataclasses.replace(m, devices=tuple(dataclasses.replace(d, memory_mb=mb) if d.name == "pi5-b" else d
                                                 for d in m.devices))
    check_fits(small, 3)
    with pytest.raises(InputError, match="--sequences 4: device pi5-b would hold at least"):
        check_fits(small, 4)


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -0.5}, "--temperature"), ({"temperature": float("nan")}, "--temperature"),
    ({"seed": -1, "random_prompt": 3}, "--seed"), ({"tolerance": float("inf")}, "--tolerance"),
    ({"timeout": 0}, "--timeout"), ({"model": "elsewhere.onnx"}, "used by --verify only"),
])
def test_bad_options_of_the_api_are_one_line(builds, kwargs, message):
    with pytest.raises(InputError, match=message):
        edgec.generate(builds[1], **{"prompt_ids": [1, 2], "max_new_tokens": 2, **kwargs})


def test_verification_fails_on_a_different_token_or_logits():
    logits = [np.array([0.0, 1.0, 0.5], np.float32), np.array([2.0, 0.0, 0.0], np.float32)]
    seq = Sequence(0, [1], tokens=[1, 0], logits=[a.copy() for a in logits])
    assert verify_sequences([seq], [([1, 0], logits)], 1e-4)["passed"]
    bad = verify_sequences([seq], [([1, 2], logits)], 1e-4)
    assert not bad["passed"] and bad["mismatch"] == {"sequence": 0, "step": 1, "token": 0, "expected": 2}
    off = [logits[0] + 0.01, logits[1]]
    checked = verify_sequences([seq], [([1, 0], off)], 1e-4)
    assert not checked["passed"] and checked["tokens_match"] and checked["max_abs_diff"] == pytest.approx(0.01)
