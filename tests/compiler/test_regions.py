"""Tile row ranges: computing a tile from its input slice with the stated padding equals the whole model."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper, shape_inference

from edgec.compiler.graph import Window
from edgec.compiler.layers import build_layer_graph
from edgec.compiler.spatial import NotTileable, segment_maps, segment_region, spatial_cuts, tile_pads, window_need

OPSET, IR = 17, 9
ort.set_default_logger_severity(3)


class Net:
    """A tiny NCHW net under construction: nodes, random (non-constant) weights, running shape."""

    def __init__(self, rng: np.random.Generator, c: int, h: int, w: int):
        self.rng, self.nodes, self.inits = rng, [], []
        self.shape = {"x": (1, c, h, w)}
        self.cur = "x"

    def _name(self, p: str) -> str:
        return f"{p}{len(self.nodes)}"

    def conv(self, src, cout, k, s, d, pads):
        cin = self.shape[src][1]
        w = self._name("w")
        self.inits.append(numpy_helper.from_array(self.rng.normal(size=(cout, cin, *k)).astype(np.float32), w))
        out = self._name("c")
        self.nodes.append(helper.make_node("Conv", [src, w], [out], kernel_shape=list(k), strides=list(s),
                                           dilations=list(d), pads=list(pads)))
        return self._shape(out, src, cout, k, s, d, pads, False)

    def pool(self, src, op, k, s, pads, ceil, include_pad=0):
        out = self._name("p")
        extra = {"count_include_pad": include_pad} if op == "AveragePool" else {}
        self.nodes.append(helper.make_node(op, [src], [out], kernel_shape=list(k), strides=list(s), pads=list(pads),
                                           ceil_mode=int(ceil), **extra))
        return self._shape(out, src, self.shape[src][1], k, s, (1, 1), pads, ceil)

    def unary(self, src, op):
        out = self._name("u")
        self.nodes.append(helper.make_node(op, [src], [out]))
        self.shape[out] = self.shape[src]
        return out

    def merge(self, op, srcs):
        out = self._name("m")
        self.nodes.append(helper.make_node(op, list(srcs), [out], **({"axis": 1} if op == "Concat" else {})))
        c = sum(self.shape[t][1] for t in srcs) if op == "Concat" else self.shape[srcs[0]][1]
        self.shape[out] = (1, c, *self.shape[srcs[0]][2:])
        return out

    def _shape(self, out, src, c, k, s, d, pads, ceil):
        dims = []
        for j in range(2):
            n = self.shape[src][2 + j] + pads[j] + pads[j + 2] - ((k[j] - 1) * d[j] + 1)
            o = (-(-n // s[j]) if ceil else n // s[j]) + 1
            if ceil and (o - 1) * s[j] >= self.shape[src][2 + j] + pads[j]:
                o -= 1  # ONNX: the last window must start inside the input or the begin padding
            dims.append(o)
        self.shape[out] = (1, c, *dims)
        return out

    def model(self) -> onnx.ModelProto:
        f = TensorProto.FLOAT
        g = helper.make_graph(self.nodes, "g", [helper.make_tensor_value_info("x", f, self.shape["x"])],
                              [helper.make_tensor_value_info(self.cur, f, None)], initializer=self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR)
        for i, n in enumerate(m.graph.node):
            n.name = f"n{i}"
        return shape_inference.infer_shapes(m)


def _window(draw, size_h, size_w, pool):
    """A random window whose output is at least one row and column."""
    k = (draw(st.integers(1, 3 if pool else 5)), draw(st.integers(1, 3)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 2)))
    d = (1, 1) if pool else (draw(st.integers(1, 2)), 1)
    eff = [(k[j] - 1) * d[j] + 1 for j in range(2)]
    lim = [min(k[j] - 1, eff[j] - 1) if pool else eff[j] - 1 for j in range(2)]
    pads = [draw(st.integers(0, lim[0])), draw(st.integers(0, lim[1]))]
    pads += [draw(st.integers(0, lim[0])), draw(st.integers(0, lim[1]))]
    ok = all(n + pads[j] + pads[j + 2] >= eff[j] for j, n in enumerate((size_h, size_w)))
    return (k, s, d, pads) if ok else None


@st.composite
def nets(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    net = Net(rng, draw(st.integers(1, 3)), draw(st.integers(5, 19)), draw(st.integers(5, 12)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["conv", "maxpool", "avgpool", "relu", "residual", "inception"]))
        h, w = net.shape[net.cur][2:]
        if kind in ("conv", "maxpool", "avgpool"):
            win = _window(draw, h, w, kind != "conv")
            if win is None:
                continue
            k, s, d, pads = win
            if kind == "conv":
                net.cur = net.conv(net.cur, draw(st.integers(1, 3)), k, s, d, pads)
            else:
                op = "MaxPool" if kind == "maxpool" else "AveragePool"
                net.cur = net.pool(net.cur, op, k, s, pads, draw(st.booleans()), draw(st.integers(0, 1)))
        elif kind == "relu":
            net.cur = net.unary(net.cur, "Relu")
        elif kind == "residual":  # conv 3x3 pad 1 + Add with the block input
            c = net.shape[net.cur][1]
            branch = net.unary(net.conv(net.cur, c, (3, 3), (1, 1), (1, 1), [1, 1, 1, 1]), "Relu")
            net.cur = net.merge("Add", [branch, net.cur])
        else:  # two branches of different reach joined by a channel Concat
            a = net.conv(net.cur, 2, (1, 1), (1, 1), (1, 1), [0, 0, 0, 0])
            b = net.conv(net.cur, 2, (3, 3), (1, 1), (2, 1), [2, 1, 2, 1])
            c = net.pool(net.cur, "MaxPool", (3, 3), (1, 1), [1, 1, 1, 1], False)
            net.cur = net.merge("Concat", [a, b, c])
    if not net.nodes:
        net.cur = net.unary(net.cur, "Relu")
    return net


def _run(model: onnx.ModelProto, feeds: dict, outputs: list[str]) -> list[np.ndarray]:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    m.graph.output.extend(helper.make_empty_tensor_value_info(o) for o in outputs)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(outputs, feeds)


def _layer_model(model, layer, pads, axis, feeds_shape) -> onnx.ModelProto:
    """The layer's nodes alone, its window with the tile's pads on the tiled axis."""
    nodes = []
    for k in layer.nodes:
        n = onnx.NodeProto()
        n.CopyFrom(model.graph.node[k])
        if layer.window is not None and n.op_type == layer.window.op_type and pads is not None:
            for a in n.attribute:
                if a.name == "pads":
                    del a.ints[:]
                    a.ints.extend(tile_pads(layer.window, axis, *pads))
        nodes.append(n)
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info(t, f, feeds_shape[t]) for t in layer.inputs]
    g = helper.make_graph(nodes, "l", ins, [helper.make_tensor_value_info(layer.outputs[0], f, None)],
                          initializer=list(model.graph.initializer))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR)


def _check_tile(model, graph, maps, full, start, stop):
    """Compute tile [start, stop) layer by layer from its input slice; compare every tensor's rows."""
    axis = maps.axis
    reg = segment_region(maps, start, stop)
    lo, hi = reg.rows[maps.input]
    held = {maps.input: np.take(full[maps.input], range(lo, hi), axis=axis)}
    for i in range(maps.lo, maps.hi):
        layer = graph.layers[i]
        r0, r1 = reg.reads[i]
        feeds = {t: np.take(held[t], range(r0 - reg.rows[t][0], r1 - reg.rows[t][0]), axis=axis) for t in layer.inputs}
        assert all(v.shape[axis] == r1 - r0 for v in feeds.values()), "a tensor holds fewer rows than read"
        lm = _layer_model(model, layer, reg.pads.get(i), axis, {t: v.shape for t, v in feeds.items()})
        out = layer.outputs[0]
        (held[out],) = _run(lm, feeds, [out])
        want = np.take(full[out], range(*reg.rows[out]), axis=axis)
        assert held[out].shape == want.shape, (layer.op_types, reg.rows[out], held[out].shape, want.shape)
        np.testing.assert_allclose(held[out], want, rtol=1e-4, atol=1e-4)
    assert reg.rows[maps.output] == (start, stop)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(net=nets(), axis=st.sampled_from([2, 3]), data=st.data())
