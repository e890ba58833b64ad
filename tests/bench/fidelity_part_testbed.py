"""bench_fidelity's part testbed: part two's cases on a tests/netbed.py testbed, one per bandwidth
(fidelity_testbed.py deploys the cluster on it).

Part testbed (issue 11, item 4's testbed cases; needs root and iproute2): part two's cases over a shaped network.
For each of --testbed-mbps (default 100,1000), in turn, a tests/netbed.py testbed is built as bench_distributed
builds it: an unshaped coordinator host and two device hosts, dev-a and dev-b, on a switched medium whose links
are shaped to that bandwidth (tbf's bucket 0.5 ms at up to 100 Mbps, 4 ms above: fidelity_testbed.burst_ms); `edgec keygen`, an `edgec worker --threads 1` on each device host and `edgec run`
from the coordinator host (tests/e2e/netbed_cluster.py).  The cluster files give each device the host's profile,
its testbed address, the bandwidth with latency 0 (the testbed adds none) and `threads: 1`, and say that the
workers and the coordinator share this machine's cores (`hosts:`).  For each of --two-models: the single device
is a one-device cluster on dev-a of the same testbed; the plans, rounds, medians, speed-ups, ratio and target
are part two's, every run `edgec run --warmup W --repeat N --random-inputs --verify --json` (latency with
--inflight 1, throughput at the default --inflight).  A run that fails or does not verify makes its model an
error row at that bandwidth, counted as a case not met.  Each plan's row shows its transfers' median measured /
predicted over the shaped link (`edgec run --report`), so a link-model error is visible.  A table and a summary
line (k of n cases within 10%) per bandwidth, and one over all.  The testbed is removed after each bandwidth,
whatever failed.  Where a testbed cannot be built (tests.netbed.unavailable_reason()), the part says why and is
reported as not run; the bench still exits 0.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from benchlib import brief
from fidelity_common import loadavg, log
from fidelity_part_two import SPEEDUP_TOLERANCE, bench_two_model, two_table
from fidelity_testbed import COORDINATOR, DEVICES, THREADS, TestbedCluster, burst_ms  # puts tests.* on sys.path
from tests import netbed
from tests.e2e.netbed_cluster import ClusterError
from tests.netbed import TestbedError


def bench_testbed(names: list[str], folder: Path, profile: Path, bandwidths: list[float], repeat: int,
                  rounds: int, warmup: int) -> dict:
    """Part two's cases on a tests/netbed.py testbed at each bandwidth in turn; not run (and said why) where a
    testbed cannot be built."""
    reason = netbed.unavailable_reason("switched")
    if reason is not None:
        log(f"testbed: not run: {reason}")
        return {"ran": False, "reason": reason}
    return {"ran": True, "medium": "switched", "rounds": rounds,
            "bandwidths": [bench_testbed_bandwidth(names, folder, profile, mbps, repeat, rounds, warmup)
                           for mbps in bandwidths]}


def bench_testbed_bandwidth(names: list[str], folder: Path, profile: Path, mbps: float, repeat: int, rounds: int,
                            warmup: int) -> dict:
    """Every model at one bandwidth, on a testbed of its own.  A model whose run fails (a failed verify
    included) is an error row and the others go on; a cluster that cannot be set up is an error row for
    every model.  The testbed is removed whatever happens."""
    out: dict = {"mbps": mbps, "rows": [], "unmeasured": [], "errors": []}
    t0 = time.perf_counter()
    log(f"testbed at {mbps:g} Mbps switched: {COORDINATOR} (unshaped) and {'+'.join(DEVICES)}, a worker at "
        f"{THREADS} thread each (load average {loadavg()})")
    work = Path(tempfile.mkdtemp(prefix=f"testbed-{mbps:g}mbps-", dir=folder))  # keygen wants fresh folders
    try:
        with TestbedCluster(mbps, profile, work, warmup) as tc:
            for name in names:
                try:
                    rows, unmeasured = bench_two_model(name, work, tc.one, tc.two, repeat, rounds, run=tc.run)
                except ClusterError as exc:
                    log(f"{name} at {mbps:g} Mbps: FAILED: {exc}")
                    out["errors"].append({"model": name, "error": str(exc), "worker_logs": tc.worker_logs()})
                    continue
                out["rows"] += [dict(r, mbps=mbps) for r in rows]
                out["unmeasured"] += unmeasured
        if any(code != 0 for code in tc.stop_codes.values()):
            log(f"warning: workers did not stop cleanly on SIGTERM: {tc.stop_codes}")
    except (ClusterError, TestbedError) as exc:
        log(f"testbed at {mbps:g} Mbps: FAILED to set up: {exc}")
        out["errors"] = [{"model": name, "error": f"testbed setup: {exc}"} for name in names]
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def testbed_counts(rows: list[dict], errors: list[dict]) -> tuple[int, int]:
    """Cases within the target, of all cases: a model that failed counts as one case not met (its plans'
    count is unknown), never as met."""
    return sum(r["met"] for r in rows), len(rows) + len(errors)


def testbed_table(bw: dict) -> str:
    """Part two's table with the bandwidth, and a row for each model that failed (its error's first and last
    lines; --json keeps the whole text)."""
    table = two_table(bw["rows"], mbps=True)
    columns = table.splitlines()[0].count(" | ") + 1
    for e in bw["errors"]:
        cells = [e["model"], f"{bw['mbps']:g}", "FAILED: " + brief(e["error"]).replace("|", "/")]
        table += "\n| " + " | ".join(cells + [""] * (columns - len(cells))) + " |"
    return table


def testbed_summary(bw: dict) -> str:
    """One bandwidth's summary line: k of n cases within the target, the median and worst |ratio - 1|."""
    met, n = testbed_counts(bw["rows"], bw["errors"])
    line = (f"Summary at {bw['mbps']:g} Mbps: measured speed-up within {SPEEDUP_TOLERANCE:.0%} of predicted in {met} "
            f"of {n} cases" + (f" ({len(bw['errors'])} failed)" if bw["errors"] else ""))
    if bw["rows"]:
        worst = max(bw["rows"], key=lambda r: abs(r["ratio"] - 1))
        line += (f"; median |ratio - 1| {statistics.median(abs(r['ratio'] - 1) for r in bw['rows']):.1%}, worst "
                 f"{worst['model']} {worst['plan']} {worst['metric']} {worst['ratio']:.2f}")
    return line + "."


