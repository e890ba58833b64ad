"""edgec command line: parse, call the driver, print. No logic lives here."""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from pathlib import Path

import click

from edgec.runtime.command import EXIT_PIPE, OneLineErrors, quiet_broken_pipe
from edgec.runtime.manifest.types import OBJECTIVES  # the plan objectives the manifest format knows
from edgec.runtime.errors import EdgecRuntimeError
from edgec.runtime.interrupts import Interrupted, interrupt_on_signals
from edgec.runtime.profile.command import measure_to, measuring_options, verbose_option

from .errors import UserError

__all__ = ["main", "cli"]

EXIT_USER = 2
EXIT_INTERNAL = 3
_EPILOG = (f"Exit codes: 0 ok, 2 bad input, 3 internal error (a bug), {EXIT_PIPE} stdout closed before the output "
           "was written (e.g. piped into head), 128+N stopped by signal N (130 SIGINT, 143 SIGTERM); `run` adds "
           "1 verification failed and 3 run failure.")


def _progress(msg: str) -> None:
    click.echo(f"edgec: {msg}", err=True)


def _fail(msg: str, code: int = EXIT_USER) -> None:
    click.echo(f"edgec: {msg}", err=True)
    sys.exit(code)


class _Group(OneLineErrors, click.Group):
    """Turns UserError into one line and exit 2; SIGTERM/SIGINT into one line and 128+signal, after every
    cleanup ran (temporary folders, forked searches); other exceptions into one line and exit 3. Usage
    errors and a closed stdout: see OneLineErrors."""

    def invoke(self, ctx):
        try:
            with interrupt_on_signals():
                return super().invoke(ctx)
        except UserError as exc:
            _fail(str(exc))
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except BrokenPipeError:  # handled here: click's own handling would exit 1
            ctx.exit(quiet_broken_pipe())
        except Interrupted as exc:
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except Exception as exc:  # a bug: keep the traceback behind EDGEC_DEBUG
            if os.environ.get("EDGEC_DEBUG"):
                traceback.print_exc()
            _fail(f"internal error: {type(exc).__name__}: {exc} (set EDGEC_DEBUG=1 for the traceback)", EXIT_INTERNAL)


@click.group(cls=_Group, epilog=_EPILOG, context_settings={"show_default": True})
@click.version_option(None, "-V", "--version", package_name="edgec")
def cli() -> None:
    """Compile an ONNX model so that several edge devices run it together."""


@cli.command("compile", epilog=_EPILOG)
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--devices", "devices", required=True, type=click.Path(dir_okay=False, path_type=Path), help="cluster.yaml")
@click.option("-o", "--output", "outdir", required=True, type=click.Path(file_okay=False, path_type=Path))
# plan.registry.STRATEGIES, spelt out so that `edgec --help` need not import every planner (test_cli checks the two agree)
@click.option("--strategy", default="auto",
              type=click.Choice(["auto", "pipeline", "single", "even", "neurosurgeon", "spatial", "hybrid", "bbgrap",
                                 "edgeflow", "deepthings", "ring-memory", "equal-layers"]))
@click.option("--objective", default="latency", type=click.Choice(OBJECTIVES),
              help="energy: the least energy per request predicted within --sla-ms")
@click.option("--sla-ms", type=float, default=None, help="with --objective energy: the latency SLA in ms")
@click.option("--sla-soft", is_flag=True,
              help="with --sla-ms: minimise energy + lambda x (ms over the SLA) instead of requiring it (Dora's QoE)")
@click.option("--lambda", "lam", type=float, default=None, show_default="10 mJ per ms",
              help="with --sla-soft: the energy a millisecond over the SLA weighs, in mJ")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=D0,D1,...", help="pin an input's dynamic dimensions")
@click.option("--search-threshold", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.1,
              show_default=True, help="ADaPS partition search threshold (fraction of rows around speed shares)")
@click.option("--deepthings-grid", metavar="NxM", default=None, show_default="one band of rows per device: Nx1",
              help="DeepThings tile grid: N tiles along height by M along width, e.g. 2x2")
@click.option("--deepthings-layers", type=click.IntRange(min=1), default=None,
              show_default="every block cut tried, the best predicted kept", help="DeepThings fused depth")
@click.option("--jobs", type=click.IntRange(min=1), default=None, show_default="the cores available, at most 2",
              help="processes for the spatial and hybrid searches; the plan is the same for any value")
@click.option("--fallbacks", is_flag=True,
              help="also plan the cluster without each device the plan uses (OUTDIR/fallback-DEVICE/): `edgec run` "
                   "switches to that plan when the device stops answering")
