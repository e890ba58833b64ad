"""Tile equals whole for the row operators of spatial/ops.py: strided Slice, SpaceToDepth, DepthToSpace,
Resize/Upsample by integer factors, ConvTranspose; and the reasons given where the attributes refuse.

Each case is a tiny NCHW graph: the operator alone (its tiles must equal the whole bit for bit), and the
operator between two 3x3 convs with random weights (fused into one segment the operator is inside it; a
segment per block makes it a segment's output). Tiled along H and along W in 2 and 3 uneven tiles, and on
a 2 x 2 grid, every tile fragment fed its rows of the whole model's tensor yields exactly its rows."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgec.compiler.ingest import load_model
from edgec.compiler.emit.tiles import build_tile_model
from edgec.compiler.spatial import spatial_cuts, tileable
from edgec.compiler.spatial.tiles import stage_layout
from tests.compiler.test_tiles import grid_stage, spatial_stage

ort.set_default_logger_severity(3)
F32 = TensorProto.FLOAT
BIG = np.iinfo(np.int64).max


class Case:
    """x [1, C, H, W] -> (conv) -> the operator -> (conv) -> y; the operator's extra inputs as initializers."""

    def __init__(self, op: str, attrs: dict, consts=(), size=(13, 11), channels=4, opset=17, convs=False):
        self.op, self.attrs, self.consts, self.size, self.channels = op, attrs, consts, size, channels
        self.opset, self.convs = opset, convs
        self.rng = np.random.default_rng(0)

    def _conv(self, nodes, inits, src, cin, name):
        w = numpy_helper.from_array(self.rng.normal(0, 0.3, (cin, cin, 3, 3)).astype(np.float32), f"{name}.w")
        b = numpy_helper.from_array(self.rng.normal(0, 0.1, (cin,)).astype(np.float32), f"{name}.b")
        inits += [w, b]
        nodes.append(helper.make_node("Conv", [src, w.name, b.name], [name], name=name, pads=[1, 1, 1, 1]))
        return name

    def model(self, path) -> str:
        nodes, inits = [], []
        src = self._conv(nodes, inits, "x", self.channels, "pre") if self.convs else "x"
        ins = [src]
        for k, value in enumerate(self.consts):
            if value is None:
                ins.append("")
                continue
            arr = value if isinstance(value, np.ndarray) else np.asarray(value)
            if arr.dtype == np.float64:
                arr = arr.astype(np.float32)
            inits.append(numpy_helper.from_array(arr, f"c{k}"))
            ins.append(f"c{k}")
        nodes.append(helper.make_node(self.op, ins, ["op"], name="op", **self.attrs))
        out = "op"
        if self.convs:
            cout = self._shape_of_op()[1]
            out = self._conv(nodes, inits, "op", cout, "post")
        g = helper.make_graph(nodes, "case", [helper.make_tensor_value_info("x", F32, [1, self.channels, *self.size])],
                              [helper.make_tensor_value_info(out, F32, None)], initializer=inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=8)
        m = onnx.shape_inference.infer_shapes(m)
        onnx.save(m, path)
        return path

    def _shape_of_op(self):
        nodes, inits, ins = [], [], ["x"]
        for k, value in enumerate(self.consts):
            if value is None:
                ins.append("")
                continue
            arr = np.asarray(value)
            inits.append(numpy_helper.from_array(arr.astype(np.float32) if arr.dtype == np.float64 else arr, f"c{k}"))
            ins.append(f"c{k}")
        nodes.append(helper.make_node(self.op, ins, ["op"], **self.attrs))
        g = helper.make_graph(nodes, "s", [helper.make_tensor_value_info("x", F32, [1, self.channels, *self.size])],
                              [helper.make_tensor_value_info("op", F32, None)], initializer=inits)
        m = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)]))
        return [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]


def _whole(ing, x) -> dict[str, np.ndarray]:
    m = onnx.ModelProto()
    m.CopyFrom(ing.model)
    names = [t for t in ing.graph.tensors if t not in ing.graph.inputs]
    del m.graph.output[:]
    m.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in names)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return {"x": x} | dict(zip(names, sess.run(names, {"x": x})))


