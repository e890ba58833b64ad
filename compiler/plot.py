"""`edgec simulate MANIFEST --plot FILE.svg|png [--trace RUN.json]`: the simulated schedule of one request as a
Gantt chart, and over it, from a trace of `edgec run --trace`, what one request of the run measured.

Rows: one per device (its fragment runs, and the tensors it receives), then the network as the cost model
prices it: each of compiler/cost/evaluate.py simulate_manifest's events names the resource it occupies, and
its fragment or its tensor, sender and receiver, which the bars are drawn from. On a switched network that is
each sender's uplink, right below its device (a device sends its messages one after another, whatever their
destinations), and on a shared medium one channel for all the sends. A receive bar spans its transfer, on the
receiver's row, in a lane of its own below the device's runs (one lane for each receive that overlaps
another). Every bar is labelled: inside it where its label fits, else with a number (narrow bars side by
side share one) that the key below the chart explains. The predicted latency is a dashed line. The overlay is the run's median request (by latency):
its runs and transfers as thinner bars below the predicted ones, on the same rows, and its latency as a dotted
line; all its times count from that request's start, as the prediction's count from the request's.

matplotlib is optional (`pip install 'edgec[plot]'`) and imported only here, only when drawing, without pyplot:
the figure is drawn by the Agg canvas and saved as SVG (its text kept as text) or PNG, as the file's suffix says.
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from edgec.runtime.errors import InputError
from edgec.runtime.files import write_atomically

from .errors import UserError

__all__ = ["FORMATS", "Bar", "Measured", "check_plot_path", "require_matplotlib", "schedule_bars", "load_measured",
           "latency_label", "plot_schedule"]

FORMATS = {".svg": "svg", ".png": "png"}
INSTALL = "pip install 'edgec[plot]'"

# One colour per kind of bar, each opaque: a device's receives have a lane of their own below its runs (and
# receives that overlap, one lane each), so no bar is drawn over another and no blend makes a colour the
# legend does not explain.
COLORS = {"compute": "#4C72B0", "send": "#DD8452", "receive": "#55A868"}
LEGEND = {"compute": "compute (fragment)", "send": "send (tensor)", "receive": "receive (tensor)"}
PLURAL = {"compute": "runs", "send": "sends", "receive": "receives"}
FONT_PT = 7  # bar labels
ROW_IN, WIDTH_IN, DPI = 0.42, 12.0, 150
RECEIVE_SHARE = 0.4  # of a device row's band, for its receives (below its runs)
GROUP_GAP_IN = 0.25  # bars too narrow for their label closer than this on one lane share one number
KEY_LINE_IN = 0.16  # a line of the key below the chart


@dataclass(frozen=True)
class Bar:
    row: tuple[str, str]  # ("device", name) | ("uplink", sender) | ("channel", "")
    kind: str  # compute | send | receive
    start_ms: float
    end_ms: float
    label: str
    short: str  # drawn where the label does not fit


@dataclass(frozen=True)
class Measured:
    """One request of a run, from its trace: its bars, on the rows the prediction uses."""

    source: str
    request: int
    requests: int  # the timed requests in the trace, of which this has the median latency
    latency_ms: float
    bars: tuple[Bar, ...]


def check_plot_path(path: str | os.PathLike) -> str:
    """The file format for `path` (its suffix), or UserError for one that cannot be drawn or written."""
    target = Path(path)
    fmt = FORMATS.get(target.suffix.lower())
    if fmt is None:
        raise UserError(f"cannot draw a {target.suffix or 'suffix-less'} file: --plot writes .svg or .png", str(path))
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise UserError("is a directory; --plot takes a file name", str(path))
    if not folder.is_dir():
        raise UserError(f"no folder {folder} to write the plot in", str(path))
    return fmt


def require_matplotlib() -> None:
    """UserError, before any work, when matplotlib is not installed."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise UserError(f"--plot needs matplotlib, which is not installed: {INSTALL}") from None


def _row(resource: str) -> tuple[str, str]:
    """The row of what an event occupies, as simulate_manifest names it: "device:D", "uplink:D", "channel"."""
    kind, _, name = resource.partition(":")
    if kind not in ("device", "uplink", "channel"):
        raise ValueError(f"event on {resource!r}: not a device, an uplink or the channel")
    return kind, name


def _link(src: str, medium: str) -> str:
    """What a message of `src` occupies, as simulate_manifest says: its uplink, or the one shared channel."""
    return "channel" if medium == "shared" else f"uplink:{src}"