def test_tiles_reproduce_the_whole_model(net, axis, data):
    model = net.model()
    graph = build_layer_graph(model)
    names = list(dict.fromkeys(t for l in graph.layers for t in (*l.inputs, *l.outputs)))
    x = np.random.default_rng(1).normal(size=net.shape["x"]).astype(np.float32)
    full = dict(zip(names, _run(model, {"x": x}, names)))
    cuts = spatial_cuts(graph, axis)
    wrong = [l.index for l in graph.layers if graph.tensors[l.outputs[0]].shape != full[l.outputs[0]].shape]
    # ONNX shape inference can disagree with onnxruntime (ceil_mode): such a layer is never tiled
    assert cuts[-1] == (min(wrong) if wrong else len(graph.layers)) or (wrong and cuts[-1] < min(wrong))
    assume(len(cuts) > 1)
    lo, hi = sorted(data.draw(st.lists(st.sampled_from(cuts), min_size=2, max_size=2, unique=True)))
    maps = segment_maps(graph, lo, hi, axis)
    m = maps.rows
    n_tiles = data.draw(st.integers(1, min(3, m)))
    bounds = sorted(data.draw(st.lists(st.integers(1, m - 1), min_size=n_tiles - 1, max_size=n_tiles - 1, unique=True))) if m > 1 else []
    edges = [0, *bounds, m]
    for a, b in zip(edges, edges[1:]):
        _check_tile(model, graph, maps, full, a, b)


