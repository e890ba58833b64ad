"""What each device must hold to run a plan: the one memory count behind the planners' check and the report."""

from __future__ import annotations

from ..graph import LayerGraph
from ..plan_types import Plan
from .generate import GenerateCost
from .tiles import group_param_bytes

__all__ = ["device_memory_bytes"]


def device_memory_bytes(plan: Plan, graph: LayerGraph, generate: GenerateCost | None = None) -> dict[str, int]:
    """Bytes each device of the plan needs: for every stage it takes part in, as the stage's device or
    computing its tiles, the weights of the stage's layers plus their peak live activations; in a
    generative build (`generate`, the cost table's), plus the caches of its layers at the maximum context."""
    need: dict[str, int] = {}
    for st in plan.stages:
        state = 0 if generate is None else generate.stage_state_bytes(st.lo, st.hi)
        for d in {*(st.spatial.devices if st.spatial else ()), st.device}:
            need[d] = (need.get(d, 0) + group_param_bytes(graph, st.lo, st.hi) + graph.peak_activation_bytes(st.lo, st.hi)
                       + state)
    return need
