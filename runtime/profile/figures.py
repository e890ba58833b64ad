"""measure_figures: the figures of one intra-op thread count (a profile's `threads:` entry), in three steps:
every benchmark model added to a Bench, the Bench times them all, the figures computed from the times."""

from __future__ import annotations

from typing import Callable

from .bench import Bench, Formula, threads_label
from .kernels import (GEMM_COLD_ROWS, bench_conv, bench_conv_int8, bench_depthwise, bench_gemm, bench_gemm_int8,
                      bench_gemm_weights, bench_memory, bench_other, bench_weights, dispatch_floor_us,
                      gemm_weight_figure, small_layer_overhead_us)
from .tables import conv_positions_curve, depthwise_curve, gemm_curve, op_table
from .timing import sig

__all__ = ["measure_figures"]


def measure_figures(b: Bench, more: dict[str, Callable[[Bench], Formula]] | None = None) -> dict:
    """The figures of one thread count, in the profile's format (a `threads:` entry), and those of `more`
    under their names: each adds its timings to the Bench after the others (shared.CoRunners.add_to) and
    returns its figure's formula."""
    floor = dispatch_floor_us(b)
    small = small_layer_overhead_us(b)
    conv, dw, gemm, other, mem = bench_conv(b), bench_depthwise(b), bench_gemm(b), bench_other(b), bench_memory(b)
    int8 = {"conv_int8": bench_conv_int8(b), "gemm_int8": bench_gemm_int8(b)}
    weights = bench_weights(b)
    gemm_weights = bench_gemm_weights(b)
    ops = op_table(b)
    curves = {"conv_positions": conv_positions_curve(b), "depthwise_conv": depthwise_curve(b), "gemm": gemm_curve(b)}
    extra = {name: add(b) for name, add in (more or {}).items()}
    n = b.threads
    b.say(f"  {threads_label(n)}: {len(b.jobs)} timings, {b.policy.rounds} interleaved rounds each")
    t = b.run()

    g = {"conv": conv(t), "depthwise_conv": dw(t), "gemm": gemm(t)}
    floor_us, small_us = floor(t), small(t, g["conv"])
    overhead_us = sig(max(floor_us, small_us, 0.1), 2)
    b.say(f"    per-operator overhead {overhead_us:.1f} us (dispatch floor {floor_us:.1f} us, small layers {small_us:.1f} us)")
    b.say(f"    conv {g['conv']:.1f}, depthwise conv {g['depthwise_conv']:.1f}, gemm {g['gemm']:.1f} GFLOP/s")
    g8 = {k: formula(t) for k, formula in int8.items()}
    b.say(f"    int8: conv {g8['conv_int8']:.1f}, gemm {g8['gemm_int8']:.1f} GFLOP/s (depthwise: the float figure)")
    g_convt, g_lstm = other(t)
    b.say(f"    other: ConvTranspose {g_convt:.1f} GFLOP/s, LSTM {g_lstm:.1f} GFLOP/s")
    memory = mem(t)
    weight_gbps = weights(t)
    gemm_weight_gbps = gemm_weight_figure(gemm_weights(t), weight_gbps)
    gemm_said = "not measured: its weights stayed in a cache" if gemm_weight_gbps is None else \
        f"{gemm_weight_gbps:.1f} GB/s"
    b.say(f"    memory (elementwise) {memory:.1f} GB/s, weights (batch-1 MatMul) {weight_gbps:.1f} GB/s, weights "
          f"(GEMM of {GEMM_COLD_ROWS} rows) {gemm_said}")
    table = ops(t, overhead_us)
    b.say("    ms per million output elements: " + ", ".join(f"{k} {v:g}" for k, v in table.items()))
    eff = {k: curve(t, g.get(k, 0.0), overhead_us) for k, curve in curves.items()}
    b.say("    tile efficiency: " + "; ".join(f"{k} " + " ".join(f"{e}:{f:g}" for e, f in pts) for k, pts in eff.items()))
    return {
        "op_overhead_us": overhead_us,
        "gflops": {"conv": sig(g["conv"]), "depthwise_conv": sig(g["depthwise_conv"]), "gemm": sig(g["gemm"]),
                   "other": sig(min(g_convt, g_lstm)), **{k: sig(v) for k, v in g8.items()}},
        "memory_gbps": sig(memory),
        "weight_gbps": sig(weight_gbps),
        **({} if gemm_weight_gbps is None else {"gemm_weight_gbps": sig(gemm_weight_gbps)}),
        "op_ms_per_melem": table,
        "efficiency": eff,
        **{name: sig(formula(t)) for name, formula in extra.items()},
    }
