"""The cost model: what a layer, a tile and a message cost on the cluster, and what a plan costs.

- table.py: `CostTable`, every layer's time on every device (measured tables, or the roofline model with
  the op table), from the profile's figures for the thread count the device's worker runs.
- claims.py: on a device that runs an accelerator, the layers whose nodes the CPU provider runs priced at the
  profile's `cpu:` figures (table.py calls it last).
- network.py: `NetworkModel`, the links between devices, priced by the runtime's link model
  (runtime/linkmodel.py: the one Mbps -> bytes/ms conversion and message time).
- tiles.py, tile_steps.py, stage_timeline.py: the tile cost model of spatial stages (a tile's compute with the
  figures' tile efficiency; the spatial search's step score; a stage's timeline with its halo,
  scatter and gather transfers).
- order.py: the send order of each spatial exchange that gives the shortest predicted stage (never worse
  than tile order); evaluate records it in the Prediction and the emitter writes the steps in it.
- memory.py: `device_memory_bytes(plan, graph)`, what each device must hold.
- generate.py: `GenerateCost`, a generative build's prefill table, caches at the maximum context and token
  transfer (the table itself prices a decode step); evaluate turns a step into per-token figures.
- energy.py: `request_energy`, one request's energy (busy and idle power over the span, radio per byte);
  evaluate attaches it to every Prediction (`Prediction.energy`, `energy_mj`), simulate to every replay.
- evaluate.py: `evaluate(plan, graph, cost) -> Prediction`.
- simulate.py: `simulate_manifest`, the replay of a manifest's schedule (the runtime's parsed Manifest)
  with its energy.

It names plans through compiler.plan_types and imports nothing from compiler.plan: the planners build
on the cost model, never the other way round.
"""

from .generate import TOKEN_BYTES, GenerateCost, GenerativeCostTable, generate_cost, generative_table
from .memory import device_memory_bytes
from .evaluate import Event, Prediction, Transfer, crossing_tensors, evaluate
from .simulate import simulate_manifest
from .network import NetworkModel
from .table import CostTable, build_cost_table, int8_fallbacks, layer_ms

__all__ = ["CostTable", "build_cost_table", "int8_fallbacks", "layer_ms", "NetworkModel", "Prediction",
           "Transfer", "Event", "crossing_tensors", "evaluate", "simulate_manifest",
           "device_memory_bytes", "GenerateCost", "generate_cost", "TOKEN_BYTES",
           "GenerativeCostTable", "generative_table"]
