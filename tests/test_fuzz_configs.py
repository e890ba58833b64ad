"""Fuzz the configuration files: seeded random mutations of a valid cluster.yaml (fed to `edgec compile`)
and of a valid manifest.json (fed to `edgec inspect`, `simulate` and `run`). Whatever the damage, the CLI
ends with exit 0, 1 or 2, never 3 ("internal error" is a bug), never a traceback, and a bad input is
exactly one stderr line. Every command runs in-process (click's CliRunner) to keep the file fast."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from edgec import models
from edgec.compiler.cli import cli
from edgec.compiler.driver import compile_model

ROOT = Path(__file__).resolve().parent
TWO = ROOT / "e2e/clusters/two.yaml"
SEED = 20250607
N_CLUSTER, N_MANIFEST, N_RUN = 160, 120, 40

ODD_STRINGS = ["", " ", "\u0000", "\u202e\u2066gnp.evil", "\ud7ff\ufeff", "é" * 3, "👾" * 5, "a" * 5000, "..", "/",
               "../../../etc/passwd", "/dev/null", "C:\\x", "null", "~", "1e3", "-", "@host", "\t\n"]
NUMBERS = [0, -1, -1e308, 1e308, 10**400, -(10**400), float("nan"), float("inf"), float("-inf"), 1e-320, 2**63,
           -(2**63), 0.5, 3, True, False]


def _deep(rng: random.Random):
    v: object = rng.choice([1, "x", None])
    for _ in range(rng.choice([40, 500])):  # deeper text comes from text surgery (json.dumps recurses)
        v = [v] if rng.random() < 0.5 else {"a": v}
    return v


def _value(rng: random.Random):
    kind = rng.randrange(6)
    if kind == 0:
        return rng.choice(NUMBERS)
    if kind == 1:
        return rng.choice(ODD_STRINGS)
    if kind == 2:
        return rng.choice([None, [], {}, [1, 2], {"k": "v"}, [None], {"": None}])
    if kind == 3:
        return _deep(rng)
    if kind == 4:
        return rng.randrange(-5, 50)
    return rng.choice(["switched", "shared", "pi5-a", "pi4-a", "rpi5", "rpi4", "float32", "run", "send", "recv"])


def _containers(tree) -> list:
    """Every dict and list in the tree (iteratively: fuzzed trees may be deep)."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (dict, list)) and len(out) < 5000:
            out.append(node)
            stack.extend(node.values() if isinstance(node, dict) else node)
    return out


def _mutate_tree(tree, rng: random.Random, rounds: int) -> None:
    for _ in range(rounds):
        node = rng.choice(_containers(tree))
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        op = rng.randrange(6)
        if op == 0 and keys:  # delete
            del node[rng.choice(keys)]
        elif op in (1, 2) and keys:  # replace a value
            node[rng.choice(keys)] = _value(rng)
        elif op == 3 and isinstance(node, dict):  # unknown or odd key
            node[rng.choice(ODD_STRINGS + ["extra", "links", "op", "region"])] = _value(rng)
        elif op == 4 and isinstance(node, list):  # duplicate, drop or shuffle list items
            if node and rng.random() < 0.5:
                node.append(copy.deepcopy(rng.choice(node)))
            else:
                rng.shuffle(node)
        elif keys:  # change a value's type
            k = rng.choice(keys)
            node[k] = [node[k]] if rng.random() < 0.5 else str(node[k])


def _mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    op = rng.randrange(3)
    if op == 0 or not data:
        return data[: rng.randrange(len(data) + 1)]
    buf = bytearray(data)
    for _ in range(rng.randrange(1, 6)):
        i = rng.randrange(len(buf))
        if op == 1:
            buf[i] ^= 1 << rng.randrange(8)
        else:
            buf[i:i] = bytes([rng.randrange(256)])
    return bytes(buf)


def _check(result, what: str) -> None:
    err, out = result.stderr, result.stdout
    where = f"{what}: exit {result.exit_code}\nstderr: {err[-2000:]}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (where, repr(result.exception))
    assert result.exit_code in (0, 1, 2), where
    assert "Traceback" not in err + out and "internal error" not in err, where
    if result.exit_code == 2:
        assert len(err.strip().splitlines()) == 1, where


# --------------------------------------------------------------------------------------------------
# (a) cluster.yaml -> edgec compile


