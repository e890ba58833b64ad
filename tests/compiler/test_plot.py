"""`edgec simulate MANIFEST --plot FILE.svg|png [--trace RUN.json]`: the Gantt chart of the simulated schedule,
overlaid with the median request of a real `edgec run --trace`, and its one-line errors (matplotlib missing, a
bad suffix or folder, a trace that is unreadable or of another build)."""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

import edgec
from edgec.compiler.cli import cli
from edgec.compiler.plot import Bar, latency_label, plot_schedule, schedule_bars

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ["EDGEC_MODELS_DIR"])
CLUSTERS = REPO / "tests" / "e2e" / "clusters"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    """tinychain as a pipeline pi5-a -> pi5-b (switched), tinyconv spatial on it too and on a shared medium,
    and a trace of a real run of the pipeline."""
    root = tmp_path_factory.mktemp("plot")
    out = {"pipeline": root / "pipeline", "spatial": root / "spatial", "shared": root / "shared"}
    edgec.compile(MODELS / "tinychain.onnx", CLUSTERS / "four.yaml", out["pipeline"], strategy="pipeline",
                  objective="throughput")
    edgec.compile(MODELS / "tinyconv.onnx", CLUSTERS / "four.yaml", out["spatial"], strategy="spatial")
    edgec.compile(MODELS / "tinyconv.onnx", CLUSTERS / "three.yaml", out["shared"], strategy="spatial")
    out["trace"] = root / "run.json"
    edgec.run(out["pipeline"], random_inputs=True, repeat=3, trace=out["trace"])
    return out


def _simulate(*args: str):
    return CliRunner().invoke(cli, ["simulate", *map(str, args)])


def _svg_text(path: Path) -> list[str]:
    root = ET.parse(path).getroot()  # raises on anything that is not well-formed XML
    return ["".join(el.itertext()) for el in root.iter() if el.tag.endswith("}text")]


def _sim(build: Path) -> dict:
    res = _simulate(build / "manifest.json", "--json")
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def test_svg_names_the_devices_and_the_latency(builds, tmp_path):
    target = tmp_path / "s.svg"
    res = _simulate(builds["pipeline"] / "manifest.json", "--plot", target, "--json")
    assert res.exit_code == 0, res.stderr
    sim = json.loads(res.stdout)  # stdout is still the one JSON object
    texts = _svg_text(target)
    for device in sim["devices"]:
        assert any(t.startswith(device) for t in texts), device
    assert "pi4-a (idle)" in texts and "pi5-a uplink" in texts
    assert any(latency_label("predicted", sim["latency_ms"]) in t for t in texts)
    assert {"f0", "f1"} <= set(texts)  # wide enough to be labelled
    assert f"edgec: schedule drawn in {target}" in res.stderr


def test_png(builds, tmp_path):
    target = tmp_path / "s.PNG"
    res = _simulate(builds["spatial"] / "manifest.json", "--plot", target)
    assert res.exit_code == 0, res.stderr
    assert target.read_bytes()[:8] == PNG_MAGIC and target.stat().st_size > 1000
    assert "predicted latency" in res.stdout  # the table as without --plot


def test_shared_medium_has_one_channel_row(builds, tmp_path):
    target = tmp_path / "s.svg"
    assert _simulate(builds["shared"] / "manifest.json", "--plot", target).exit_code == 0
    texts = _svg_text(target)
    assert "shared channel" in texts and not any(t.endswith(" uplink") for t in texts)


def test_overlay_of_a_real_run(builds, tmp_path):
    target = tmp_path / "o.svg"
    res = _simulate(builds["pipeline"] / "manifest.json", "--plot", target, "--trace", builds["trace"])
    assert res.exit_code == 0, res.stderr
    trace = json.loads(builds["trace"].read_text())
    requests = sorted((e for e in trace["traceEvents"] if e["ph"] == "X" and e["args"]["kind"] == "request"),
                      key=lambda e: e["dur"])
    median = requests[1]
    texts = _svg_text(target)
    assert any(latency_label("measured", median["dur"] / 1000) in t for t in texts)
    assert any(f"measured: request {median['args']['request']} of 3, the median latency" in t for t in texts)
    # The measured bars: one per run and two per transfer (send, receive) beneath the predicted ones.
    plain = _svg_without_overlay(builds, tmp_path)
    assert target.read_text().count("<path") - plain.read_text().count("<path") >= 2 + 2


