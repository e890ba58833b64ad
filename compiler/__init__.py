"""edgec compiler: ONNX model + cluster description -> per-device fragments and a static schedule."""
