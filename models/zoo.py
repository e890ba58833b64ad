"""The onnx package's light model-zoo graphs with their constant weights made seeded-random."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .calibrate import calibrate_batchnorm
from .common import bn_param, fill_tensor, he_normal, normal, rng_for, uniform

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"

# name -> (file stem under LIGHT_DIR, description)
ZOO = {
    "alexnet": ("light_bvlc_alexnet", "AlexNet (BVLC), LRN + Dropout, opset 9, 1x3x224x224"),
    "vgg19": ("light_vgg19", "VGG-19, opset 9, 1x3x224x224, ~550 MB of weights"),
    "resnet50": ("light_resnet50", "ResNet-50 (Caffe2), BatchNorm + Sum residuals, opset 9"),
    "inception_v1": ("light_inception_v1", "GoogLeNet / Inception v1, LRN + Concat, opset 9"),
    "inception_v2": ("light_inception_v2", "Inception v2 (BN + Unsqueeze/Mul/Add scale layers), opset 9"),
    "densenet121": ("light_densenet121", "DenseNet-121, 58 Concats, logits [1,1000,1,1], opset 9"),
    "shufflenet": ("light_shufflenet", "ShuffleNet v1 (Reshape/Transpose channel shuffle), opset 9"),
    "squeezenet": ("light_squeezenet", "SqueezeNet 1.0 fire modules, softmax [1,1000,1,1], opset 9"),
    "zfnet512": ("light_zfnet512", "ZFNet-512, LRN, opset 9, 1x3x224x224"),
}

# Ops that only reshape a weight on its way to the node that gives it its role.
_PASS_THROUGH = {"Unsqueeze", "Reshape"}


def build(name: str) -> onnx.ModelProto:
    stem, _ = ZOO[name]
    model = onnx.load(LIGHT_DIR / f"{stem}.onnx")
    weights = _sample_weights(model, name)
    _replace_constants(model, weights)
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"
           and n.input[3] in weights and n.input[4] in weights]
    calibrate_batchnorm(model, bns, name)
    return model


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    cons: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for i, x in enumerate(node.input):
            cons.setdefault(x, []).append((node, i))
    return cons


def _final_use(tensor: str, cons) -> tuple[onnx.NodeProto, int]:
    while True:
        uses = cons.get(tensor, [])
        if len(uses) != 1:
            raise ValueError(f"weight {tensor!r} has {len(uses)} consumers; expected exactly one")
        node, idx = uses[0]
        if node.op_type in _PASS_THROUGH and idx == 0:
            tensor = node.output[0]
            continue
        return node, idx


def _sample_weights(model: onnx.ModelProto, seed_name: str) -> dict[str, np.ndarray]:
    """Seeded values for every ConstantOfShape output, keyed by that output's name."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    cons = _consumers(g)
    weights = {}
    for node in g.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in inits:
            continue
        shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]))
        user, idx = _final_use(node.output[0], cons)
        rng = rng_for(seed_name, node.output[0])
        weights[node.output[0]] = _sample(rng, shape, user, idx, node.output[0])
    return weights


def _sample(rng, shape: tuple[int, ...], user: onnx.NodeProto, idx: int, name: str) -> np.ndarray:
    op = user.op_type
    if op in ("Conv", "Gemm") and idx == 1:
        return he_normal(rng, shape, _fan_in(shape, user))
    if op in ("Conv", "Gemm") and idx == 2:
        return normal(rng, shape, 0.01)
    if op == "BatchNormalization" and 1 <= idx <= 4:
        return bn_param(rng, idx, shape)
    # Caffe2 scale layers (densenet121, inception_v2): BN output * Unsqueeze(w) + Unsqueeze(b).
    if op == "Mul":
        return uniform(rng, shape, 0.5, 1.5)
    if op == "Add":
        return normal(rng, shape, 0.1)
    raise ValueError(f"no weight role for {name!r} used as input {idx} of {op}")


def _fan_in(shape: tuple[int, ...], user: onnx.NodeProto) -> int:
    if user.op_type == "Conv":  # [out, in/group, kh, kw]
        return int(np.prod(shape[1:]))
    trans_b = next((a.i for a in user.attribute if a.name == "transB"), 0)
    # inception_v1 stores its classifier as [1,1,1000,1024] and Reshapes it: the last axis is K.
    return shape[-1] if trans_b else int(np.prod(shape)) // shape[-1]


def _replace_constants(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> None:
    """Turns each `X__SHAPE` initializer (and graph input) into the weight X, in place, and drops the nodes.

    Reusing the positions keeps the graph inputs and initializers in their original order, and old
    IR versions (every initializer also a graph input) stay valid.
    """
    g = model.graph
    shape_of = {n.input[0]: n.output[0] for n in g.node
                if n.op_type == "ConstantOfShape" and n.output[0] in weights}
    cons = _consumers(g)
    for shape_name in shape_of:
        if len(cons[shape_name]) != 1:
            raise ValueError(f"{shape_name!r} feeds more than its ConstantOfShape")
    for t in g.initializer:
        if t.name in shape_of:
            name = shape_of[t.name]
            fill_tensor(t, name, weights[name])
    for vi in g.input:
        if vi.name in shape_of:
            name = shape_of[vi.name]
            vi.CopyFrom(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, weights[name].shape))
    keep = [n for n in g.node if not (n.op_type == "ConstantOfShape" and n.output[0] in weights)]
    del g.node[:]
    g.node.extend(keep)