def _svg_without_overlay(builds, tmp_path) -> Path:
    target = tmp_path / "plain.svg"
    assert _simulate(builds["pipeline"] / "manifest.json", "--plot", target).exit_code == 0
    return target


def _compute(device: str, fragment: str, start: float, end: float) -> dict:
    return {"device": device, "kind": "compute", "what": fragment, "start_ms": start, "end_ms": end,
            "fragment": fragment, "resource": f"device:{device}"}


def _transfer(src: str, dst: str, tensor: str, start: float, end: float, resource: str | None = None) -> dict:
    return {"device": src, "kind": "transfer", "what": f"{tensor} -> {dst}", "start_ms": start, "end_ms": end,
            "tensor": tensor, "src": src, "dst": dst, "resource": resource or f"uplink:{src}"}


def test_simulated_events_carry_what_the_bars_need(builds):
    """`simulate --json`: the keys it always had, and those the picture reads."""
    for build in ("pipeline", "shared"):
        sim = _sim(builds[build])
        for e in sim["timeline"]:
            assert {"device", "kind", "what", "start_ms", "end_ms", "resource"} <= set(e)
            assert {"fragment"} <= set(e) if e["kind"] == "compute" else {"tensor", "src", "dst"} <= set(e)
        links = [e["resource"] for e in sim["timeline"] if e["kind"] == "transfer"]
        assert links and all((r == "channel") == (build == "shared") for r in links)


@pytest.mark.parametrize("resource, row, label", [("uplink:a", ("uplink", "a"), "t -> gpu → b"),
                                                  ("channel", ("channel", ""), "a → b: t -> gpu")])
def test_bars_come_from_the_events_fields_not_their_text(resource, row, label):
    """Tensor `t -> gpu` sent from a to b, beside a device named `gpu -> b`: the event's text `t -> gpu -> b`
    reads both ways; the fields say which."""
    sim = {"latency_ms": 3.0, "devices": {"a": {}, "b": {}, "gpu -> b": {}},
           "timeline": [_compute("a", "fa", 0.0, 1.0), _transfer("a", "b", "t -> gpu", 1.0, 2.5, resource)]}
    assert schedule_bars(sim) == [Bar(("device", "a"), "compute", 0.0, 1.0, "fa", "fa"),
                                  Bar(row, "send", 1.0, 2.5, label, "t -> gpu"),
                                  Bar(("device", "b"), "receive", 1.0, 2.5, "t -> gpu ← a", "t -> gpu")]


def test_an_event_on_an_unknown_resource_is_refused():
    event = {**_compute("a", "fa", 0.0, 1.0), "resource": "disk:a"}
    sim = {"latency_ms": 1.0, "devices": {"a": {}}, "timeline": [event]}
    with pytest.raises(ValueError, match="'disk:a': not a device, an uplink or the channel"):
        schedule_bars(sim)


def test_dense_plans_label_wide_bars_and_number_the_narrow_ones_in_groups(tmp_path):
    """90 transfers of 0.2 ms in a 100 ms schedule: the fragments are labelled; the sends, too narrow, are one
    numbered group, and so are the receives, each explained in the key below the chart."""
    timeline = [_compute("a", "fa", 0.0, 50.0)]
    timeline += [_transfer("a", "b", f"act{i}", 50 + 0.2 * i, 50 + 0.2 * (i + 1)) for i in range(90)]
    timeline.append(_compute("b", "fb", 68.0, 100.0))
    sim = {"latency_ms": 100.0, "devices": {"a": {}, "b": {}}, "timeline": timeline}
    target = tmp_path / "dense.svg"
    plot_schedule(sim, target, title="dense")
    texts = _svg_text(target)
    assert "fa" in texts and "fb" in texts and "1" in texts and "2" in texts and "3" not in texts
    assert not [t for t in texts if t.startswith("act")]  # no bar carries a transfer's own label
    key = [t for t in texts if "act" in t]
    assert key == ["1  a uplink: 90 sends: act0 → b ... act89 → b     2  b: 90 receives: act0 ← a ... act89 ← a"]


