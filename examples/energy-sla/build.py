"""The least energy per request within a latency SLA: compile for latency, then for energy under an SLA of
three times that latency, and compare; run the energy plan verified.

    python examples/energy-sla/build.py [OUTDIR]     # from the checkout, after `python -m edgec.models build`
"""

import sys
from pathlib import Path

import edgec
from edgec import models

HERE = Path(__file__).resolve().parent
out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/energy-sla")
model = models.ensure("squeezenet")

fast = edgec.compile(model, HERE / "cluster.yaml", out / "latency")
sla = 3 * fast["predicted_latency_ms"]
frugal = edgec.compile(model, HERE / "cluster.yaml", out / "energy", objective="energy", sla_ms=sla)
modes = {d["name"]: d["mode"] for d in frugal["devices"] if d["mode"]}
print(f"latency plan: {fast['predicted_latency_ms']:.1f} ms, {fast['predicted_energy_mj']:.1f} mJ per request")
print(f"energy plan within {sla:.1f} ms: {frugal['predicted_latency_ms']:.1f} ms, "
      f"{frugal['predicted_energy_mj']:.1f} mJ per request, power modes {modes}")
assert frugal["predicted_energy_mj"] <= fast["predicted_energy_mj"] and frugal["predicted_latency_ms"] <= sla

report = edgec.run(out / "energy", random_inputs=True, verify=True, repeat=3)
assert report["verify"]["passed"], report["verify"]
print("energy plan verified")
