"""Failover mid-generation: on a 3-stage tinylm build compiled with --generate --fallbacks, a worker killed while
two sequences are in flight is replaced by the fallback plan without it; both sequences restart their prefill
there (prompt and tokens so far) and finish with exactly the whole model's tokens, greedy or sampled, whether
the worker was killed or went silent past the heartbeats. Without
a fallback the run fails in one line naming the device, exit 3. Then the parts without workers: the sampler's
draws after a restart, a restarted sequence's prefill, the schedule of sequences restarted with different
counts, and S sequences' caches checked against the fallback plans' devices too."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import edgec
from edgec.runtime.device.choose import Sampler
from edgec.runtime.errors import InputError
from edgec.runtime.generate.api import check_fits
from edgec.runtime.generate.failover import Failover
from edgec.runtime.generate.loop import Sequence, decode, schedule
from edgec.runtime.manifest.load import load_manifest
from tests.runtime.test_distributed import killable_workers
from tests.runtime.test_generate_run import MAX_CONTEXT, NEW, OTHER, PROMPT, REPO, TINYLM, whole_model_tokens

DEVICES = ["pi5-a", "pi5-b", "pi5-c"]
KILL_AFTER = 2  # tokens, over both sequences



def _compile(folder: Path, devices: list[str], fallbacks: bool) -> Path:
    folder.mkdir(parents=True)
    cluster = folder / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"devices": [{"name": n, "profile": "rpi5"} for n in devices],
                                       "network": {"bandwidth_mbps": 100, "latency_ms": 1, "medium": "switched"}}))
    out = folder / "build"
    summary = edgec.compile(TINYLM, cluster, out, strategy="even", generate=True, max_context=MAX_CONTEXT,
                            prompt_len=len(PROMPT), fallbacks=fallbacks)
    assert len(summary["stages"]) == len(devices)
    return out


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    """Three stages pi5-a -> pi5-b -> pi5-c; each fallback runs on the other two."""
    out = _compile(tmp_path_factory.mktemp("lm") / "fb", DEVICES, fallbacks=True)
    m = load_manifest(out / "manifest.json", generative=True)
    assert [d for d in m.device_names if m.steps.get(d)] == DEVICES
    fallback = load_manifest(out / m.fallback_for("pi5-b").manifest, generative=True)
    assert [d for d in fallback.device_names if fallback.steps.get(d)] == ["pi5-a", "pi5-c"]
    return out


@pytest.fixture(scope="module")
def plain_build(tmp_path_factory) -> Path:
    return _compile(tmp_path_factory.mktemp("lm") / "plain", DEVICES[:2], fallbacks=False)


@pytest.fixture(scope="module")
def whole() -> dict[tuple[int, ...], list[int]]:
    return {tuple(p): whole_model_tokens(p, NEW) for p in (PROMPT, OTHER)}


@pytest.fixture
def workers(tmp_path):
    """An `edgec worker` per device on loopback; those the test did not kill must stop cleanly."""
    yield from killable_workers(tmp_path, DEVICES, "--threads", "1")


def _kill_after(workers, victim: str, count: int):
    """An on_token callback that SIGKILLs the victim's worker once `count` tokens have come."""
    seen = []

    def on_token(seq: int, token: int) -> None:
        seen.append((seq, token))
        if len(seen) == count:
            workers[victim].proc.kill()
            workers[victim].proc.wait()

    return on_token


@pytest.mark.parametrize("victim", ["pi5-b", "pi5-c"], ids=["middle", "last"])
def test_a_worker_killed_mid_generation_loses_no_sequence(build, workers, whole, victim):
    report = edgec.generate(build, prompt_ids=[PROMPT, OTHER], max_new_tokens=NEW, threads=1, timeout=30,
                            verify=True, addresses={n: w.address for n, w in workers.items()},
                            on_token=_kill_after(workers, victim, KILL_AFTER))
    assert workers[victim].proc.poll() is not None
    assert [s["tokens"] for s in report["sequences"]] == [whole[tuple(PROMPT)], whole[tuple(OTHER)]]
    assert report["verify"]["passed"] and report["verify"]["tokens_match"]
    [switch] = report["failovers"]
    assert switch["device"] == victim and KILL_AFTER <= switch["after_tokens"] < 2 * NEW
    assert Path(switch["plan"]) == build / f"fallback-{victim}" / "manifest.json"