def _transfer_bars(src: str, dst: str, tensor: str, start: float, end: float, link: str) -> list[Bar]:
    row = _row(link)
    send = f"{src} → {dst}: {tensor}" if row[0] == "channel" else f"{tensor} → {dst}"
    return [Bar(row, "send", start, end, send, tensor),
            Bar(("device", dst), "receive", start, end, f"{tensor} ← {src}", tensor)]


def schedule_bars(sim: Mapping) -> list[Bar]:
    """The bars of simulate_manifest's timeline (compute and transfer events), on the rows its events name."""
    bars: list[Bar] = []
    for e in sim["timeline"]:
        start, end = float(e["start_ms"]), float(e["end_ms"])
        if e["kind"] == "compute":
            bars.append(Bar(_row(e["resource"]), "compute", start, end, e["fragment"], e["fragment"]))
        else:
            bars += _transfer_bars(e["src"], e["dst"], e["tensor"], start, end, e["resource"])
    return bars


def latency_label(who: str, ms: float) -> str:
    """The text by a latency line: `predicted 0.568 ms`."""
    return f"{who} {_ms(ms)} ms"


def _ms(v: float) -> str:
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.2f}" if abs(v) < 1000 else f"{v:.0f}"


# -- the trace of `edgec run --trace` -------------------------------------------------------------------------
def load_measured(path: str | os.PathLike, sim: Mapping, medium: str) -> Measured:
    """The median request of a trace file (runtime/coordinator/trace.py), checked against the simulated plan."""
    try:
        with open(path, "rb") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise UserError(f"cannot read the trace ({exc.strerror or exc})", str(path)) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"not a JSON trace ({exc})", str(path)) from None
    try:
        return _measured(doc, str(path), sim, medium)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"not a trace of `edgec run --trace` ({type(exc).__name__}: {exc})", str(path)) from None


