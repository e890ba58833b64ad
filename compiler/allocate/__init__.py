"""`edgec allocate`: several models on one cluster (HiTDL's SLA-aware multiple-choice knapsack).

In processing order:

- services.py: SERVICES.yaml -> `Service`s (the cluster file's schema mechanism, one-line errors).
- classes.py: interchangeable devices grouped into classes; sub-clusters, cost tables restricted to them,
  plans moved between devices of a class.
- candidates.py: per service, the shares of the cluster worth a plan, planned with edgec's planners (auto,
  bounded by the SLA); the SLA-feasible options with their utility.
- planning.py: every service's model read once, alike services planned once, services planned side by
  side in forked processes (--jobs).
- fit.py: HiTDL's L(n) = c0 + c1/n + c2/n^2 per service, and its error against the planner.
- solve.py: one option per service by CP-SAT (weighted utility, or max-min fairness first), devices
  exclusive or (--share) shared within their memory and time budgets, and the brute-force reference.
- output.py: OUTDIR/<service>/ builds and allocation.json, swapped into place together.
- allocate.py: `allocate()`, the steps above in order.
"""

from .allocate import allocate

__all__ = ["allocate"]
