#!/usr/bin/env bash
# Allocate two services on one cluster and run both at once, each on its own devices.
#   bash examples/two-services/build.sh [OUTDIR]     (from the checkout, after `python -m edgec.models build`)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-build/two-services}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$here/services.yaml" "$work/"
for m in squeezenet tinychain; do
  cp "$(python -c "from edgec import models; print(models.ensure('$m'))")" "$work/$m.onnx"
done
edgec allocate "$work/services.yaml" --devices "$here/cluster.yaml" -o "$out"
edgec run-all "$out" --repeat 5 --verify