def _measured(doc: dict, source: str, sim: Mapping, medium: str) -> Measured:
    if doc["otherData"]["producer"] != "edgec run --trace":
        raise ValueError("otherData.producer is not 'edgec run --trace'")
    timed = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    requests = sorted((e for e in timed if e["args"]["kind"] == "request"),
                      key=lambda e: (float(e["dur"]), int(e["args"]["request"])))
    if not requests:
        raise UserError("the trace holds no timed request", source)
    median = requests[(len(requests) - 1) // 2]
    number, origin = int(median["args"]["request"]), float(median["ts"])
    planned = {(e["device"], e["what"]) for e in sim["timeline"] if e["kind"] == "compute"}
    bars: list[Bar] = []
    for e in timed:
        a = e["args"]
        if a["request"] != number or a["kind"] not in ("compute", "transfer"):
            continue
        start = (float(e["ts"]) - origin) / 1000.0
        end = start + float(e["dur"]) / 1000.0
        if a["kind"] == "compute":
            if (a["device"], a["fragment"]) not in planned:
                raise UserError(f"request {number} ran fragment {a['fragment']} on {a['device']}, which the "
                                f"simulated plan does not: a trace of another build?", source)
            bars.append(Bar(("device", str(a["device"])), "compute", start, end, "", ""))
        else:
            for name in (a["src"], a["dst"]):
                if name not in sim["devices"]:
                    raise UserError(f"request {number} sent between devices {a['src']} and {a['dst']}; the "
                                    f"simulated plan has no device {name}: a trace of another build?", source)
            src = str(a["src"])
            bars += [Bar(b.row, b.kind, start, end, "", "")
                     for b in _transfer_bars(src, str(a["dst"]), str(a["tensor"]), start, end, _link(src, medium))]
    return Measured(source, number, len(requests), float(median["dur"]) / 1000.0, tuple(bars))


# -- drawing --------------------------------------------------------------------------------------------------
def _rows(sim: Mapping, bars: list[Bar]) -> list[tuple[tuple[str, str], str]]:
    """(row, its label) from the top: each device, its uplink below it; the channel last."""
    used = {b.row for b in bars}
    rows = []
    for d in sim["devices"]:
        busy = ("device", d) in used
        rows.append((("device", d), d if busy else f"{d} (idle)"))
        if ("uplink", d) in used:
            rows.append((("uplink", d), f"{d} uplink"))
    if ("channel", "") in used:
        rows.append((("channel", ""), "shared channel"))
    return rows


def plot_schedule(sim: Mapping, path: str | os.PathLike, *, title: str, measured: Measured | None = None) -> None:
    """Draw the Gantt chart of `sim` (simulate_manifest's dict) into `path` (.svg or .png), atomically. The
    events name their rows (device, uplink or channel)."""
    fmt = check_plot_path(path)
    require_matplotlib()
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    predicted = schedule_bars(sim)
    rows = _rows(sim, predicted + list(measured.bars if measured else ()))
    label_in = max(len(text) for _, text in rows) * FONT_PT * 0.6 / 72 + 0.3
    left_in, right_in, top_in, bottom_in = label_in, 0.25, 0.75 if measured else 0.55, 0.95
    ends = [b.end_ms for b in predicted] + [b.end_ms for b in (measured.bars if measured else ())]
    xmax = max([float(sim["latency_ms"]), *(ends or [0.0]), measured.latency_ms if measured else 0.0]) * 1.06 or 1.0
    in_per_ms = (WIDTH_IN - left_in - right_in) / xmax
    y_of = {row: len(rows) - 1 - i for i, (row, _) in enumerate(rows)}
    band = (0.42, 0.46) if measured else (0.15, 0.7)  # (bottom, height) within a row
    places = _lanes(predicted, y_of, band)
    key_lines = _key_lines(_groups(predicted, places, in_per_ms), dict(rows))
    bottom_in += KEY_LINE_IN * len(key_lines) + (0.1 if key_lines else 0.0)
    height_in = ROW_IN * len(rows) + top_in + bottom_in

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "edgec", "font.size": 8}):
        fig = Figure(figsize=(WIDTH_IN, height_in), dpi=DPI)
        FigureCanvasAgg(fig)
        ax = fig.add_axes((left_in / WIDTH_IN, bottom_in / height_in, 1 - (left_in + right_in) / WIDTH_IN,
                           ROW_IN * len(rows) / height_in))
        _bars(ax, predicted, places, edge="white")
        _labels(ax, predicted, places, in_per_ms)
        if measured:
            _bars(ax, list(measured.bars), _lanes(list(measured.bars), y_of, (0.1, 0.24)), edge="black")
        ax.set_xlim(0, xmax)
        ax.set_ylim(0, len(rows))
        ax.set_yticks([y + 0.5 for y in y_of.values()], [text for _, text in rows])
        ax.tick_params(axis="y", length=0)
        for y in range(1, len(rows)):
            ax.axhline(y, color="#dddddd", lw=0.6, zorder=0)
        ax.set_xlabel("ms since the request started")
        _latency(ax, float(sim["latency_ms"]), "predicted", "--", "right")
        handles = [Patch(facecolor=COLORS[k], label=LEGEND[k]) for k in COLORS]
        if measured:
            _latency(ax, measured.latency_ms, "measured", ":", "left")
            handles.append(Patch(facecolor="#bbbbbb", edgecolor="black", lw=0.5,
                                 label=f"measured: request {measured.request} (thin, below)"))
            title += (f"\nmeasured: request {measured.request} of {measured.requests}, the median latency, "
                      f"from {Path(measured.source).name}")
        legend_y = (KEY_LINE_IN * len(key_lines) + (0.1 if key_lines else 0.0)) / height_in
        fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, bbox_to_anchor=(0.5, legend_y))
        for k, line in enumerate(key_lines):
            fig.text(left_in / WIDTH_IN, (KEY_LINE_IN * (len(key_lines) - k) - 0.05) / height_in, line,
                     fontsize=FONT_PT, family="monospace", va="bottom")
        fig.suptitle(title, y=1 - 0.1 / height_in, va="top", fontsize=9)
        _save(fig, path, fmt)


def _lanes(bars: list[Bar], y_of: dict, band: tuple[float, float]) -> dict[Bar, tuple[float, float]]:
    """Each bar's (bottom, height) on the chart. A device row that receives splits its band: its receives
    below (RECEIVE_SHARE of it, one lane per receive that overlaps another), its runs above; other rows
    (uplinks, the channel: one message at a time) use the whole band."""
    places: dict[Bar, tuple[float, float]] = {}
    by_row: dict[tuple[str, str], list[Bar]] = {}
    for b in bars:
        by_row.setdefault(b.row, []).append(b)
    for row, mine in by_row.items():
        y, (bottom, height) = y_of[row], band
        receives = sorted((b for b in mine if b.kind == "receive"), key=lambda b: (b.start_ms, b.end_ms))
        low = height * RECEIVE_SHARE if receives else 0.0
        lane_ends: list[float] = []
        lane_of = {}
        for b in receives:  # interval partitioning: the first lane free when the receive starts
            k = next((i for i, end in enumerate(lane_ends) if end <= b.start_ms + 1e-12), len(lane_ends))
            lane_ends[k:k + 1] = [b.end_ms]
            lane_of[b] = k
        for b in mine:
            if b.kind == "receive":
                h = low / len(lane_ends)
                places[b] = (y + bottom + h * (len(lane_ends) - 1 - lane_of[b]), h)
            else:
                places[b] = (y + bottom + low, height - low)
    return places


