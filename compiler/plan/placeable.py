"""Why no plan at all can fit a cluster's memory, found before any search (`unplaceable`).

Every plan places each layer in a stage, and every device of a stage (its own device, or one computing its
tiles) holds the stage's weights and its peak live activations whole (cost/memory.py
`device_memory_bytes`): a stage of one layer is the smallest, so a layer whose weights plus the
activations live while it runs exceed the largest device fits no plan. The host sends and receives the
model's inputs and outputs whole, so one larger than every device fits no plan either. Both are read off
the layer graph in one pass, so a model of 120 GB activations is refused in milliseconds instead of after a
search over its 100,000 rows.
"""

from __future__ import annotations

from ..cost import CostTable
from ..graph import LayerGraph
from ..units import MiB

__all__ = ["unplaceable"]


def unplaceable(graph: LayerGraph, cost: CostTable) -> str | None:
    """The reason no plan of any planner fits the devices' memory, in one clause naming the tensor or layer
    and the largest device; None when every layer fits some device on its own (plans may still not fit:
    the planners say why)."""
    largest = max(cost.cluster.devices, key=lambda d: d.usable_bytes)
    most = f"(the most: {largest.name}, {largest.usable_bytes / MiB:,.0f} MB usable)"
    for role, names in (("input", graph.inputs), ("output", graph.outputs)):
        for t in names:
            nbytes = graph.tensors[t].nbytes
            if nbytes > largest.usable_bytes:
                return (f"model {role} {t!r} takes {nbytes / MiB:,.0f} MB, more than any device can hold {most}; "
                        "every plan holds the model's inputs and outputs whole on one device")
    footprint = graph.footprint_bytes
    need = [layer.param_bytes + footprint[i] for i, layer in enumerate(graph.layers)]
    worst = max(range(len(need)), key=need.__getitem__, default=None)
    if worst is not None and need[worst] > largest.usable_bytes:
        layer = graph.layers[worst]
        return (f"layer {layer.name!r} alone needs {need[worst] / MiB:,.0f} MB (weights {layer.param_bytes / MiB:,.0f} MB"
                f" + activations live while it runs {footprint[worst] / MiB:,.0f} MB), more than any device can hold "
                f"{most}; every device running a layer, or a tile of it, holds its weights and those activations whole")
    return None
