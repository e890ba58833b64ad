"""int8 versions of zoo models, made as a user makes them: onnxruntime.quantization on the float model.

Three formats per model: QDQ (quantize_static, QuantFormat.QDQ: float operators between QuantizeLinear and
DequantizeLinear, which onnxruntime fuses into int8 kernels), QOperator (quantize_static, QuantFormat.QOperator:
QLinearConv, QLinearAdd, ...) and dynamic (quantize_dynamic: DynamicQuantizeLinear and MatMulInteger /
ConvInteger, activations quantized at run time).  The float model is first pre-processed as onnxruntime's
quantization guide says (quant_pre_process: BatchNormalization folded into the convolutions, shapes
inferred); static quantization calibrates on CALIBRATION_BATCHES seeded example inputs (models/inputs.py),
MinMax.  Activations are uint8, weights int8 (onnxruntime's CPU defaults for QDQ on x86 and ARM).
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import onnx

from .inputs import example_inputs

# (base model, format) of each entry: `<base>_<format>` in the registry (models/__init__.py)
BASES = ("tinyconv", "mobilenetv2", "transformer")
FORMATS = {"qdq": "QDQ (quantize_static, QuantFormat.QDQ)", "qop": "QOperator (quantize_static, QLinear* ops)",
           "dyn": "dynamic (quantize_dynamic: DynamicQuantizeLinear + MatMulInteger/ConvInteger)"}
CALIBRATION_BATCHES = 8


class _Calibration:
    """onnxruntime's CalibrationDataReader protocol over seeded example inputs."""

    def __init__(self, model_path: Path):
        self._feeds = iter([example_inputs(model_path, seed=100 + k) for k in range(CALIBRATION_BATCHES)])

    def get_next(self):
        return next(self._feeds, None)

    def rewind(self):  # some onnxruntime releases call it between calibration passes
        raise RuntimeError("calibration data is read once")


def build(base: str, fmt: str) -> onnx.ModelProto:
    """The int8 model of zoo model `base` in format `fmt` (a key of FORMATS)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from . import ensure

    src = ensure(base)
    logging.getLogger().setLevel(max(logging.getLogger().level, logging.ERROR))  # its "please pre-process" notes
    with tempfile.TemporaryDirectory() as d:
        pre, out = Path(d) / "pre.onnx", Path(d) / "q.onnx"
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        if fmt == "dyn":
            quantize_dynamic(pre, out, weight_type=QuantType.QInt8)
        else:
            quantize_static(pre, out, _Calibration(pre), activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                            quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator)
        model = onnx.load(out)
    _drop_unused_opsets(model)
    return model


def _drop_unused_opsets(model: onnx.ModelProto) -> None:
    """quant_pre_process imports every domain onnxruntime knows (ai.onnx.training, org.pytorch.aten, ...): keep
    those the graph uses."""
    used = {n.domain for n in model.graph.node} | {"", "ai.onnx"}
    keep = [o for o in model.opset_import if o.domain in used]
    del model.opset_import[:]
    model.opset_import.extend(keep)
