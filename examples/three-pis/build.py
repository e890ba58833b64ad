"""Compile SqueezeNet for three Raspberry Pis, for throughput, and run it verified against onnxruntime.

    python examples/three-pis/build.py [OUTDIR]      # from the checkout, after `python -m edgec.models build`

The devices run as local worker processes (cluster.yaml gives them no addresses)."""

import sys
from pathlib import Path

import edgec
from edgec import models

HERE = Path(__file__).resolve().parent
out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/three-pis")

summary = edgec.compile(models.ensure("squeezenet"), HERE / "cluster.yaml", out, objective="throughput")
print(f"{summary['strategy']}: {len(summary['stages'])} stage(s), predicted "
      f"{summary['predicted_throughput_ips']:.1f} requests/s, {summary['predicted_latency_ms']:.1f} ms each")

report = edgec.run(out, random_inputs=True, verify=True, repeat=5)
assert report["verify"]["passed"], report["verify"]
print(f"verified; median latency {report['latency_ms']:.2f} ms")