def check(ing, stage, exact: bool) -> int:
    """Every tile of `stage` equals the whole model's rows of its segment output; returns the tile count."""
    x = np.random.default_rng(5).normal(size=ing.graph.tensors["x"].shape).astype(np.float32)
    full = _whole(ing, x)
    count = 0
    for maps, specs in stage_layout(ing.graph, stage, 0):
        covered = np.zeros(full[maps.output].shape, dtype=bool)
        for spec, geo in specs:
            enc = build_tile_model(ing.model, ing.graph, geo, spec.in_name, spec.out_name, spec.fid)
            feed, want, box = full[spec.input], full[spec.output], [slice(None)] * 4
            for axis, (a, b), (c, d) in zip(spec.axes, spec.in_box, spec.out_box):
                feed, want = np.take(feed, range(a, b), axis=axis), np.take(want, range(c, d), axis=axis)
                box[axis] = slice(c, d)
            sess = ort.InferenceSession(enc.data, providers=["CPUExecutionProvider"])
            (got,) = sess.run([spec.out_name], {spec.in_name: feed})
            assert got.shape == want.shape, (spec, got.shape, want.shape)
            if exact:
                np.testing.assert_array_equal(got, want, err_msg=str(spec))
            else:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(spec))
            covered[tuple(box)] = True
            count += 1
        assert covered.all()  # the tiles, put together, are the whole output
    return count


def run_case(case: Case, tmp_path, exact: bool = True) -> None:
    """Alone (bit for bit where `exact`, else within 1e-5), and between convs (fused, and a segment per
    block): H and W in 2 and 3 uneven tiles, and a 2 x 2 grid."""
    for convs in (False, True):
        case.convs = convs
        ing = load_model(case.model(tmp_path / f"m{convs}.onnx"))
        graph = ing.graph
        for axis in (2, 3):
            assert tileable(graph, graph.producer["op"], axis) is None
            assert spatial_cuts(graph, axis)[-1] == len(graph.layers)
            for n, fused, seed in ((2, True, 1), (3, False, 2), (3, True, 3)):
                rng = np.random.default_rng(seed)
                stage = spatial_stage(graph, [f"d{i}" for i in range(n)], axis, fused=fused, rng=rng)
                assert check(ing, stage, exact=exact and not convs) >= n
        grid = grid_stage(graph, ["d0", "d1", "d2", "d3"], 2, 2, fused=convs, rng=np.random.default_rng(4))
        check(ing, grid, exact=exact and not convs)


def _slice(starts, ends, axes, steps=None):
    consts = [np.array(starts, np.int64), np.array(ends, np.int64), np.array(axes, np.int64)]
    return Case("Slice", {}, consts + ([np.array(steps, np.int64)] if steps is not None else []), size=(17, 14))


SLICES = {
    "focus phase (step 2 on both axes, open end)": _slice([1, 0], [BIG, BIG], [2, 3], [2, 2]),
    "step 3 from 1 to -1, and from -7 by 2": _slice([1, -7], [-1, BIG], [2, -1], [3, 2]),
    "negative start and end, step 1": _slice([-12, 2], [-2, 9], [-2, 3]),
    "channels only": _slice([1], [3], [1]),
    "start past the end clamps": _slice([0, 3], [100, 1000], [2, 3], [4, 1]),
}


@pytest.mark.parametrize("name", list(SLICES))
def test_slice(name, tmp_path):
    run_case(SLICES[name], tmp_path)


def test_slice_opset_9_attributes(tmp_path):
    run_case(Case("Slice", {"starts": [2, 1], "ends": [-1, 9], "axes": [2, 3]}, opset=9, size=(15, 12)), tmp_path)


@pytest.mark.parametrize("block", [2, 3])
def test_space_to_depth(block, tmp_path):
    run_case(Case("SpaceToDepth", {"blocksize": block}, size=(6 * block, 4 * block)), tmp_path)


@pytest.mark.parametrize("block,mode", [(2, "DCR"), (3, "CRD"), (2, "CRD")])
def test_depth_to_space(block, mode, tmp_path):
    run_case(Case("DepthToSpace", {"blocksize": block, "mode": mode}, channels=block * block * 2, size=(7, 5)), tmp_path)


def _resize(scales, size=(7, 6), sizes=None, **attrs) -> Case:
    consts = [None, np.array(scales, np.float32) if scales else None]
    if sizes is not None:
        consts = [None, None, np.array(sizes, np.int64)]
    return Case("Resize", attrs, consts, size=size, opset=13)


