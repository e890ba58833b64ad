"""The model of tests/runtime/data/openvino_fallback.*: conv1 -> relu1 -> conv2 -> Mish -> Identity -> Reshape ->
Hardmax -> fc -> relu3 -> fc2 (OpenVINO leaves the first part and Hardmax to the CPU).

openvino_fallback.trace.json is onnxruntime's profiler trace of one run of it on onnxruntime-openvino 1.24.1
(2026-11-29), providers [(OpenVINOExecutionProvider, {device_type: CPU}), CPUExecutionProvider], at
ORT_ENABLE_BASIC, random inputs: the CPU ran conv1, relu1, conv2, Mish's parts (Softplus_11, Tanh_12, Mul_13),
flatten and hardmax; OpenVINO-EP-subgraph_1 ran fc, relu3 and fc2 (the Identity was eliminated).

    python openvino_fallback_model.py openvino_fallback.onnx
"""
import sys, onnx, numpy as np
from onnx import helper as h, TensorProto as T, numpy_helper as nh
rng = np.random.default_rng(0)
def w(name, *shape):
    return nh.from_array(rng.standard_normal(shape).astype(np.float32), name)
nodes = [
  h.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
  h.make_node("Relu", ["c1"], ["r1"], name="relu1"),
  h.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
  h.make_node("Mish", ["c2"], ["mi"], name="mish"),
  h.make_node("Identity", ["mi"], ["r2"], name="ident"),
  h.make_node("Reshape", ["r2", "shape"], ["f"], name="flatten"),
  h.make_node("Hardmax", ["f"], ["hm"], name="hardmax", axis=-1),
  h.make_node("MatMul", ["hm", "w3"], ["m"], name="fc"),
  h.make_node("Relu", ["m"], ["r3"], name="relu3"),
  h.make_node("MatMul", ["r3", "w4"], ["y"], name="fc2"),
]
inits = [w("w1", 4, 2, 3, 3), w("w2", 4, 4, 3, 3), nh.from_array(np.array([1, 64], dtype=np.int64), "shape"),
         w("w3", 64, 16), w("w4", 16, 4)]
g = h.make_graph(nodes, "fallback", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 4])],
                 [h.make_tensor_value_info("y", T.FLOAT, [1, 4])], inits)
m = h.make_model(g, opset_imports=[h.make_opsetid("", 18)], producer_name="edgec-tests")
m.ir_version = 8
onnx.checker.check_model(m)
onnx.save(m, sys.argv[1])
