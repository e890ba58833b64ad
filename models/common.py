"""Seeded weight sampling and a small onnx.helper graph builder shared by the model modules."""
from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64}


def fill_tensor(t: onnx.TensorProto, name: str, value: np.ndarray) -> onnx.TensorProto:
    """Writes `value` into `t` in place; unlike numpy_helper.from_array + CopyFrom this copies the
    bytes once, which matters for the half-gigabyte VGGs."""
    value = np.ascontiguousarray(value)
    t.Clear()
    t.name = name
    t.data_type = ELEM[value.dtype]
    t.dims.extend(value.shape)
    t.raw_data = value.tobytes()
    return t


def rng_for(seed_name: str, tensor: str) -> np.random.Generator:
    """RNG keyed by (model, tensor), so values do not depend on creation order.

    crc32, unlike hash(), gives the same seed in every process.
    """
    return np.random.default_rng([zlib.crc32(seed_name.encode()), zlib.crc32(tensor.encode())])


def he_normal(rng: np.random.Generator, shape: Sequence[int], fan_in: int) -> np.ndarray:
    """N(0, 2/fan_in): keeps the activation variance constant through ReLU layers."""
    return normal(rng, shape, np.sqrt(2.0 / fan_in))


def normal(rng: np.random.Generator, shape: Sequence[int], std: float) -> np.ndarray:
    out = rng.standard_normal(tuple(shape), dtype=np.float32)
    out *= np.float32(std)  # in place: the VGG classifiers are 400 MB
    return out


def uniform(rng: np.random.Generator, shape: Sequence[int], low: float, high: float) -> np.ndarray:
    return rng.uniform(low, high, tuple(shape)).astype(np.float32)


def bn_param(rng: np.random.Generator, index: int, shape: Sequence[int]) -> np.ndarray:
    """BatchNormalization input `index` (1 scale, 2 bias, 3 mean, 4 var), before calibration."""
    if index in (1, 4):  # scale and var: positive, around 1
        return uniform(rng, shape, 0.5, 1.5)
    return normal(rng, shape, 0.1)


class Builder:
    """Accumulates nodes and seeded initializers; names are unique per builder."""

    def __init__(self, seed_name: str):
        self.seed_name = seed_name
        self.nodes: list[onnx.NodeProto] = []
        # Initializers go straight into the final ModelProto: make_graph/make_model would copy them.
        self._model = onnx.ModelProto()
        self._count: dict[str, int] = {}
        self._scalars: set[str] = set()

    def fresh(self, prefix: str) -> str:
        n = self._count.get(prefix, 0)
        self._count[prefix] = n + 1
        return f"{prefix}_{n}"

    def rng(self, tensor: str) -> np.random.Generator:
        return rng_for(self.seed_name, tensor)

    def const(self, name: str, value: np.ndarray) -> str:
        fill_tensor(self._model.graph.initializer.add(), name, value)
        return name

    def scalar(self, name: str, value: float) -> str:
        """A float32 scalar initializer, shared by every node that asks for the same name."""
        if name not in self._scalars:
            self._scalars.add(name)
            self.const(name, np.array(value, np.float32))
        return name

    def op(self, op_type: str, inputs: Sequence[str], name: str | None = None, **attrs) -> str:
        """Adds a single-output node and returns its output name."""
        out = name or self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, pad: int | None = None,
             dilation: int = 1, group: int = 1, bias: bool = True, prefix: str = "conv") -> str:
        name = self.fresh(prefix)
        pad = dilation * (k - 1) // 2 if pad is None else pad
        fan_in = cin // group * k * k
        shape = (cout, cin // group, k, k)
        ins = [x, self.const(f"{name}.weight", he_normal(self.rng(f"{name}.weight"), shape, fan_in))]
        if bias:
            ins.append(self.const(f"{name}.bias", normal(self.rng(f"{name}.bias"), (cout,), 0.01)))
        return self.op("Conv", ins, name=name, kernel_shape=[k, k], strides=[stride, stride],
                       pads=[pad] * 4, dilations=[dilation, dilation], group=group)

    def bn(self, x: str, c: int) -> str:
        name = self.fresh("bn")
        params = [self.const(f"{name}.{p}", bn_param(self.rng(f"{name}.{p}"), i, (c,)))
                  for i, p in enumerate(("scale", "bias", "mean", "var"), start=1)]
        return self.op("BatchNormalization", [x, *params], name=name, epsilon=1e-5)

    def clip6(self, x: str) -> str:
        return self.op("Clip", [x, self.scalar("clip.min", 0.0), self.scalar("clip.max", 6.0)])

    def gemm(self, x: str, cin: int, cout: int, prefix: str = "fc", out: str | None = None) -> str:
        name = self.fresh(prefix)
        w = self.const(f"{name}.weight", he_normal(self.rng(f"{name}.weight"), (cout, cin), cin))
        b = self.const(f"{name}.bias", normal(self.rng(f"{name}.bias"), (cout,), 0.01))
        return self.op("Gemm", [x, w, b], name=out or name, transB=1)

    def model(self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
              opset: int, graph_name: str) -> onnx.ModelProto:
        model = self._model
        model.graph.name = graph_name
        model.graph.node.extend(self.nodes)
        model.graph.input.extend(inputs)
        model.graph.output.extend(outputs)
        model.opset_import.append(helper.make_opsetid("", opset))
        model.producer_name = "edgec.models"
        # Pinned rather than onnx.IR_VERSION so the bytes do not change with the installed onnx.
        model.ir_version = 8
        return model


def tensor_input(name: str, dtype: type, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, ELEM[np.dtype(dtype)], list(shape))
