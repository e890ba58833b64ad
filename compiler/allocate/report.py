"""`edgec allocate`'s human-readable summary of an allocation.json object."""

from __future__ import annotations

from ..text import fit as fit_width

__all__ = ["format_allocation"]


def format_allocation(a: dict, outdir: str) -> str:
    gap = "" if a["status"] == "OPTIMAL" else f", gap {a['gap']:.2%}"
    lines = [f"allocation: {a['status']}{gap} ({a['objective']} objective), CP-SAT {a['solve_seconds'] * 1000:.0f} ms, "
             f"planning {a['planning_seconds']:.2f} s"]
    for name, s in a["services"].items():
        fit = s["latency_fit"]
        err = f", L(n) fit error {fit['mean_error']:.1%}" if fit else ""
        lines.append(f"  {name}: {s['strategy']} on {', '.join(s['devices'])}: {s['predicted_latency_ms']:.1f} ms "
                     f"(sla {s['sla_ms']:g} ms), {s['predicted_throughput_ips']:.2f}/s, utility {s['utility']:.3f}"
                     f"{err}")
    for name, d in ((a.get("share") or {}).get("devices") or {}).items():
        if len(d["services"]) > 1:
            lines.append(f"  {name} shared by {', '.join(d['services'])}: {d['memory_mb']:.1f} of {d['usable_mb']:.0f} MB, "
                         f"{d['held_ms_per_s']:.1f} of {d['budget_ms_per_s']:g} ms per s")
    for d in a["dropped"]:
        lines.append(f"  dropped {d['name']}: {d['reason']}")
    lines.append(f"builds: {outdir}/<service>/manifest.json; run them all with `edgec run-all {outdir}`")
    return fit_width("\n".join(lines))
