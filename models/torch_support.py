"""Whether the optional torch-exported models can be built here (torch, transformers, onnxscript)."""
from __future__ import annotations

import importlib.util

MODELS = {
    "distilbert_torch": "DistilBERT (transformers.DistilBertModel, default config) exported by torch.onnx",
    "resnet50_torch": "hand-written torch ResNet-50 exported by torch.onnx",
    "mobilenetv2_torch": "hand-written torch MobileNetV2 exported by torch.onnx",
    "tinylm_torch": "transformers.LlamaForCausalLM at tinylm's shape, random weights, exported by torch.onnx "
                    "with optimum's KV-cache interface",
}
# Decoder LMs among them (models/decoder.py's interface).
GENERATIVE = ("tinylm_torch",)


# torch.onnx's exporter imports onnxscript on first use; without it the builds would fail late.
_NEEDED = ("torch", "transformers", "onnxscript")


def _missing() -> str | None:
    """None if all are installed, else the reason.

    find_spec rather than import: importing torch costs ~3 s in every process that imports
    models; a broken install then fails at build time with the real import error.
    """
    for mod in _NEEDED:
        if importlib.util.find_spec(mod) is None:
            return f"{', '.join(MODELS)} need {', '.join(_NEEDED)} (the torch extra); {mod} is not installed"
    return None


MISSING: str | None = _missing()
