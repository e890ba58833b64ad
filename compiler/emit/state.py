"""A generative build's manifest (format version 2): the state each fragment keeps from step to step and the
top-level `generate` block (runtime/manifest/load.py documents both; runtime/manifest/parse.py checks them).

Emitted from the manifest of one decode step: the cache inputs and outputs leave the model's inputs and
outputs and the host's recvs and sends (they never leave their device), and each fragment that reads a cache
input lists it, its output and its empty initial value under `state`.
"""

from __future__ import annotations

from edgec.runtime.manifest.types import GENERATE_VERSION, HOST

from ..errors import UserError
from ..ingest.phases import PROBE, Phases

__all__ = ["generative_manifest", "fragment_shapes"]


def fragment_shapes(phases: Phases) -> dict[str, tuple[int | str, ...]]:
    """Every tensor's shape for a fragment's inputs and outputs: a dimension that changes from step to step
    is dynamic (a symbol of its own), the others fixed at the decode step's size."""
    graph = phases.decode.graph
    return {name: tuple(f"{name}:{i}" if phases.varying[name][i] else d for i, d in enumerate(t.shape))
            for name, t in graph.tensors.items()}


def _role(phases: Phases, name: str, i: int) -> int | str:
    """What dimension i of tensor `name` is, from its size in the three pinned phases."""
    sizes = tuple(g.graph.tensors[name].shape[i] for g in (phases.prefill, phases.decode))
    p, k = phases.options.prompt_len, phases.priced_past
    for role, want in (("seq", (p, 1)), ("past", (0, k)), ("total", (p, k + 1))):
        if sizes == want:
            return role
    if not phases.varying[name][i]:
        return sizes[1]
    raise UserError(f"--generate: dimension {i} of {name!r} changes from step to step but is neither the new "
                    f"tokens, the past nor their total (sizes {sizes} at seq, past = {p}, 0 and 1, {k}; "
                    f"probe {PROBE})", str(phases.decode.path))


def _feeds(phases: Phases, host_inputs: list[str]) -> dict[str, str]:
    """How the runtime makes each input the host feeds: the token ids, the positions or an attention mask."""
    out = {}
    for name in host_inputs:
        roles = [_role(phases, name, i) for i in range(len(phases.decode.graph.tensors[name].shape))]
        if name == phases.roles.token_input:
            out[name] = "token"
        elif "position" in name.lower() and "seq" in roles:
            out[name] = "positions"
        elif "mask" in name.lower() and "total" in roles:
            out[name] = "mask"
        else:
            raise UserError(f"--generate: input {name!r} is neither the token ids, the positions nor an "
                            "attention mask: the runtime would not know what to feed it", str(phases.decode.path))
    return out


def generative_manifest(manifest: dict, phases: Phases) -> dict:
    """`manifest` (one decode step's, as assemble_manifest wrote it) as a generative build's."""
    pairs = {p.input: p for p in phases.pairs}
    outs = {p.output for p in phases.pairs}
    m = phases.options.max_context
    host_inputs = [e["name"] for e in manifest["inputs"] if e["name"] not in pairs]
    logits = [e for e in manifest["outputs"] if e["name"] not in outs]
    if len(logits) != 1:
        raise UserError(f"--generate: expected one output besides the caches (the logits), got "
                        f"{', '.join(e['name'] for e in logits) or 'none'}", str(phases.decode.path))
    out = dict(manifest, version=GENERATE_VERSION)
    out["inputs"] = [e for e in manifest["inputs"] if e["name"] not in pairs]
    out["outputs"] = logits
    out["steps"] = {dev: [s for s in steps if not _state_hop(s, pairs, outs)] for dev, steps in manifest["steps"].items()}
    frags = []
    for f in manifest["fragments"]:
        state = [{"input": p.input, "output": p.output, "dtype": p.dtype, "axis": p.axis, "max_length": m,
                  "shape": list(phases.roles.pin(p.dims, 1, 0))}
                 for p in (pairs[t] for t in f["inputs"] if t in pairs)]
        frags.append(dict(f, state=state) if state else f)
    out["fragments"] = frags
    producer = next(f["id"] for f in manifest["fragments"] if logits[0]["name"] in f["outputs"])
    names = [*host_inputs, logits[0]["name"], *pairs, *outs]
    out["generate"] = {
        "prompt_len": phases.options.prompt_len, "max_context": m, "priced_past": phases.priced_past,
        "phases": {"prefill": {"seq": phases.options.prompt_len, "past": 0}, "decode": {"seq": 1, "past": phases.priced_past}},
        "token": {"input": phases.roles.token_input, "dtype": str(phases.decode.graph.tensors[phases.roles.token_input].dtype)},
        "logits": {"output": logits[0]["name"], "fragment": producer},
        "feeds": _feeds(phases, host_inputs),
        "shapes": {n: [_role(phases, n, i) for i in range(len(phases.decode.graph.tensors[n].shape))] for n in names},
    }
    return out


def _state_hop(step: dict, pairs: dict, outs: set) -> bool:
    """A host recv of a cache input or a host send of a cache output: the cache stays on its device."""
    return ((step.get("op") == "recv" and step.get("from") == HOST and step.get("tensor") in pairs)
            or (step.get("op") == "send" and step.get("to") == HOST and step.get("tensor") in outs))