def _bars(ax, bars: list[Bar], places: dict, edge: str) -> None:
    for kind in ("receive", "send", "compute"):
        mine = [b for b in bars if b.kind == kind]
        if mine:
            ax.barh([places[b][0] for b in mine], [b.end_ms - b.start_ms for b in mine],
                    left=[b.start_ms for b in mine], height=[places[b][1] for b in mine], align="edge",
                    color=COLORS[kind], edgecolor=edge, linewidth=0.4, zorder=3)


def _fits(b: Bar, in_per_ms: float, places: dict) -> str | None:
    """The bar's label, or its short label, if one fits inside it (its length, and a line's height in the
    bar's lane); else None."""
    if places[b][1] * ROW_IN < (FONT_PT + 1) / 72:
        return None
    room = (b.end_ms - b.start_ms) * in_per_ms - 0.06
    return next((t for t in (b.label, b.short) if t and len(t) * FONT_PT * 0.6 / 72 <= room), None)


def _groups(bars: list[Bar], places: dict, in_per_ms: float) -> list[list[Bar]]:
    """The bars too small for their label, grouped: on one lane, each within GROUP_GAP_IN of the previous
    one of its group. In the chart's order: rows from the top, then time."""
    narrow = sorted((b for b in bars if _fits(b, in_per_ms, places) is None),
                    key=lambda b: (-places[b][0], b.start_ms, b.end_ms))
    groups: list[list[Bar]] = []
    for b in narrow:
        last = groups[-1][-1] if groups else None
        if (last is not None and places[last] == places[b]
                and (b.start_ms - max(x.end_ms for x in groups[-1])) * in_per_ms <= GROUP_GAP_IN):
            groups[-1].append(b)
        else:
            groups.append([b])
    return groups


def _describe(group: list[Bar]) -> str:
    """What a numbered group holds: its bars' labels, or for many, how many and the first and last."""
    if len(group) <= 3:
        return ", ".join(b.label or b.short for b in group)
    return f"{len(group)} {PLURAL[group[0].kind]}: {group[0].label} ... {group[-1].label}"


def _key_lines(groups: list[list[Bar]], row_text: dict) -> list[str]:
    """The key below the chart: `n  row: what` for every numbered group, as many per line as fit."""
    entries = [f"{n}  {row_text[g[0].row]}: {_describe(g)}" for n, g in enumerate(groups, 1)]
    per_line = int(WIDTH_IN * 0.85 * 72 / (FONT_PT * 0.6))
    lines: list[str] = []
    for e in entries:
        if lines and len(lines[-1]) + 5 + len(e) <= per_line:
            lines[-1] += "     " + e
        else:
            lines.append(e)
    return lines


def _labels(ax, bars: list[Bar], places: dict, in_per_ms: float) -> None:
    """Every bar labelled: inside it where its label (or short label) fits; else it is numbered, with the
    narrow bars next to it on its lane (a plan with a hundred transfers stays readable), the number
    explained in the key below the chart (`_key_lines` of the same groups)."""
    for b in bars:
        text = _fits(b, in_per_ms, places)
        if text:
            bottom, height = places[b]
            ax.text((b.start_ms + b.end_ms) / 2, bottom + height / 2, text, ha="center", va="center",
                    fontsize=FONT_PT, color="white", zorder=4, clip_on=True)
    groups = _groups(bars, places, in_per_ms)
    for n, g in enumerate(groups, 1):
        bottom, height = places[g[0]]
        ax.text((g[0].start_ms + max(b.end_ms for b in g)) / 2, bottom + height / 2, str(n), ha="center",
                va="center", fontsize=FONT_PT - 1, color="black", zorder=6, clip_on=False,
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "#555555", "lw": 0.4})


def _latency(ax, ms: float, who: str, style: str, side: str) -> None:
    """A latency line, its value written along it: the predicted on its left, the measured on its right."""
    ax.axvline(ms, color="black" if who == "predicted" else "firebrick", ls=style, lw=1.1, zorder=5)
    ax.text(ms, 0.98, f" {latency_label(who, ms)} ", transform=ax.get_xaxis_transform(), rotation=90,
            ha=side, va="top", fontsize=8, zorder=6, bbox={"facecolor": "white", "alpha": 0.8, "lw": 0, "pad": 1})


def _save(fig, path: str | os.PathLike, fmt: str) -> None:
    # No date in an SVG: the same schedule draws the same file.
    metadata = {"Date": None} if fmt == "svg" else {}
    try:
        write_atomically(path, "the plot", lambda fh: fig.savefig(fh, format=fmt, metadata=metadata))
    except InputError as exc:  # names the file already
        raise UserError(str(exc)) from None
