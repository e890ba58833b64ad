"""The fixed key names of the file formats that the compiler also reads from the built models."""

__all__ = ["GFLOPS_KEYS", "EFFICIENCY_KEYS", "MEDIUMS"]

GFLOPS_KEYS = ("conv", "depthwise_conv", "gemm", "other")  # a profile's operator classes
EFFICIENCY_KEYS = ("conv", "conv_positions", "depthwise_conv", "gemm")  # small-output efficiency curves
MEDIUMS = ("switched", "shared")  # switched: each pair of devices has its own link; shared: one channel
