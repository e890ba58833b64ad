"""Multi-tensor pipeline cuts end to end: tinytransformer's stages meet where the hidden state and the
attention mask are both live; the build runs through the local runtime and reproduces onnxruntime
(`edgec run --verify`), `edgec simulate` replays it as predicted, and `edgec inspect` lists every tensor
each cut carries.

The mask is read by every encoder's attention, not by the feed-forward blocks, so with 4 stages one
stage holds only a feed-forward block: it either passes the mask on (forwarding) or is skipped by a
message straight from the mask's producer (direct), whichever the cost model prices lower - direct on a
uniform network, forwarding when only neighbouring devices have fast links."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from edgec import models

MASK = "reshape_0"  # tinytransformer's attention mask: 64 bytes, beside 4096-byte hidden states
FAST = {"bandwidth_mbps": 1000, "latency_ms": 0.1}


def edgec(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "edgec.compiler", *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"edgec {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc.stdout


def build(tmp: Path, network: dict) -> tuple[Path, dict]:
    """tinytransformer on 4 rpi4, planned for throughput (it cuts inside encoders), compiled and verified."""
    cluster = tmp / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"devices": [{"name": f"pi{i}", "profile": "rpi4"} for i in range(4)],
                                       "network": network}))
    out = tmp / "out"
    edgec("compile", str(models.ensure("tinytransformer")), "--devices", str(cluster), "-o", str(out),
          "--strategy", "pipeline", "--objective", "throughput")
    run = json.loads(edgec("run", str(out / "manifest.json"), "--random-inputs", "--seed", "3", "--verify", "--json"))
    assert run["verify"]["passed"], run["verify"]
    manifest = json.loads((out / "manifest.json").read_text())
    sim = json.loads(edgec("simulate", str(out / "manifest.json"), "--json"))
    assert sim["latency_ms"] == pytest.approx(manifest["predicted"]["latency_ms"], abs=1e-3)
    assert sim["bytes_transferred"] == manifest["predicted"]["bytes_transferred"]
    return out / "manifest.json", manifest


@pytest.fixture(scope="module")
def forwarded(tmp_path_factory) -> tuple[Path, dict]:
    """Slow links (1 Mbps, 20 ms) except between pi0-pi1, pi1-pi2 and pi2-pi3."""
    chain = [{"a": f"pi{i}", "b": f"pi{i + 1}", **FAST} for i in range(3)]
    return build(tmp_path_factory.mktemp("fwd"), {"bandwidth_mbps": 1, "latency_ms": 20, "medium": "switched",
                                                  "links": chain})


def several(manifest: dict) -> dict[tuple[str, str], set[str]]:
    """(src, dst) -> tensors, for the device pairs that carry more than one tensor per input."""
    pairs: dict[tuple[str, str], set[str]] = {}
    for t in manifest["transfers"]:
        pairs.setdefault((t["src"], t["dst"]), set()).add(t["tensor"])
    return {k: v for k, v in pairs.items() if len(v) > 1}


def passers(manifest: dict) -> list[str]:
    """Devices that receive the mask and send it on, with no fragment there reading it."""
    reads = {f["device"] for f in manifest["fragments"] if MASK in f["inputs"]}
    return [dev for dev, steps in manifest["steps"].items() if dev not in reads
            and any(s["op"] == "recv" and s["tensor"] == MASK for s in steps)
            and any(s["op"] == "send" and s["tensor"] == MASK for s in steps)]


def test_mask_is_forwarded_where_only_neighbours_have_fast_links(forwarded):
    _, manifest = forwarded
    assert len(manifest["plan"]["stages"]) == 4
    assert passers(manifest), manifest["steps"]
    assert all(MASK in ts for ts in several(manifest).values()) and len(several(manifest)) >= 2


def test_mask_goes_direct_on_a_uniform_network(tmp_path):
    _, manifest = build(tmp_path, {**FAST, "medium": "switched"})
    assert len(manifest["plan"]["stages"]) == 4
    assert not passers(manifest)
    producer = next(f["device"] for f in manifest["fragments"] if MASK in f["outputs"])
    skips = [t for t in manifest["transfers"] if t["tensor"] == MASK and t["src"] == producer
             and (t["src"], t["dst"]) not in several(manifest)]
    assert skips, manifest["transfers"]  # a message of the mask alone, past the stage that does not read it


def test_inspect_lists_every_tensor_of_a_multi_tensor_cut(forwarded):
    path, manifest = forwarded
    listed = json.loads(edgec("inspect", str(path), "--json"))["exchanges"]
    rows = [line.split() for line in edgec("inspect", str(path)).splitlines()]
    for (src, dst), tensors in several(manifest).items():
        assert {e["tensor"] for e in listed if (e["src"], e["dst"]) == (src, dst)} == tensors
        for t in tensors:
            kind = "forward" if src in passers(manifest) and t == MASK else "transfer"
            assert [kind, src, dst, t] in [r[:4] for r in rows], (src, dst, t)
