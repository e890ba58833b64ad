"""`edgec profile`: measure this machine with onnxruntime micro-benchmarks and write a device profile.

The device's own room: it runs where the profile is taken, with the runtime's install (runtime/dist) plus onnx,
which builds the benchmark models (the `profile` extra); the compiler validates a profile when it loads one.
May import the runtime's base modules, its manifest and its coordinator (the runtime's own costs are measured
through them); nothing of the compiler, whose `edgec profile` runs this package and writes its validated YAML.

Modules: host.py (CPU, memory, description), quota.py (the CPU share a cgroup grants: `cpu_quota:`), load.py
(is the machine busy?), timing.py (repeat until the spread is small), bench.py (the Bench that times the
micro-benchmarks in interleaved rounds), kernels.py (the throughput figures and the per-operator overhead),
tables.py (the op table and the tile efficiency curves), figures.py (one thread count's figures), shared.py
(shared_weight_gbps' co-runners), drift.py (whether the memory rate held), nodes.py (per-node tables of a real
model), claims.py (the nodes the CPU provider runs beside an accelerator), fixed.py (the runtime's own costs per message and per request, through its sockets and coordinator: the
profile's `runtime:`), measure.py (`measure_host`), write.py (`write_profile_flow`: the profile as flow-style
YAML, written without a YAML library).

Every figure is measured at each requested intra-op thread count (default: 1 and all cores, since workers
that share a machine run 1 thread each) into `threads: {<count>: {...}}`; the top-level figures are the
largest count's, for readers that know no thread counts.  Per count:

  - gflops.conv            a 3x3 Conv, 128 -> 128 channels on 56x56 (0.92 GFLOP)
  - gflops.depthwise_conv  a 3x3 depthwise Conv, 192 channels on 28x28 (a map that stays in cache: on a
                           larger one the rate followed the other tenants' memory traffic; kernels.py), inside
                           a chain: 5 of them less one alone, per conv (alone, half its time was the layout
                           conversions at a model's ends, which a network pays once)
  - gflops.gemm            a 512x1024 by 1024x1024 MatMul (1.07 GFLOP)
  - gflops.other           the slower of a ConvTranspose (2x upsampling) and a batch-1 LSTM: ops without a
                           GEMM-shaped fast path
  - gflops.conv_int8       gflops.conv's Conv as onnxruntime's int8 kernel, QLinearConv (uint8 activations,
                           int8 weights: what a quantized model's conv units run)
  - gflops.gemm_int8       gflops.gemm's MatMul as QLinearMatMul; depthwise_conv_int8 is not measured (the
                           cost model prices it at gflops.depthwise_conv, as for any int8 figure a profile lacks)
  - memory_gbps            an elementwise Add of two 8M-float tensors: (2 inputs + 1 output) bytes / time
  - weight_gbps            a batch-1 MatMul, 1x4096 by 4096x4096: its 64 MB of weights (more than a cache
                           holds) / time.  The cost model adds a layer's weight bytes / weight_gbps to its
                           compute (cost/table.py): weights stream in from memory on every request, little
                           of it hidden behind the arithmetic, and every tile of a layer reads them all
  - gemm_weight_gbps       the same for a GEMM of several rows: a chain of 12 MatMuls 32x1024 by 1024x1024,
                           each its own weights (48 MB), less 12 runs of one alone (its weights hot): weight
                           bytes / the difference.  Slower per byte than weight_gbps (20-25 against 46 GB/s
                           here): a GEMM waits for its weight panels between its arithmetic.  The cost model
                           prices a gemm layer of two or more rows with it, a batch-1 one with weight_gbps
  - shared_weight_gbps     (top level, at 1 thread) weight_gbps's MatMul while every other core runs it too,
                           each in a process of its own with its own copy of the weights (shared.py): the rate
                           each of several devices on one machine streams its weights at when they compute
                           at once; weight_gbps times the ratio of its rounds to weight_gbps' rounds beside
                           them.  22-30 GB/s here, against weight_gbps' 44-45: the cost
                           model prices a tile's weights at it where another device of its host (cluster
                           `hosts:`) runs a tile of the same segment.  Not measured on one core
  - layout_conversions     (top level, a yes/no) whether onnxruntime runs convolutions here in its blocked
                           layout (NCHWc): read from the graph it optimises a 1x1 Conv -> Relu into
                           (ReorderInput / ReorderOutput nodes; x86 with AVX2, not ARM).  Then a tile fragment
                           converts a conv chain's activations at its ends and around a crop inside it, and the
                           cost model prices each conversion as a read and a write of every byte at memory_gbps
                           (cost/tiles.py Relayout: 0.11 ms per MB crossing a boundary at this machine's ~36
                           GB/s, where the timed difference of one- and two-fragment runs read 0.08-0.17 and
                           moved by up to a third between back-to-back profiles)
  - op_overhead_us         fixed cost per ONNX node, the larger of
                           (a) the dispatch floor: (200 tiny Relu nodes - 1) / 199, and
                           (b) small layers: a chain of 50 (3x3 Conv 16 ch on 7x7 -> Relu) pairs against
                           one pair, less the Conv FLOPs at the measured conv rate, per original node (98):
                           dispatch + thread-pool sync + small-layer inefficiency
  - op_ms_per_melem        operators the roofline misprices (LRN costs 100x its bytes at memory speed):
                           milliseconds per million output elements beyond op_overhead_us, for LRN,
                           Softmax, LayerNormalization, LayerNormalization:skip (after a residual Add,
                           which onnxruntime fuses with it), Erf, Resize (nearest), Resize:linear and Clip.  Per
                           output element because their work is a fixed amount per output element (a size-5
                           window, a row's exp and sum, a row's mean and variance, an interpolation, a
                           clamp), so overhead + elements x price is the whole prediction, with no FLOP
                           count to guess.  Clip (ReLU6) is the one that follows a Conv: onnxruntime's
                           NCHWc kernels apply only Relu in place, so a Clip is an extra pass over the
                           Conv's output (~0.1 ms per million elements at 1 thread, fused or not), priced on
                           top of the Conv's roofline (cost/table.py); a profile without it prices Clip as
                           before, free in a Conv's layer and at memory speed alone
  - efficiency             how throughput falls for small outputs: `conv_positions`, [output positions,
                           fraction] points of a 3x3 Conv (256 ch, 784 down to 7 output positions: tiles of
                           28-, 14- and 7-wide maps) against its 784-position rate, which price a conv layer
                           of fewer positions, whole and in tiles; [output elements, fraction] points of a
                           depthwise 3x3 Conv (144 ch, 56 wide, 56..1 rows) against its own 56-row rate, and
                           of MatMuls with 512..8 rows against gflops.gemm;
                           fraction = the FLOPs' time at the large benchmark's rate / (time - op_overhead_us)

Each timing is taken in 4 rounds, interleaved with the other timings' so that they are seconds apart
(bench.py), each round in a fresh session whose inputs and outputs are bound to buffers allocated once
(the kernel's time, without the Python binding's per-run output allocation and copy, whose cost depends
on the process's allocator state), warmed up for at least 20 ms, then repeated until its last samples
agree (timing.py: (p90 - p10) / median at most 10% over 7 samples, at most 0.4 s a round, 1.6 s a
timing).  The figure is the fastest stable round's median: other load only adds time, and a process-wide
slow moment (another process sharing our core for a whole round, a cold start) spoils a round, not the
figure.  It counts as stable when another round agrees with it within 10%, since the spread within one
round understates the difference between two profiles.  The machine's load is checked before and during
(load.py).  What was seen goes to `measurement:` (per timing: runs over all rounds, median, spread =
the larger of the round's window spread and the distance to the nearest other round, stable, load
average and other processes' CPUs over its rounds), and a busy machine or an unstable timing is a
warning, or with strict an error.

Memory comes from /proc/meminfo (MemTotal; usable_memory_fraction = MemAvailable / MemTotal at
profiling time, rounded down to 0.05), or os.sysconf where there is no /proc.  runtime_overhead_mb is
the resident set of this Python process (python + numpy + onnx + onnxruntime with one small session)
before the large benchmarks run.  Power cannot be measured here: pass power_idle_w / power_busy_w, or
they are written as null (= unknown).

With a model: `layers: {<sha256 of the model file>: {<onnx node name>: ms}}` per thread count (and at the
top level, the largest count's), the median over a few runs of each node's kernel time from
onnxruntime's profiler (SessionOptions.enable_profiling), with the default optimisation level
(ORT_ENABLE_ALL), as the runtime would run it.  onnxruntime fuses and renames nodes (Conv+Relu -> one
FusedConv, NCHWc layout nodes named <output tensor>_nchwc, Reorder nodes); each optimised node's time is
given to the original node it came from (same name; the name before the first '/'; the producer of the
tensor in "<tensor>_nchwc" or of its output, walked back to the operator of the same kind that starts a
fusion, e.g. the Conv of a fused Conv+Relu; else the first mappable node downstream).  Every node of the
original graph is listed: nodes that were folded, eliminated or fused into another get 0.0, so summing
node times per layer gives the layer's time.  Nodes without a name are keyed "<op_type>_<index in
graph.node>".

With `--providers` naming an accelerator, the profile also carries `cpu:`, the same figures (and `threads:`, and
the model's tables) measured first with the CPU provider alone; with a model, `layers:` holds its per-node times on
the providers (ORT_ENABLE_BASIC: each CPU node its own time, each accelerator subgraph's time shared among the
nodes it took in proportion to their CPU times) and `cpu_nodes: {<sha256>: [<node>, ...]}` the nodes the CPU
provider ran beside the accelerator (claims.py).
"""
