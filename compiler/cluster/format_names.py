"""The fixed key names of the file formats that the compiler also reads from the built models."""

__all__ = ["GFLOPS_KEYS", "INT8_GFLOPS_KEYS", "EFFICIENCY_KEYS", "MEDIUMS"]

GFLOPS_KEYS = ("conv", "depthwise_conv", "gemm", "other")  # a profile's operator classes
INT8_GFLOPS_KEYS = ("conv_int8", "depthwise_conv_int8", "gemm_int8")  # optional: else the float class's figure
EFFICIENCY_KEYS = ("conv", "conv_positions", "depthwise_conv", "gemm")  # small-output efficiency curves
MEDIUMS = ("switched", "shared")  # switched: each pair of devices has its own link; shared: one channel