RESIZES = {
    "nearest half_pixel round_prefer_floor x2 (opset 13's default)": _resize([1, 1, 2, 2], mode="nearest"),
    "nearest asymmetric floor x3": _resize([1, 1, 3, 3], mode="nearest", coordinate_transformation_mode="asymmetric",
                                           nearest_mode="floor"),
    "nearest asymmetric round_prefer_ceil x2 by 4": _resize([1, 1, 2, 4], mode="nearest",
                                                            coordinate_transformation_mode="asymmetric",
                                                            nearest_mode="round_prefer_ceil"),
    "nearest half_pixel floor x4": _resize([1, 1, 4, 4], mode="nearest", nearest_mode="floor"),
    "nearest half_pixel ceil x2": _resize([1, 1, 2, 2], mode="nearest", nearest_mode="ceil"),
    "nearest tf_half_pixel_for_nn x2": _resize([1, 1, 2, 2], mode="nearest",
                                               coordinate_transformation_mode="tf_half_pixel_for_nn"),
    "nearest pytorch_half_pixel by sizes x2 x1": _resize(None, sizes=[1, 4, 14, 6], mode="nearest",
                                                         coordinate_transformation_mode="pytorch_half_pixel"),
    "linear half_pixel x2": _resize([1, 1, 2, 2], mode="linear"),
    "linear asymmetric x4 x2": _resize([1, 1, 4, 2], mode="linear", coordinate_transformation_mode="asymmetric"),
    "linear pytorch_half_pixel x2": _resize([1, 1, 2, 2], mode="linear",
                                            coordinate_transformation_mode="pytorch_half_pixel"),
    "cubic half_pixel x2": _resize([1, 1, 2, 2], mode="cubic"),
    "cubic half_pixel x2 exclude_outside": _resize([1, 1, 2, 2], mode="cubic", exclude_outside=1),
}


@pytest.mark.parametrize("name", list(RESIZES))
def test_resize(name, tmp_path):
    case = RESIZES[name]  # interpolation weighs rows in float (vectorised differently on a narrow tile)
    run_case(case, tmp_path, exact=case.attrs["mode"] == "nearest")


def test_upsample_opset_9_and_resize_opset_10(tmp_path):
    run_case(Case("Upsample", {"mode": "nearest"}, [np.array([1, 1, 2, 3], np.float32)], size=(7, 5), opset=9), tmp_path)
    run_case(Case("Resize", {"mode": "nearest"}, [np.array([1, 1, 3, 2], np.float32)], size=(7, 5), opset=10), tmp_path)


def _transposed(k, s, pads=(0, 0, 0, 0), d=1, out_pad=(0, 0), group=1, cin=4, cout=4) -> Case:
    w = np.random.default_rng(9).normal(0, 0.3, (cin, cout // group, k, k)).astype(np.float32)
    attrs = {"strides": [s, s], "pads": list(pads), "dilations": [d, d], "output_padding": list(out_pad), "group": group}
    return Case("ConvTranspose", attrs, [w, np.random.default_rng(8).normal(0, 0.1, cout).astype(np.float32)],
                size=(7, 6), channels=cin)


TRANSPOSED = {
    "3x3 stride 2 pad 1 output_padding 1": _transposed(3, 2, (1, 1, 1, 1), out_pad=(1, 1)),
    "4x4 stride 2 pad 1": _transposed(4, 2, (1, 1, 1, 1)),
    "1x1 stride 3 (gaps between taps), output_padding 2": _transposed(1, 3, out_pad=(2, 1)),
    "3x3 stride 1 dilation 2 pads 2 0 1 3": _transposed(3, 1, (2, 0, 1, 3), d=2),
    "2x2 stride 2 groups 2": _transposed(2, 2, group=2),
    "5x5 stride 3 pad 2 dilation 2 output_padding 1": _transposed(5, 3, (2, 2, 2, 2), d=2, out_pad=(1, 1)),
}


@pytest.mark.parametrize("name", list(TRANSPOSED))
def test_conv_transpose(name, tmp_path):
    run_case(TRANSPOSED[name], tmp_path, exact=False)  # it accumulates in float


REFUSED = {
    "Slice: step -1 on a spatial axis (only positive steps are tiled)": _slice([-1], [-BIG], [3], [-1]),
    "Resize: linear half_pixel by 3: the source coordinates are not exact in floating point, a tile could "
    "round them differently from the whole model": _resize([1, 1, 3, 3], mode="linear"),
    "Resize: coordinate_transformation_mode align_corners (the source coordinate depends on the tensor's "
    "length or a crop box, so a tile's differs from the whole model's)":
        _resize([1, 1, 2, 2], mode="linear", coordinate_transformation_mode="align_corners"),
    "Resize: axis 2 grows from 7 to 10, not by an integer factor": _resize([1, 1, 1.5, 2], mode="nearest"),
}


@pytest.mark.parametrize("why", list(REFUSED))
def test_refused_with_the_reason(why, tmp_path):
    graph = load_model(REFUSED[why].model(tmp_path / "m.onnx")).graph
    i = graph.producer["op"]
    for axis in (2, 3):
        assert tileable(graph, i, axis) == f"op: {why}"
        assert spatial_cuts(graph, axis) == (0,)