def test_every_bar_is_labelled_and_every_colour_is_in_the_legend(tmp_path):
    """Two receives overlapping on one device (a halo from both sides) get a lane each, opaque: no blend of
    greens the legend does not explain. Every bar's label is inside it or in the key."""
    timeline = [_compute("m", "f0s0t1", 0.0, 4.0), _compute("a", "f0s0t0", 0.0, 5.0), _compute("b", "f0s0t2", 0.0, 5.0),
                _transfer("a", "m", "halo_top", 5.0, 5.3), _transfer("b", "m", "halo_bottom", 5.1, 5.4),
                _compute("m", "f0s1t1", 5.4, 9.0)]
    sim = {"latency_ms": 9.0, "devices": {"a": {}, "m": {}, "b": {}}, "timeline": timeline}
    target = tmp_path / "halo.svg"
    plot_schedule(sim, target, title="halo")
    svg = target.read_text()
    texts = _svg_text(target)
    legend = {"compute (fragment)", "send (tensor)", "receive (tensor)"}
    assert legend <= set(texts)
    import re
    fills = {f.lower() for f in re.findall(r"fill: ?(#[0-9a-fA-F]{6})", svg)}
    from edgec.compiler.plot import COLORS
    assert fills - {"#ffffff", "#000000", "#dddddd", "#555555"} == {c.lower() for c in COLORS.values()}
    assert "fill-opacity" not in svg and "opacity: 0.55" not in svg
    every = " ".join(texts)
    for name in ("f0s0t1", "f0s0t0", "f0s0t2", "f0s1t1", "halo_top", "halo_bottom"):
        assert name in every, name


# -- errors: one line, exit 2, nothing written ---------------------------------------------------------------------
def _one_line(res, *fragments: str) -> str:
    assert res.exit_code == 2, (res.stdout, res.stderr)
    [line] = res.stderr.splitlines()
    assert line.startswith("edgec: ") and all(f in line for f in fragments), line
    return line


def test_missing_matplotlib(builds, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    target = tmp_path / "s.svg"
    _one_line(_simulate(builds["pipeline"] / "manifest.json", "--plot", target), "pip install 'edgec[plot]'")
    assert not target.exists()


@pytest.mark.parametrize("name", ["s.pdf", "s"])
def test_bad_suffix(builds, tmp_path, name):
    target = tmp_path / name
    _one_line(_simulate(builds["pipeline"] / "manifest.json", "--plot", target), str(target), ".svg or .png")
    assert not target.exists()


def test_bad_folder(builds, tmp_path):
    target = tmp_path / "nowhere" / "s.svg"
    _one_line(_simulate(builds["pipeline"] / "manifest.json", "--plot", target), str(target))


@pytest.mark.parametrize("content", [None, b"{not json", b'{"traceEvents": []}', b"\xff\xfe"])
def test_unreadable_trace(builds, tmp_path, content):
    trace = tmp_path / "t.json"
    if content is not None:
        trace.write_bytes(content)
    target = tmp_path / "s.svg"
    _one_line(_simulate(builds["pipeline"] / "manifest.json", "--plot", target, "--trace", trace), str(trace))
    assert not target.exists()


def test_trace_of_another_build(builds, tmp_path):
    target = tmp_path / "s.svg"
    res = _simulate(builds["spatial"] / "manifest.json", "--plot", target, "--trace", builds["trace"])
    _one_line(res, str(builds["trace"]), "another build")
    assert not target.exists()


def test_trace_needs_plot(builds):
    _one_line(_simulate(builds["pipeline"] / "manifest.json", "--trace", builds["trace"]), "--plot")


def test_matplotlib_is_imported_only_to_draw():
    """compile, run and a plain simulate do not pay for importing matplotlib."""
    import subprocess

    code = ("import sys, edgec.compiler.cli, edgec.compiler.plot, edgec.runtime.coordinator.trace; "
            "sys.exit('matplotlib' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