@click.option("--pareto", is_flag=True,
              help="also list the non-dominated plans (latency, throughput, energy) of every planner run")
@click.option("--keep", type=click.IntRange(min=1), default=None, metavar="N",
              help="also write the best N other plans of that frontier as builds of their own (OUTDIR/alt-1/ ...), "
                   "for the runtime to switch between")
@click.option("--shifts", is_flag=True,
              help="also write, as further alternative builds (OUTDIR/alt-K/, after --keep's), every variant of the "
                   "chosen plan that moves one boundary between neighbouring pipeline stages by one layer (DGPAS "
                   "adjacent scheduling), for the runtime to rebalance with")
@click.option("--generate", is_flag=True,
              help="a decoder LM with a KV cache: plan a decode step (latency: time per output token; throughput: "
                   "tokens/s with sequences in flight), each layer's cache kept on its stage and counted at "
                   "--max-context, the prefill of --prompt-len tokens priced; the manifest gains the state")
@click.option("--max-context", type=click.IntRange(min=2), default=512, help="with --generate: the longest "
              "context (prompt + generated tokens) a sequence reaches")
@click.option("--prompt-len", type=click.IntRange(min=1), default=64, help="with --generate: the prompt "
              "length the time to first token is priced at")
@click.option("--state", "state", multiple=True, metavar="IN=OUT", help="with --generate: a cache input and "
              "the output that replaces it at the next step, when the names do not tell (repeatable)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON summary object on stdout")
def compile_cmd(model, devices, outdir, strategy, objective, sla_ms, sla_soft, lam, shapes, search_threshold,
                deepthings_grid, deepthings_layers, jobs, fallbacks, pareto, keep, shifts, generate, max_context,
                prompt_len, state, as_json):
    """Compile MODEL for the devices in CLUSTER.yaml into OUTDIR (fragments + manifest.json).

    \b
    Strategies (--strategy):
      auto          run every planner below but the last two, keep the best predicted plan
      pipeline      exact search: consecutive layers per device, each stage on its own device
      single        the whole model on the one best device
      even          EdgeShard-like: devices in list order, stages of equal compute
      neurosurgeon  Neurosurgeon: one cut between two devices
      spatial       ADaPS: the first layers cut into row (or column) tiles over devices
      hybrid        spatial tiles first, then pipeline stages on the rest of the model
      bbgrap        BBGraP: every block split equally, gathered and re-scattered after each
      edgeflow      EdgeFlow: one split per block, chosen against the previous block's
      deepthings    DeepThings: a fixed grid of fused tiles over the first layers, one per device
      ring-memory   exo: devices in list order, stages in proportion to their free memory (not run by auto)
      equal-layers  devices in list order, equal numbers of layers per stage (not run by auto)

    \b
    With --generate, auto runs pipeline, single, even and neurosurgeon; ring-memory and equal-layers apply
    too; the spatial strategies (spatial, hybrid, bbgrap, edgeflow, deepthings) do not."""
    from .api import compile as compile_api
    from .emit import check_output_dir
    from .ingest import parse_shape_option
    from .ingest.state import parse_state_option
    from .progress import for_stderr
    from .report import format_compile, idle_devices_hint

    check_output_dir(outdir)  # a folder that will be refused is refused now, not after the planning
    grid = None
    if deepthings_grid is not None:
        n, sep, m = deepthings_grid.lower().partition("x")
        if not (sep and n.isdigit() and m.isdigit() and int(n) > 0 and int(m) > 0):
            raise UserError(f"--deepthings-grid {deepthings_grid!r}: expected NxM with positive integers, e.g. 4x1")
        grid = (int(n), int(m))
    with for_stderr(live=not as_json) as progress:
        summary = compile_api(model, devices, outdir, strategy=strategy, objective=objective,
                              shapes=parse_shape_option(shapes), search_threshold=search_threshold,
                              deepthings_grid=grid, deepthings_layers=deepthings_layers, jobs=jobs,
                              progress=progress, fallbacks=fallbacks, sla_ms=sla_ms, sla_soft=sla_soft, lam=lam,
                              pareto=pareto, keep=keep, shifts=shifts, generate=generate, max_context=max_context,
                              prompt_len=prompt_len, state=parse_state_option(state))
    hint = idle_devices_hint(summary)
    if hint:
        _progress(f"hint: {hint}")
    click.echo(json.dumps(summary, indent=1, sort_keys=True) if as_json else format_compile(summary))