def _mutated_cluster(i: int) -> bytes:
    rng = random.Random(f"{SEED}-cluster-{i}")
    text = TWO.read_text(encoding="utf-8")
    kind = rng.randrange(4)
    if kind == 0:
        return _mutate_bytes(text.encode(), rng)
    if kind == 1:  # text surgery: duplicate keys, deep flow nesting, a tab, an anchor loop
        extra = rng.choice(["network: {bandwidth_mbps: 1, latency_ms: 1}\n", "devices: []\n",
                            "x: " + "[" * 5000 + "]" * 5000 + "\n", "\tnetwork: 1\n", "a: &a [*a]\n",
                            "devices:\n  - {name: pi5-a, profile: rpi5, name: pi5-b}\n", "%YAML 9.9\n---\n"])
        return (text + extra if rng.random() < 0.7 else extra + text).encode()
    tree = yaml.safe_load(text)
    _mutate_tree(tree, rng, rng.randrange(1, 4))
    try:
        return yaml.safe_dump(tree, allow_unicode=rng.random() < 0.5, sort_keys=False).encode("utf-8", "surrogatepass")
    except (yaml.YAMLError, RecursionError):  # PyYAML cannot write every tree it is given; dump it as JSON (valid YAML)
        return json.dumps(tree).encode()


@pytest.mark.parametrize("i", range(N_CLUSTER))
def test_mutated_cluster_compile(tmp_path, i):
    f = tmp_path / "cluster.yaml"
    f.write_bytes(_mutated_cluster(i))
    model = models.ensure("tinychain")
    result = CliRunner().invoke(cli, ["compile", str(model), "--devices", str(f), "-o", str(tmp_path / "out")])
    _check(result, f"compile with cluster case {i}: {f.read_bytes()[:300]!r}")


# --------------------------------------------------------------------------------------------------
# (b) manifest.json -> edgec inspect / simulate / run


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fuzz") / "build"
    compile_model(models.ensure("tinychain"), TWO, out)
    return out


MANIFEST_VALUES = ["0" * 64, "f" * 63, "pi5-a.f0.onnx", "../model.onnx", "/etc/hostname", "manifest.json",
                   {"axis": 2, "start": 0, "stop": 1}, {"axis": 9, "start": 5, "stop": 2}, [{"axis": 2}],
                   [1, 3, 8, 8], [1, -1], [10**12, 10**12], [], "float64", "bool"]


def _mutated_manifest(build: Path, i: int, kind: str) -> bytes:
    rng = random.Random(f"{SEED}-manifest-{kind}-{i}")
    text = (build / "manifest.json").read_text(encoding="utf-8")
    if rng.random() < 0.25:
        return _mutate_bytes(text.encode(), rng)
    tree = json.loads(text)
    for _ in range(rng.randrange(1, 4)):
        if rng.random() < 0.35:  # a manifest-shaped value where it hurts most
            node = rng.choice([c for c in _containers(tree) if c])
            key = rng.choice(list(node) if isinstance(node, dict) else range(len(node)))
            node[key] = copy.deepcopy(rng.choice(MANIFEST_VALUES))
        else:
            _mutate_tree(tree, rng, 1)
    return json.dumps(tree).encode("utf-8", "surrogatepass")


def _manifest_case(build: Path, i: int, kind: str) -> Path:
    # Next to the fragments so that relative file names resolve; a name of its own per case.
    path = build / f"case-{kind}-{i}.json"
    path.write_bytes(_mutated_manifest(build, i, kind))
    return path


@pytest.mark.parametrize("i", range(N_MANIFEST))
def test_mutated_manifest_inspect_and_simulate(build, i):
    path = _manifest_case(build, i, "read")
    for command in (["inspect", str(path)], ["inspect", str(path), "--json"], ["simulate", str(path)]):
        _check(CliRunner().invoke(cli, command), f"{' '.join(command[:1])} manifest case {i}: {path.read_bytes()[:300]!r}")


@pytest.mark.parametrize("i", range(N_RUN))
def test_mutated_manifest_run(build, i):
    path = _manifest_case(build, i, "run")
    result = CliRunner().invoke(cli, ["run", str(path), "--random-inputs", "--timeout", "20"])
    _check(result, f"run manifest case {i}: {path.read_bytes()[:300]!r}")