def test_sampled_tokens_continue_with_the_same_draws_after_a_restart(build, workers):
    """The same seed gives the same tokens whether or not a device was lost halfway, and the whole model's loop
    draws them too (--verify)."""
    kwargs = dict(prompt_ids=[PROMPT, OTHER], max_new_tokens=NEW, threads=1, timeout=30, temperature=1.5, seed=7)
    calm = edgec.generate(build, **kwargs)  # local workers, nothing lost
    lost = edgec.generate(build, verify=True, addresses={n: w.address for n, w in workers.items()},
                          on_token=_kill_after(workers, "pi5-b", KILL_AFTER), **kwargs)
    assert [f["device"] for f in lost["failovers"]] == ["pi5-b"] and calm["failovers"] == []
    assert lost["sequences"] == calm["sequences"]
    assert lost["verify"]["passed"] and lost["verify"]["tokens_match"]


def test_a_device_silent_past_the_heartbeats_is_replaced(build, workers, whole):
    """SIGSTOP keeps pi5-b's connection open but unanswered: only the heartbeats (100 ms, 5 missed) tell."""
    m = load_manifest(build / "manifest.json", generative=True)
    stopped = workers["pi5-b"].proc
    seen = []

    def on_token(seq: int, token: int) -> None:
        seen.append(token)
        if len(seen) == KILL_AFTER:
            stopped.send_signal(signal.SIGSTOP)

    try:
        with Failover(m, sampler=Sampler(), addresses={n: w.address for n, w in workers.items()}, sequences=2,
                      timeout=30, heartbeat_ms=100, threads=1) as plans:
            seqs, _ = decode(plans.pool, m, [PROMPT, OTHER], NEW, on_token, plans)
    finally:
        stopped.send_signal(signal.SIGCONT)
    assert [s.tokens for s in seqs] == [whole[tuple(PROMPT)], whole[tuple(OTHER)]]
    [switch] = plans.failovers
    assert switch["device"] == "pi5-b" and switch["after_tokens"] >= KILL_AFTER


def test_the_command_reports_the_failover(build, workers, whole):
    """One sequence, its tokens streamed: the worker is killed once the first two are on stdout."""
    proc = _generate_and_kill(build, workers, "pi5-b", KILL_AFTER)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(t) for t in whole[tuple(PROMPT)]]
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("failover:")]
    assert line.startswith("failover: device pi5-b lost after ") and "fallback-pi5-b" in line, proc.stderr
    assert "Traceback" not in proc.stderr


def test_without_a_fallback_a_lost_device_fails_in_one_line(plain_build, workers):
    proc = _generate_and_kill(plain_build, workers, "pi5-b", KILL_AFTER)
    assert proc.returncode == 3, proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("edgec: device pi5-b") and "compile with --fallbacks" in last, proc.stderr
    assert "Traceback" not in proc.stderr


def _generate_and_kill(build: Path, workers, victim: str, after: int) -> subprocess.CompletedProcess:
    """`edgec generate` of one sequence on the workers, SIGKILLing the victim's once `after` tokens are out
    (read as they stream to stdout)."""
    addresses = [a for n, w in workers.items() if n in _devices(build) for a in ("--addresses", f"{n}={w.address}")]
    cmd = [sys.executable, "-m", "edgec.compiler", "generate", str(build), "--prompt-ids", ",".join(map(str, PROMPT)),
           "--max-new-tokens", str(NEW), "--threads", "1", "--timeout", "30", *addresses]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = b""
    while out.count(b" ") < after:  # from the pipe itself: communicate() below reads it, not a buffer over it
        char = os.read(proc.stdout.fileno(), 1)
        assert char, "the run ended before the worker was killed"
        out += char
    workers[victim].proc.kill()
    workers[victim].proc.wait()
    rest, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(cmd, proc.returncode, (out + rest).decode(), err.decode())