def testbed_bandwidth_text(bw: dict) -> str:
    per_model = {r["model"]: r["loadavg_rounds"] for r in bw["rows"]}
    rounds = "; ".join(f"{m} {v}" for m, v in per_model.items())
    bucket_ms = burst_ms(bw["mbps"])
    burst = netbed.tbf_params(bw["mbps"], burst_ms=bucket_ms).burst
    lines = [f"### {bw['mbps']:g} Mbps ({bw['seconds']:.0f} s)\n",
             f"Load average at the start of each round: {rounds or 'n/a'}\n",
             f"The testbed's tbf lets a burst of {burst:,} bytes ({bucket_ms:g} ms at the wire rate, "
             "fidelity_testbed.burst_ms) through an idle link at once: a message that small crosses faster than the "
             "bytes / bandwidth the planner prices, which shows as transfers measured below their prediction.\n",
             testbed_table(bw) + "\n", testbed_summary(bw)]
    lines += [f"- {u['model']} {u['plan']}: the planner keeps it on {'+'.join(u['devices'])} (predicted "
              f"{u['predicted_latency_ms']:.1f} ms, speed-up 1.00x); not measured." for u in bw["unmeasured"]]
    return "\n".join(lines)


def testbed_text(t: dict) -> str:
    if not t["ran"]:
        return f"Not run: {t['reason']}"
    counts = [testbed_counts(bw["rows"], bw["errors"]) for bw in t["bandwidths"]]
    speeds = ", ".join(f"{bw['mbps']:g}" for bw in t["bandwidths"])
    total = (f"Summary over {speeds} Mbps: measured speed-up within {SPEEDUP_TOLERANCE:.0%} of predicted in "
             f"{sum(c[0] for c in counts)} of {sum(c[1] for c in counts)} cases.")
    return "\n\n".join([*map(testbed_bandwidth_text, t["bandwidths"]), total])