@cli.command("inspect", epilog=_EPILOG)
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--devices", type=click.Path(dir_okay=False, path_type=Path), show_default="no cost table",
              help="cluster.yaml: add the cost table")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=D0,D1,...")
@click.option("--json", "as_json", is_flag=True)
def inspect_cmd(model, devices, shapes, as_json):
    """Show MODEL's layer graph and, with a cluster, each layer's cost on each device.

    Given a compiled manifest.json instead, show its plan: stages, every tile (device, rows,
    fragment) and every exchange between devices (scatter, halo, gather, transfer) with its region."""
    from .ingest import load_model, parse_shape_option
    from .report import format_inspect, format_plan, inspect_summary, load_manifest_json, plan_summary

    if model.suffix == ".json":
        if devices or shapes:
            raise UserError("--devices and --shape apply to a model, not to a manifest", str(model))
        doc = load_manifest_json(model)
        try:
            summary = plan_summary(doc)
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"not a valid edgec manifest ({exc})", str(model)) from None
        click.echo(json.dumps(summary, indent=1, sort_keys=True) if as_json else format_plan(summary))
        return

    ing = load_model(model, parse_shape_option(shapes))
    cost = None
    if devices:
        from .cluster import load_cluster
        from .cost import build_cost_table

        cost = build_cost_table(ing.graph, load_cluster(devices), ing.sha256, model=ing.model)
    summary = inspect_summary(ing, cost)
    click.echo(json.dumps(summary, indent=1, sort_keys=True) if as_json else format_inspect(summary))


@cli.command("simulate", epilog=_EPILOG)
@click.argument("manifest", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
@click.option("--plot", "plot_file", type=click.Path(path_type=Path), metavar="FILE.svg|png",
              help="also draw the schedule as a Gantt chart (needs matplotlib: pip install 'edgec[plot]'): a row "
                   "per device and per sender's uplink (switched) or the channel (shared), the predicted latency "
                   "marked")
@click.option("--trace", "trace_file", type=click.Path(path_type=Path), metavar="RUN.json",
              help="with --plot: overlay the median request of an `edgec run --trace RUN.json` of this build "
                   "(run it with --inflight 1 for requests that do not queue behind each other)")
def simulate_cmd(manifest, as_json, plot_file, trace_file):
    """Replay MANIFEST's schedule under the cost model: per-device timeline and totals."""
    from .report import format_simulation, load_manifest_json
    from .cost import simulate_manifest

    if trace_file is not None and plot_file is None:
        raise UserError("--trace RUN.json is drawn over the schedule: add --plot FILE.svg|png")
    if plot_file is not None:  # refused before any work, as a bad manifest is
        from .plot import check_plot_path, require_matplotlib

        check_plot_path(plot_file)
        require_matplotlib()
    doc = load_manifest_json(manifest)
    try:
        sim = simulate_manifest(doc.manifest)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"not a valid edgec manifest ({exc})", str(manifest)) from None
    if plot_file is not None:
        from .plot import load_measured, plot_schedule

        medium = doc.manifest.network.medium
        measured = None if trace_file is None else load_measured(trace_file, sim, medium)
        plot_schedule(sim, plot_file, measured=measured,
                      title=f"{manifest}: the predicted schedule of one request ({medium} network)")
        _progress(f"schedule drawn in {plot_file}")
    sim["manifest"] = str(manifest)
    sim["predicted_throughput_ips"] = doc.manifest.predicted.get("throughput_ips")
    click.echo(json.dumps(sim, indent=1, sort_keys=True) if as_json else format_simulation(sim))


@cli.command("profile", epilog=_EPILOG)
@measuring_options
@click.option("--refine", "refine", type=click.Path(dir_okay=False, path_type=Path), metavar="REPORT.json",
              help="measure nothing: fold the measured fragment times of an `edgec run --report` file into the "
                   "device's profile as a per-node table for the model, written to -o")
@click.option("--profile", "profile_ref", metavar="NAME|PATH", show_default="the manifest's profile of the device",
              help="with --refine: the profile to refine")
@click.option("--device", "device", metavar="NAME", show_default="every device of the report, if they share a profile",
              help="with --refine: the device whose fragment times to fold in")