def test_seven_rows_over_three_devices_stride_two():
    w = Window("Conv", (3, 3), (2, 2), (1, 1, 1, 1), (1, 1))
    # 7 input rows -> 4 output rows; tiles 0-1, 1-3, 3-4
    assert window_need(w, 2, 0, 1, 7).__dict__ == {"lo": 0, "hi": 2, "pad_lo": 1, "pad_hi": 0}
    assert window_need(w, 2, 1, 3, 7).__dict__ == {"lo": 1, "hi": 6, "pad_lo": 0, "pad_hi": 0}
    assert window_need(w, 2, 3, 4, 7).__dict__ == {"lo": 5, "hi": 7, "pad_lo": 0, "pad_hi": 1}


def test_ceil_mode_overhang_keeps_model_pad():
    # MaxPool 2x2/2 ceil_mode over 7 rows -> 4 rows; the last window reads row 6 and one row past it,
    # which the tile gets from ceil_mode with the model's pad_end (0), not from explicit padding.
    w = Window("MaxPool", (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), ceil_mode=True)
    assert window_need(w, 2, 3, 4, 7) == window_need(w, 2, 3, 4, 7).__class__(6, 7, 0, 0)


def test_type3_ends_the_prefix_and_bad_segments_are_refused():
    net = Net(np.random.default_rng(0), 2, 8, 8)
    a = net.conv("x", 2, (3, 3), (1, 1), (1, 1), [1, 1, 1, 1])
    net.cur = net.unary(net.unary(a, "Relu"), "GlobalAveragePool")
    model = net.model()
    graph = build_layer_graph(model)
    assert spatial_cuts(graph, 2) == (0, 1)
    with pytest.raises(NotTileable):
        segment_maps(graph, 0, len(graph.layers), 2)
