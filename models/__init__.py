"""Deterministic local builds of every test and benchmark ONNX model (`python -m edgec.models build`)."""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx

from . import quantized, torch_support
from .inputs import example_inputs
from .zoo import LIGHT_DIR, ZOO

__all__ = ["MODEL_NAMES", "ON_REQUEST_NAMES", "DESCRIPTIONS", "TORCH_MISSING", "default_dir", "build", "ensure",
           "is_current", "stamp", "build_model", "example_inputs"]

PACKAGE_DIR = Path(__file__).resolve().parent


def default_dir() -> Path:
    """Where models are built and looked up: $EDGEC_MODELS_DIR, else ./models/build in the working
    directory (never inside the installed package)."""
    env = os.environ.get("EDGEC_MODELS_DIR")
    return Path(env) if env else Path.cwd() / "models" / "build"


@dataclass(frozen=True)
class _Entry:
    description: str
    module: str  # submodule of models holding the builder
    func: str  # builder function; called with `args`, returns a ModelProto
    args: tuple = ()
    extra_sources: tuple[Path, ...] = ()
    packages: tuple[str, ...] = ()  # distributions whose version also decides the bytes
    on_request: bool = False  # built only when named (--only, ensure), not by the default build


def _registry() -> dict[str, _Entry]:
    reg = {name: _Entry(desc, "zoo", "build", (name,), (LIGHT_DIR / f"{stem}.onnx",))
           for name, (stem, desc) in ZOO.items()}
    reg.update({
        "vgg16": _Entry("VGG-16 (torchvision layout), opset 13, 1x3x224x224 -> logits 1000", "cnn", "vgg16"),
        "mobilenetv2": _Entry("MobileNetV2 (torchvision layout): BN, ReLU6 Clip, depthwise, opset 13",
                              "cnn", "mobilenetv2"),
        "transformer": _Entry("DistilBERT-size encoder: 6 layers, 768 hidden, seq 128, opset 17",
                              "transformer", "build", ("transformer",)),
        "yolo_focus": _Entry("YOLOv5-style detector on 1x3x320x320: Focus stem (strided Slices + Concat), CSP "
                             "backbone with SiLU, nearest Resize neck, two 1x1 heads, opset 13", "detector", "yolo_focus"),
        "ocr_rec": _Entry("PP-OCRv3-style text recogniser on 1x3x48x320: depthwise backbone with BN, HardSwish and "
                          "SE, (2, 1) strides, 4-block SVTR attention neck, CTC MatMul head (40 steps x 97), opset 17",
                          "ocr", "ocr_rec"),
        "tinyconv": _Entry("tiny CNN on 1x3x37x29: strided/dilated/grouped/depthwise convs, pools, "
                           "BN, Add, Concat, softmax 10", "tiny", "tinyconv"),
        "tinychain": _Entry("8 conv+relu layers on 1x3x32x32, then Flatten + Gemm 10", "tiny", "tinychain"),
        "tinytransformer": _Entry("the transformer builder at 2 layers, hidden 64, 4 heads, seq 16, vocab 100",
                                  "transformer", "build", ("tinytransformer",)),
        "dynamic": _Entry("tinychain with symbolic batch dimension 'N' (same weights)", "tiny", "dynamic"),
    })
    for base in quantized.BASES:  # int8 versions: built from the float model, on request
        for fmt, how in quantized.FORMATS.items():
            reg[f"{base}_{fmt}"] = _Entry(f"{base}, int8 {how}", "quantized", "build", (base, fmt),
                                          (PACKAGE_DIR / "inputs.py", PACKAGE_DIR / f"{reg[base].module}.py"),
                                          ("onnxruntime",), on_request=True)
    for name, desc in torch_support.MODELS.items():
        if torch_support.MISSING is None:
            reg[name] = _Entry(desc, "torch_exports", "build", (name,), (PACKAGE_DIR / "cnn.py",),
                               ("torch", "transformers", "onnxscript"))
    return reg


_REGISTRY = _registry()
MODEL_NAMES: tuple[str, ...] = tuple(n for n, e in _REGISTRY.items() if not e.on_request)
# The int8 models (models/quantized.py): `python -m edgec.models build --only NAME`, or ensure(NAME)
ON_REQUEST_NAMES: tuple[str, ...] = tuple(n for n, e in _REGISTRY.items() if e.on_request)
DESCRIPTIONS: dict[str, str] = {n: e.description for n, e in _REGISTRY.items()}
# Why the torch-exported models are not in MODEL_NAMES (None when they are).
TORCH_MISSING: str | None = torch_support.MISSING


def _entry(name: str) -> _Entry:
    try:
        return _REGISTRY[name]
    except KeyError:
        hint = f" ({TORCH_MISSING})" if name in torch_support.MODELS else ""
        raise KeyError(f"unknown model {name!r}{hint}; known: {', '.join(MODEL_NAMES + ON_REQUEST_NAMES)}") from None


def stamp(name: str) -> str:
    """Identifies the builder code (and source graph) a file came from; stored as the model doc_string."""
    entry = _entry(name)
    digest = hashlib.sha256()
    for path in (PACKAGE_DIR / "common.py", PACKAGE_DIR / "calibrate.py",
                 PACKAGE_DIR / f"{entry.module}.py", *entry.extra_sources):
        digest.update(path.read_bytes())
    for package in entry.packages:
        digest.update(f"{package}=={importlib.metadata.version(package)}".encode())
    return f"edgec.models {name} {digest.hexdigest()[:16]}"


def build_model(name: str) -> onnx.ModelProto:
    """Builds model `name` in memory (no file written)."""
    entry = _entry(name)
    module = importlib.import_module(f"{__name__}.{entry.module}")
    model = getattr(module, entry.func)(*entry.args)
    model.doc_string = stamp(name)
    return model


def build(name: str, out_dir: str | os.PathLike) -> Path:
    """Builds `name` and writes out_dir/NAME.onnx atomically (overwriting); returns the path."""
    model = build_model(name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.onnx"
    _write_atomic(model.SerializeToString(), path)
    return path


def ensure(name: str, out_dir: str | os.PathLike | None = None) -> Path:
    """Path of out_dir/NAME.onnx (default: `default_dir()`), building it first if it is missing or from older builder code.

    Safe when several processes call it at once: each writes its own temp file and renames it
    over the target, and builds are deterministic, so the result is the same whoever wins.
    """
    path = Path(out_dir if out_dir is not None else default_dir()) / f"{name}.onnx"
    if is_current(name, path):
        return path
    return build(name, path.parent)


def is_current(name: str, path: str | os.PathLike) -> bool:
    """Cheap check: the file exists and its header carries this builder's stamp.

    ModelProto fields serialise in field-number order, so doc_string (field 6) precedes the graph
    and sits in the first bytes of the file.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return stamp(name).encode() in head


def _write_atomic(data: bytes, path: Path) -> None:
    # The unique name keeps concurrent writers apart; the suffix matches .gitignore's *.onnx.tmp.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.stem}.", suffix=".onnx.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; built models are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
