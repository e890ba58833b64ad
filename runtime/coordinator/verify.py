"""--verify: run the source model whole in onnxruntime and compare every output within a tolerance."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import onnxruntime as ort

from ..errors import InputError, one_line
from ..device.executor import session_options
from ..manifest.types import Manifest
from ..manifest.load import file_sha256
from ..providers import tolerance_of

__all__ = ["plan_tolerance", "VerifyResult", "check_model", "reference_outputs", "compare_outputs", "verify_outputs"]

logger = logging.getLogger(__name__)


@dataclass
class VerifyResult:
    passed: bool
    max_abs_diff: float  # of the worst output (the one closest to, or furthest past, its threshold)
    worst_output: str | None
    tolerance: float
    per_output: dict[str, float] = field(default_factory=dict)  # name -> max |a - b|

    def as_json(self) -> dict:
        return {"passed": self.passed, "max_abs_diff": self.max_abs_diff, "worst_output": self.worst_output,
                "tolerance": self.tolerance}


def plan_tolerance(manifest: Manifest) -> float:
    """--verify's default tolerance for this plan: the largest of the tolerances of the providers its devices
    with fragments run (runtime/providers.py TOLERANCE; the CPU's alone: 1e-4). The reference stays onnxruntime's
    CPU provider on the whole model."""
    return max(tolerance_of(d.providers) for d in manifest.devices if manifest.device_fragments(d.name)) \
        if manifest.fragments else tolerance_of(())


def _where(manifest: Manifest) -> str:
    return f"{manifest.path}: model {manifest.model_path}"


def check_model(manifest: Manifest) -> None:
    """InputError unless manifest.model_path is the file the manifest was compiled from (its sha256)."""
    path = manifest.model_path
    if not path.is_file():
        raise InputError(f"{_where(manifest)}: not found (needed by --verify; if the build folder was moved, "
                         "pass the model with --model PATH)")
    if file_sha256(path) != manifest.model_sha256.lower():
        raise InputError(f"{_where(manifest)}: sha256 does not match the manifest's: not the model this build was "
                         "compiled from (or it changed since)")


def reference_outputs(manifest: Manifest, inputs: Mapping[str, np.ndarray], threads: int = 0,
                      model_checked: bool = False) -> dict[str, np.ndarray]:
    """The source model's outputs (manifest output names) on `inputs`, from one whole-model session.
    `model_checked`: the caller ran check_model already (hashing a 500 MB model twice costs a second)."""
    path, where = manifest.model_path, _where(manifest)
    if not model_checked:
        check_model(manifest)
    try:
        sess = ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises several pybind error types
        raise InputError(f"{where}: onnxruntime cannot load it: {one_line(exc, 200)}") from None
    feeds = {}
    for i in sess.get_inputs():
        if i.name not in inputs:
            raise InputError(f"{where}: model input {i.name!r} is not among the manifest's inputs")
        feeds[i.name] = inputs[i.name]
    names = [o.name for o in manifest.outputs]
    unknown = sorted(set(names) - {o.name for o in sess.get_outputs()})
    if unknown:
        raise InputError(f"{where}: manifest output(s) {unknown} are not outputs of the model")
    return dict(zip(names, sess.run(names, feeds)))


def _max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    diff = np.abs(a64 - b64)
    # NaN in the same place in both is agreement; anywhere else it is an unbounded error.
    both_nan = np.isnan(a64) & np.isnan(b64)
    diff = np.where(both_nan, 0.0, diff)
    return float(np.inf) if np.isnan(diff).any() else float(diff.max())


def compare_outputs(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
                    tolerance: float) -> VerifyResult:
    """Pass when max|a - b| <= tolerance * max(1, max|ref|) for every output."""
    per_output, worst, worst_ratio = {}, None, -1.0
    for name, ref in reference.items():
        got = outputs.get(name)
        err = float("inf") if got is None else _max_abs_diff(np.asarray(got), ref)
        finite = np.abs(ref[np.isfinite(ref)].astype(np.float64)) if ref.size else np.zeros(0)
        scale = max(1.0, float(finite.max()) if finite.size else 1.0)
        ratio = err / (tolerance * scale) if tolerance > 0 else (0.0 if err == 0 else float("inf"))
        per_output[name] = err
        if ratio > worst_ratio:
            worst, worst_ratio = name, ratio
    return VerifyResult(passed=worst_ratio <= 1.0, max_abs_diff=per_output.get(worst, 0.0) if worst else 0.0,
                        worst_output=worst, tolerance=tolerance, per_output=per_output)


def verify_outputs(manifest: Manifest, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray],
                   tolerance: float | None = None, threads: int = 0, model_checked: bool = False) -> VerifyResult:
    """`outputs` against the whole model's; `tolerance` None: the plan's providers' (plan_tolerance)."""
    return compare_outputs(outputs, reference_outputs(manifest, inputs, threads, model_checked),
                           plan_tolerance(manifest) if tolerance is None else tolerance)