@verbose_option
def profile_cmd(output, model, threads, providers, strict, quick, power_idle, power_busy, refine, profile_ref, device,
                verbose):
    """Measure this machine and write a device profile (the format of profiles/*.yaml).

    Each figure is measured per thread count and repeated until its spread is small; the load of the
    machine is checked before and during.  A busy machine or a figure that stays noisy is a warning, or
    with --strict an error.  With --refine, a run's accuracy report refines an existing profile instead.
    The device-only install (runtime/dist, with its `profile` extra) measures the same way."""
    from .profile import check_output_path, refine_profile, write_profile

    if refine is not None:
        given = [flag for flag, v in (("--model", model), ("--threads", threads), ("--providers", providers),
                                      ("--strict", strict),
                                      ("--quick", quick), ("--power-idle", power_idle),
                                      ("--power-busy", power_busy)) if v not in (None, False)]
        if given:
            raise UserError(f"{given[0]} measures this machine; --refine measures nothing")
        check_output_path(output)
        click.echo(f"edgec: {refine_profile(refine, output, profile=profile_ref, device=device, note=_progress)}",
                   err=True)
        click.echo(str(output))
        return
    if profile_ref is not None or device is not None:
        raise UserError(f"{'--profile' if profile_ref is not None else '--device'} goes with --refine REPORT.json")
    try:
        measure_to(write_profile, _progress, output=output, model=model, threads=threads, strict=strict, quick=quick,
                   power_idle=power_idle, power_busy=power_busy, verbose=verbose, providers=providers)
    except EdgecRuntimeError as exc:  # the measuring is the runtime's: its bad input is ours (exit 2)
        _fail(str(exc), exc.exit_code)


@cli.command("allocate", epilog=_EPILOG)
@click.argument("services", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--devices", "devices", required=True, type=click.Path(dir_okay=False, path_type=Path), help="cluster.yaml")
@click.option("-o", "--output", "outdir", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--fairness", is_flag=True,
              help="maximise the least normalised utility first (max-min), then the priority-weighted sum")
@click.option("--best-effort", is_flag=True,
              help="when not every SLA can be met, drop the lowest-priority services first instead of failing")
@click.option("--share", is_flag=True,
              help="let a device serve several services when the memory their plans hold there fits it and their "
                   "loads (rate, or 1000/sla_ms without one, x the ms a request holds the device) add up to at most "
                   "1000 ms per s")
@click.option("--time-limit", type=click.FloatRange(min=0.1), default=10.0, help="seconds CP-SAT may search")
@click.option("--jobs", type=click.IntRange(min=1), default=None, show_default="the cores available",
              help="processes planning services side by side (and for each spatial and hybrid search)")
@click.option("--json", "as_json", is_flag=True, help="print allocation.json's object on stdout")
def allocate_cmd(services, devices, outdir, fairness, best_effort, share, time_limit, jobs, as_json):
    """Share the devices of CLUSTER.yaml among the models of SERVICES.yaml: one build per service in
    OUTDIR/<service>/ on devices of its own (or, with --share, devices it may share), and
    OUTDIR/allocation.json."""
    from .allocate import allocate
    from .allocate.output import allocation_text
    from .allocate.report import format_allocation
    from .plan.planner import PlanOptions
    from .progress import for_stderr

    with for_stderr(live=not as_json) as progress:
        allocation = allocate(services, devices, outdir, fairness=fairness, best_effort=best_effort, share=share,
                              time_limit=time_limit, options=PlanOptions(jobs=jobs), progress=progress)
    click.echo(allocation_text(allocation).rstrip("\n") if as_json else format_allocation(allocation, str(outdir)))


def _add_runtime_commands() -> None:
    from edgec.runtime.front.cli import keygen as keygen_cmd, run as run_cmd, run_all as run_all_cmd, serve as serve_cmd
    from edgec.runtime.front.cli import generate as generate_cmd
    from edgec.runtime.device.worker import worker as worker_cmd

    cli.add_command(run_cmd, "run")
    cli.add_command(run_all_cmd, "run-all")
    cli.add_command(serve_cmd, "serve")
    cli.add_command(generate_cmd, "generate")
    cli.add_command(worker_cmd, "worker")
    cli.add_command(keygen_cmd, "keygen")


_add_runtime_commands()


class _LevelFormatter(logging.Formatter):
    """`edgec: warning: ...` for warnings and errors, `edgec:   ...` (a detail) below them."""

    def format(self, record: logging.LogRecord) -> str:
        kind = "warning: " if record.levelno >= logging.WARNING else "  "
        return f"edgec: {kind}{record.getMessage()}"


def main() -> None:
    # Warnings from the passes (e.g. a measured table that does not cover the model) reach the user, and
    # what a --verbose option lets through below them (e.g. a profile warning's details)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LevelFormatter())
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    cli(prog_name="edgec")