def _devices(build: Path) -> set[str]:
    return {d["name"] for d in json.loads((build / "manifest.json").read_text())["devices"]}


# -- the parts, without workers --------------------------------------------------------------------------------
def test_a_restarted_sampler_draws_what_the_running_one_would():
    logits = np.random.default_rng(0).normal(size=64).astype(np.float32)
    sampler = Sampler(2.0, 11)
    running = sampler.for_sequence(3)
    drawn = [running(logits) for _ in range(8)]
    restarted = sampler.for_sequence(3, drawn=5)
    assert [restarted(logits) for _ in range(3)] == drawn[5:]
    assert len(set(drawn)) > 1  # sampled: the same logits give different tokens
    other = sampler.for_sequence(4)
    assert [other(logits) for _ in range(8)] != drawn  # another sequence, other draws


def test_a_restarted_sequence_prefills_its_prompt_and_tokens(build):
    m = load_manifest(build / "manifest.json", generative=True)
    [ids] = [name for name, how in m.generate.feeds.items() if how == "token"]
    s = Sequence(0, list(PROMPT), tokens=[40, 41], past=len(PROMPT) + 1)
    step = s.next_step(m, ahead=2)  # a decode step: its token comes from the device that chose it
    assert step.direct and ids not in step and (step.new, step.past, step.ahead) == (1, len(PROMPT) + 1, 2)
    assert step["position_ids"].ravel().tolist() == [len(PROMPT) + 1] and s.past == len(PROMPT) + 2
    s.past = 0  # restarted on the fallback plan
    step = s.next_step(m)
    assert not step.direct and (step.new, step.past, step.ahead) == (len(PROMPT) + 2, 0, None)
    assert step[ids].ravel().tolist() == PROMPT + [40, 41]


def test_after_a_restart_each_sequence_runs_its_own_count():
    """Rounds over the sequences that still need a token: one restarted with 3 of 5 tokens runs 2 steps, one
    with 1 runs 4; each step knows how many requests later its sequence's next one comes."""
    a, b = Sequence(0, [1], tokens=[7, 8, 9]), Sequence(1, [2], tokens=[7])
    steps = schedule([a, b], 5)
    assert [(s.index, ahead) for s, ahead in steps] == [(0, 2), (1, 2), (0, None), (1, 1), (1, 1), (1, None)]


def test_sequences_whose_caches_a_fallback_device_cannot_hold_are_refused(build):
    """A failover restarts every unfinished sequence on the fallback plan, whose devices hold more layers, so
    more caches each: S sequences must fit there too, and the one line names the plan and the device."""
    m = load_manifest(build / "manifest.json", generative=True)
    fallback = Failover(m, sampler=Sampler(), sequences=1).fallbacks["pi5-b"]
    frags = [f for f in fallback.device_fragments("pi5-a") if f.state]
    cache = sum(np.prod([s.max_length if i == s.axis else n for i, n in enumerate(s.shape)]) * 4
                for f in frags for s in f.state)
    weights = sum(fallback.fragment_path(f).stat().st_size for f in fallback.device_fragments("pi5-a"))
    mb = (weights + 2 * cache) / (1 << 20)  # room for two sequences' caches on the fallback's pi5-a
    small = dataclasses.replace(fallback, devices=tuple(
        dataclasses.replace(d, memory_mb=mb) if d.name == "pi5-a" else d for d in fallback.devices))
    check_fits(m, 3, {"pi5-b": fallback})
    check_fits(m, 2, {"pi5-b": small})
    with pytest.raises(InputError, match=r"^--sequences 3 on the fallback plan without pi5-b \(.*fallback-pi5-b"
                                         r"/manifest.json\): device pi5-a would hold at least \d+ MB .* more than"):
        check_fits(m, 3, {"pi5-b": small})
    check_fits(m, 3)  # the main plan alone holds them
