"""Cluster description: cluster.yaml plus device profiles -> a validated `ClusterModel`.

cluster.yaml::

    devices:
      - name: pi5-a
        profile: rpi5            # a profile under profiles/ by name, or a path to a profile file
        memory_mb: 4096          # optional: overrides the profile's memory
        address: tcp://192.168.1.20:7000   # optional
        threads: 1               # optional: the worker's onnxruntime intra-op threads (1..4096); the cost
                                 # model then uses the profile's figures for that count (Profile.figures)
        host: box                # optional: a `hosts:` entry, the machine this worker shares with others
      - name: pi4-a
        profile: rpi4
    network:                     # required with two or more devices; a one-device cluster may omit it
      bandwidth_mbps: 100        # every pair, unless a link says otherwise (megabits per second)
      latency_ms: 1              # one-way latency per transfer
      medium: switched           # switched (each pair has its own link) or shared (one channel); default switched
      links:                     # optional per-pair overrides; a missing figure falls back to the default
        - {a: pi5-a, b: pi4-a, bandwidth_mbps: 10, latency_ms: 5}
    hosts:                       # optional: machines that several devices' workers share
      box: {cores: 2, coordinator: true}   # its cores (1..4096); coordinator: `edgec run` runs on it too

Devices that name one host compute on its cores together: per request they cannot do more than its
cores' worth of work, which bounds throughput (cost/evaluate.py). Every host must be named by a device,
and at most one may hold the coordinator.

A device without `threads` runs its worker at the runtime's default, all of the device's cores, which
the profile's top-level figures describe.  With `threads`, the manifest's device entry records it and a
local worker that `edgec run` starts (without --threads) runs that many threads.

Device names are 1-64 characters from [A-Za-z0-9._-], starting with a letter or digit (they end up in
file names and manifests).  A profile reference without a path separator and without a .yaml/.yml
suffix is a name under the profiles folder; anything else is a path, relative to the cluster file's
folder.

Profile file (profiles/<name>.yaml)::

    name: rpi5
    description: Raspberry Pi 5, 4x Cortex-A76 @ 2.4 GHz, 8 GB LPDDR4X, onnxruntime CPU EP fp32
    memory_mb: 8192                # physical memory (> 0)
    usable_memory_fraction: 0.75   # share of memory the OS and other processes leave to edgec, in (0, 1]
    runtime_overhead_mb: 80        # onnxruntime + worker resident memory before any weights (>= 0)
    op_overhead_us: 30             # per-operator dispatch overhead (>= 0)
    gflops:                        # sustained onnxruntime fp32 throughput in GFLOP/s (FLOPs = 2 x MACs), all > 0
      conv: 30.0
      depthwise_conv: 6.0
      gemm: 25.0
      other: 3.0                   # any other compute-bound op
      conv_int8: 60.0              # optional: the int8 kernels of quantized models (also depthwise_conv_int8,
                                   #   gemm_int8); absent: priced at the float class's figure (conv, ...)
    memory_gbps: 8.0               # sustained GB/s for memory-bound ops (> 0)
    weight_gbps: 6.5               # optional: GB/s at which a layer's weights stream in on top of its compute
                                   #   (edgec profile: a batch-1 MatMul on 64 MB of weights); absent: not priced
    gemm_weight_gbps: 2.8          # optional: the same for a gemm layer of 2 rows or more (edgec profile: 12
                                   #   MatMuls of 16 rows, 48 MB of weights); absent: weight_gbps prices them
    shared_weight_gbps: 4.1        # optional: weight_gbps while every other core streams weights of its own
                                   #   (edgec profile: the same MatMul beside cores - 1 processes running it);
                                   #   a tile pays it for its weights while a device on the same host (`hosts:`)
                                   #   runs a tile of the same segment; absent: weight_gbps prices them
    layout_conversions: true       # optional (default false): onnxruntime runs convolutions in a blocked layout
                                   #   (NCHWc, x86), so a tile fragment converts at its ends and around its crops
                                   #   (edgec profile reads it; the cost model prices a conversion at memory_gbps)
    power_w: {idle: 2.7, busy: 7.0}   # watts; either may be null = unknown (`edgec profile` cannot measure power)
    radio_nj_per_byte: {tx: 4.0, rx: 4.0}   # optional: network interface energy per byte sent / received (nJ)
    mode: 2400MHz                  # optional: the name of the operating point the top-level figures describe
    modes:                         # optional: other operating points, each sourced; the energy planner picks one
      1500MHz: {power_w: {idle: 2.9, busy: 5.0}, sources: ["..."], gflops: {...}, memory_gbps: 7.0}
                                   #   (gflops, memory_gbps, weight_gbps, gemm_weight_gbps, op_overhead_us,
                                   #   op_ms_per_melem override the top level)
    sources: ["..."]               # where each figure comes from
    layers: {}                     # optional measured tables {<model sha256>: {<onnx node name>: ms}}
    op_ms_per_melem:               # optional: ms per million output elements beyond op_overhead_us (> 0)
      {LRN: 25.0, Softmax: 0.48, Resize:linear: 1.4}   # key: ONNX op type, or "<op type>:<mode>"
    efficiency:                    # optional: throughput of small outputs, as a fraction of gflops.conv / .gemm
      conv_positions: [[7, 0.63], [784, 1.0]]   # [output positions (height x width), fraction in (0, 4]]:
                                   #   prices conv layers, whole and in tiles; sizes increasing
      conv: [[7168, 0.62], [401408, 1.0]]   # [output elements, fraction]: conv tiles, without conv_positions
      depthwise_conv: [[8064, 0.44], [451584, 1.0]]   # of its largest point's rate; else the conv curve
      gemm: [[8192, 0.55], [524288, 1.0]]
    threads:                       # optional: the figures per onnxruntime intra-op thread count (keys 1..4096)
      1: {op_overhead_us: 5, gflops: {...}, memory_gbps: 9.0, op_ms_per_melem: {...}, efficiency: {...}, layers: {...}}
    runtime:                       # optional: the runtime's own costs, ms (0 to 10000; absent: 0)
      message_ms: 0.35             #   per device-to-device message (encode, CURVE, ZeroMQ, decode; both ends)
      message_ms_per_mb: 0.6       #   per 10^6 bytes of a message (host copies, encryption)
      request_ms: 1.8              #   per request: a model input in from the coordinator, an output out
      run_ms: 0.1                  #   per tile fragment run: a run in a plan beyond the same run alone and hot
      message_cpu_ms: 0.5          #   optional: the same three in CPU time, every thread of the runtime
      message_cpu_ms_per_mb: 0.9   #   (ZeroMQ's I/O threads encrypt beside the sender): what devices sharing
      request_cpu_ms: 2.2          #   a machine (`hosts:`) take of its cores; absent: the time figures
                                   #   (edgec profile measures the last two)
    measurement: {...}             # optional: how `edgec profile` measured (spread per timing, load); informational

Required keys: name, memory_mb, usable_memory_fraction, runtime_overhead_mb, op_overhead_us, gflops,
memory_gbps.  Optional: description (default ""), power_w (default both null), radio_nj_per_byte, mode,
weight_gbps, gemm_weight_gbps, shared_weight_gbps, layout_conversions, modes, sources (default none), layers,
op_ms_per_melem,
efficiency, threads, runtime, measurement (default empty).  A `layers` table is keyed by ONNX node name (not
layer name): the cost model sums the node times of each layer.  A `threads:` entry holds the top level's
figures (op_overhead_us, gflops, memory_gbps required; weight_gbps, gemm_weight_gbps, op_ms_per_melem,
efficiency, layers optional) with the same names and bounds; `edgec profile` writes the
largest count's at the top level, so a reader that knows no thread counts reads the all-cores figures.  `Profile.figures(n)` picks
a worker's.  `runtime:` is per device, not per thread count (no onnxruntime kernel runs in it); the cost
model charges each message the mean of its two ends' message figures and each request half its
request_ms on every device that takes a model input and half on every device that gives an output
(compiler/cost/network.py, evaluate.py), and each tile of a spatial stage its device's run_ms (tiles.py).

Numbers must be finite and at most 1e12; positive ones at least 1e-9 (the cost model divides by them
and sums them, so this keeps every prediction finite).  A cluster file may hold at most 1 MiB, a profile
16 MiB (its measured tables grow with the models), and neither may nest more than 32 levels deep.

Every problem raises `UserError(message, path=<the file at fault>)`: one line naming the key path.

Layout: yamlio.py reads the files (limits, duplicate keys); schema.py declares the keys, types and bounds
above as pydantic models; messages.py turns a schema error into one line (quote.py bounds the values it
quotes); profile.py and cluster.py check what relates values to each other and build the frozen `Profile`
and `ClusterModel` the compiler uses; keys.py names the fixed keys both sides read.
"""

from .cluster import ClusterModel, DeviceSpec, HostSpec, LinkSpec, load_cluster
from .profile import (NO_RUNTIME_FIGURES, PROFILES_DIR, Figures, Profile, RuntimeFigures, available_profiles, load_profile, profiles_dir,
                      validate_profile_dict)
from .format_names import EFFICIENCY_KEYS, GFLOPS_KEYS, INT8_GFLOPS_KEYS, MEDIUMS

__all__ = [
    "PROFILES_DIR",
    "GFLOPS_KEYS",
    "INT8_GFLOPS_KEYS",
    "EFFICIENCY_KEYS",
    "Figures",
    "RuntimeFigures",
    "NO_RUNTIME_FIGURES",
    "MEDIUMS",
    "Profile",
    "DeviceSpec",
    "LinkSpec",
    "HostSpec",
    "ClusterModel",
    "profiles_dir",
    "available_profiles",
    "load_profile",
    "load_cluster",
    "validate_profile_dict",
]
