"""onnxruntime execution providers: a device's ordered list, what a worker's onnxruntime has, and the
tolerance `--verify` allows each provider against the CPU reference (the one place these live)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = ["CPU", "Provider", "CPU_ONLY", "TOLERANCE", "DEFAULT_TOLERANCE", "tolerance_of", "ort_providers",
           "missing_provider", "refusal"]

logger = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"


@dataclass(frozen=True)
class Provider:
    """One entry of a device's provider list: an onnxruntime provider name and its options (key, value) pairs,
    values as strings (onnxruntime's provider options are strings)."""

    name: str
    options: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict:
        return {"name": self.name, **({"options": dict(self.options)} if self.options else {})}


CPU_ONLY = (Provider(CPU),)

# --verify's tolerance per provider, relative as `edgec run --tolerance` (max|a-b| <= t * max(1, max|ref|)),
# against the CPU provider's outputs of the whole model. A plan's tolerance is the largest of its devices'
# providers'. CPU: the split changes nothing but where fragments end. OpenVINO (device_type CPU, whose default
# precision in onnxruntime's OpenVINO EP is FP32): its own kernels sum in other orders; measured against the CPU
# provider on one random input on 2026-11-29 (onnxruntime-openvino 1.24.1, a Xeon with AMX): 3.9e-6 relative on
# mobilenetv2, 9.4e-6 on resnet50, 2.1e-7 on squeezenet; 1e-3 leaves room for deeper models. Accelerators that
# run convolutions in TF32 or fp16 by default (CUDA and TensorRT on Ampere and later, CoreML, NNAPI, QNN): 1e-2,
# not measured here (no such hardware); a provider option that lowers precision further (trt_fp16_enable,
# OpenVINO's precision: BF16) needs --tolerance.
TOLERANCE = {
    CPU: 1e-4,
    "OpenVINOExecutionProvider": 1e-3,
    "DnnlExecutionProvider": 1e-3,
    "XnnpackExecutionProvider": 1e-3,
    "ACLExecutionProvider": 1e-3,
    "CoreMLExecutionProvider": 1e-2,
    "NnapiExecutionProvider": 1e-2,
    "QNNExecutionProvider": 1e-2,
    "CUDAExecutionProvider": 1e-2,
    "TensorrtExecutionProvider": 1e-2,
    "ROCMExecutionProvider": 1e-2,
    "MIGraphXExecutionProvider": 1e-2,
    "DmlExecutionProvider": 1e-2,
}
DEFAULT_TOLERANCE = 1e-2  # a provider not listed above: an accelerator of unknown precision


def tolerance_of(providers: Iterable[Provider]) -> float:
    """The tolerance a device running these providers verifies at (the largest of theirs)."""
    return max((TOLERANCE.get(p.name, DEFAULT_TOLERANCE) for p in providers), default=TOLERANCE[CPU])


def ort_providers(providers: Sequence[Provider]) -> list:
    """The `providers=` argument of onnxruntime.InferenceSession for this list (names, or (name, options))."""
    return [(p.name, dict(p.options)) if p.options else p.name for p in providers]


def missing_provider(providers: Iterable[Provider], available: Iterable[str]) -> str | None:
    """The first provider of the list that `available` (a worker's ort.get_available_providers()) lacks."""
    have = set(available)
    return next((p.name for p in providers if p.name not in have), None)


def refusal(where: str, provider: str, available: Iterable[str]) -> str:
    """The one line that refuses a plan whose device (`where` names it) needs a provider its onnxruntime lacks."""
    return (f"{where}: the plan needs {provider}, which this onnxruntime does not have (it has "
            f"{', '.join(available) or 'none'}); install an onnxruntime build with it on the device, or compile "
            f"for the providers it has (cluster.yaml 'providers:')")
