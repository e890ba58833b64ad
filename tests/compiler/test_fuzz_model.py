"""Corrupt ONNX files: random byte flips and truncations of small models must load, price and compile, or fail
with one UserError line naming the file (exit 2 from the CLI), never anything else."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgec import models
from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table
from edgec.compiler.errors import UserError
from edgec.compiler.ingest import load_model

TWO = Path(__file__).resolve().parents[1] / "e2e" / "clusters" / "two.yaml"
SEED = 20251125
CASES_PER_MODEL = 100  # two models: 200 cases in process
CLI_CASES = 6
STEP_NOTE = re.compile(r"edgec: \w+: \d+\.\d+s")


def folding_model() -> onnx.ModelProto:
    """Constant, ConstantOfShape, Identity of a weight and a Reshape target: the nodes ingest folds."""
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(np.array([4], np.int64)), name="c0"),
        helper.make_node("ConstantOfShape", ["shape"], ["bias"], value=numpy_helper.from_array(np.array([0.5], np.float32)), name="cos"),
        helper.make_node("Identity", ["w"], ["w_id"], name="idw"),
        helper.make_node("Conv", ["x", "w_id", "bias"], ["y0"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["y0"], ["y1"], name="relu"),
        helper.make_node("Constant", [], ["rs"], value=numpy_helper.from_array(np.array([1, -1], np.int64)), name="c1"),
        helper.make_node("Reshape", ["y1", "rs"], ["y"], name="reshape"),
    ]
    graph = helper.make_graph(nodes, "fold", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 144])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _weight_ranges(data: bytes) -> list[tuple[int, int]]:
    model = onnx.load_from_string(data)
    spans = []
    for init in model.graph.initializer:
        if len(init.raw_data) > 64:
            start = data.find(init.raw_data)
            spans.append((start, start + len(init.raw_data)))
    return spans


def mutants(data: bytes, count: int, rng: random.Random) -> list[bytes]:
    """Mostly 1-3 flipped bytes, nine times in ten in the graph's structure rather than in weight values
    (where nearly any byte is a valid float); one case in twenty a truncation."""
    weights = _weight_ranges(data)
    structure = [i for i in range(len(data)) if not any(a <= i < b for a, b in weights)]
    out = []
    for k in range(count):
        if k % 20 == 19:
            out.append(data[: rng.randrange(len(data))])
            continue
        b = bytearray(data)
        for _ in range(rng.choice([1, 1, 2, 3])):
            pos = rng.choice(structure) if rng.random() < 0.9 else rng.randrange(len(b))
            b[pos] ^= rng.randrange(1, 256)
        out.append(bytes(b))
    return out


@pytest.fixture(scope="module")
def sources() -> dict[str, bytes]:
    return {"tinyconv": models.ensure("tinyconv").read_bytes(), "folding": folding_model().SerializeToString()}


def _outcome(path: Path, cluster) -> str | None:
    """None if the file compiles as far as the cost table, else the UserError's message; anything else raises."""
    try:
        ing = load_model(path)
        build_cost_table(ing.graph, cluster, ing.sha256)
    except UserError as exc:
        return str(exc)
    return None


def test_flipped_and_truncated_models_fail_cleanly(sources, tmp_path):
    cluster = load_cluster(TWO)
    rng = random.Random(SEED)
    problems, failed = [], 0
    for name, data in sources.items():
        for k, bad in enumerate(mutants(data, CASES_PER_MODEL, rng)):
            path = tmp_path / f"{name}-{k}.onnx"
            path.write_bytes(bad)
            try:
                msg = _outcome(path, cluster)
            except Exception as exc:  # the failure this test exists to find: report every case, not the first
                problems.append(f"{path.name}: {type(exc).__name__}: {exc}")
                continue
            if msg is not None:
                failed += 1
                if not msg.startswith(f"{path}: ") or "\n" in msg:
                    problems.append(f"{path.name}: not one line naming the file: {msg!r}")
    assert not problems, "\n".join(problems)
    assert failed >= CASES_PER_MODEL  # most mutants are broken: the fuzzing reaches past the weights


def test_cli_exit_codes_on_corrupt_models(sources, tmp_path):
    rng = random.Random(SEED + 1)
    codes = []
    for k, bad in enumerate(mutants(sources["tinyconv"], CLI_CASES, rng)):
        path = tmp_path / f"cli-{k}.onnx"
        path.write_bytes(bad)
        proc = subprocess.run([sys.executable, "-m", "edgec.compiler", "compile", str(path), "--devices", str(TWO),
                               "-o", str(tmp_path / f"out-{k}"), "--strategy", "pipeline", "--json"],  # --json: no progress lines
                              capture_output=True, text=True, timeout=120)
        codes.append(proc.returncode)
        assert proc.returncode in (0, 2), proc.stderr
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
        if proc.returncode == 2:
            lines = proc.stderr.splitlines()
            # the error is the last line; before it only the compile's step notes ("edgec: cluster: 0.01s")
            assert lines[-1].startswith(f"edgec: {path}: "), proc.stderr
            assert all(STEP_NOTE.fullmatch(ln) for ln in lines[:-1]), proc.stderr
            assert not (tmp_path / f"out-{k}").exists()  # nothing half-written
    assert 2 in codes
