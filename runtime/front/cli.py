"""The runtime's commands: `edgec run MANIFEST` (run a build on the devices' workers, time it, optionally
verify it), `edgec worker` (the daemon on each device), `edgec keygen` (the cluster's keys) and, on the device-only
install, `edgec profile` (measure this machine: the full install's own adds --refine); the device-only `edgec`
group, which adds `edgec run-all` (run_all_cli.py), `edgec serve` (serve_cli.py) and `edgec generate`
(generate_cli.py). kit.py holds what the
commands share: option types, progress on stderr, exit codes."""

from __future__ import annotations

import json
import logging
import os
import statistics

import click
import numpy as np

from ..command import (EXIT_INPUT, EXIT_OK, EXIT_PIPE, EXIT_RUN, EXIT_VERIFY_FAILED, OneLineErrors, RunCommand,
                       quiet_broken_pipe, runtime_log_to_stderr)
from ..coordinator.accuracy import summary_lines
from ..coordinator.adapt import THRESHOLD
from ..coordinator.liveness import HEARTBEAT_MISSES, HEARTBEAT_MS
from ..device.session import MAX_INFLIGHT
from ..device.worker import worker, worker_main
from ..errors import EdgecRuntimeError, InputError
from ..machine import MAX_THREADS_HERE, edgec_version
from ..manifest.types import Manifest
from ..profile.command import LOGGER as PROFILE_LOGGER, measure_to, measuring_options, verbose_option
from ..profile.write import write_profile_flow
from ..wire.compress import MODES as COMPRESS_MODES
from ..wire.keys import COORDINATOR, keygen as write_keys, names_from_file
from ..wire.protocol import MAX_DILATE
from .api import (MAX_HEARTBEAT_MS, MAX_TIMEOUT_S, MAX_WARMUP, MIN_HEARTBEAT_MS, RequestsChecked, RunResult, execute,
                  parse_addresses, parse_slow, report, write_npz)
from .kit import SEED, TIMEOUT, TOLERANCE, command_exit_code, request_lines
from .run_all_cli import run_all
from .serve_cli import serve
from .generate_cli import generate

__all__ = ["run", "run_all", "serve", "generate", "worker", "keygen", "main", "worker_main", "device_main", "OneLineErrors",
           "quiet_broken_pipe", "EXIT_OK", "EXIT_VERIFY_FAILED", "EXIT_INPUT", "EXIT_RUN", "EXIT_PIPE", "MAX_THREADS_HERE"]

logger = logging.getLogger(__name__)


_EPILOG = ("Exit codes: 0 ok, 1 verification failed, 2 bad input, 3 run failure (a worker failed, died or timed "
           f"out), {EXIT_PIPE} stdout closed before the report was written (e.g. piped into head), 128+N "
           "stopped by signal N (130 SIGINT, 143 SIGTERM).")


@click.command("run", cls=RunCommand, epilog=_EPILOG, context_settings={"show_default": True})
@click.argument("manifest", type=click.Path(dir_okay=True))
@click.option("--inputs", "inputs_file", metavar="FILE.npz", help="All model inputs, by name (np.savez).")
@click.option("--input", "input_pairs", multiple=True, metavar="NAME=FILE.npy", help="One model input (repeatable).")
@click.option("--random-inputs", is_flag=True, help="Random inputs of the manifest's shapes and dtypes.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed for --random-inputs.")
@click.option("--verify", is_flag=True, help="Compare against the source model run whole in onnxruntime.")
@click.option("--model", "model_file", metavar="MODEL.onnx", show_default="the manifest's model path",
              help="The source model for --verify, when the build folder was moved away from it; its sha256 "
                   "must match the manifest's.")
@click.option("--tolerance", type=TOLERANCE, default=None,
              show_default="the plan's providers': 1e-4 for the CPU, the largest of its devices' providers' otherwise",
              help="Pass when max|a-b| <= tolerance * max(1, max|reference|) for every output.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Timed requests (after the --warmup ones).")
@click.option("--warmup", type=click.IntRange(min=0, max=MAX_WARMUP), default=1, show_default=True,
              help="Untimed requests run one at a time first (first runs allocate and fill caches); raise it to "
                   "measure the steady state.")
@click.option("--output", "output_file", metavar="FILE.npz", help="Write the outputs here (atomically).")
@click.option("--threads", type=click.IntRange(min=0, max=MAX_THREADS_HERE), default=None,
              show_default="cores / devices; all cores for one device",
              help="onnxruntime intra-op threads per worker, 0 for onnxruntime's own default (all cores); at "
                   f"most 4 x this machine's cores ({MAX_THREADS_HERE} here): more only oversubscribe them.")
@click.option("--emulate", is_flag=True,
              help="Run as on the plan's devices and network: pad each fragment run to its predicted_ms and hold "
                   "each device-to-device send for its transfer time (one uplink per device on a switched medium, "
                   "one channel for all on a shared one).")
@click.option("--dilate", type=float, default=None, metavar="K", show_default="1",
              help=f"With --emulate: stretch every predicted time and delay by K (1 to {MAX_DILATE:g}) and divide "
                   "every reported time by K, so a host slower than the devices still keeps their time (the run "
                   "takes K times longer: raise --timeout to match). Fragment runs that overrun their padding are "
                   "named on stderr with a K that would leave room.")
@click.option("--timeout", type=TIMEOUT, default=60.0, show_default=True,
              help="Seconds allowed for start-up (reaching every worker included) and for each request; at most "
                   f"{MAX_TIMEOUT_S:g} (a day).")
@click.option("--addresses", "address_pairs", multiple=True, metavar="NAME=tcp://HOST:PORT",
              help="Reach device NAME's `edgec worker` there, instead of the manifest's address (repeatable).")
@click.option("--keys", "keys_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="The cluster's keys folder (`edgec keygen`): every connection is encrypted and only workers "
                   f"holding the cluster's keys are accepted. This machine uses DIR/private/{COORDINATOR}.key_secret, "
                   "the only key workers take runs from. Without --keys, a run whose workers are all started here "
                   "makes keys of its own, in memory only.")
@click.option("--inflight", type=click.IntRange(min=1, max=MAX_INFLIGHT), default=None,
              show_default="the plan's pipeline depth",
              help="Requests kept in flight through the stages (outputs still come back in request order); 1 "
                   "runs one request at a time.")
@click.option("--compress", type=click.Choice(COMPRESS_MODES, case_sensitive=False), default="none",
              help="How devices send tensors to each other: lz4 or zstd always (a tensor that does not shrink "
                   "goes raw), auto where the link's bandwidth in the manifest makes it pay (judged from each "
                   "worker's measured compress speed), none never. Inputs and outputs always travel raw.")
@click.option("--heartbeat-ms", type=click.IntRange(min=MIN_HEARTBEAT_MS, max=MAX_HEARTBEAT_MS),
              default=HEARTBEAT_MS,
              help=f"Heartbeat interval on every worker connection. A device whose worker exits, whose connection "
                   f"drops, or that sends nothing for {HEARTBEAT_MISSES} intervals is lost: a build compiled with "
                   "--fallbacks switches to the plan without it and re-runs the requests not completed; otherwise "
                   "the run fails (exit 3).")
@click.option("--report", "report_file", metavar="FILE.json",
              help="Write an accuracy report (atomically): each fragment's and transfer's predicted against measured "
                   "time (median over the --repeat requests), latency and throughput errors; the worst "
                   "offenders go to stderr.")
@click.option("--trace", "trace_file", metavar="FILE.json",
              help="Write the measured timeline of the --repeat requests (atomically) in Chrome's trace event "
                   "format, for Perfetto (ui.perfetto.dev) or `edgec simulate --plot --trace`: each fragment run, "
                   "each transfer between devices and each request, per device.")
@click.option("--adapt", is_flag=True,
              help="Switch, between requests and losing none, among the plans the build kept (compile --keep N, "
                   "--shifts, --fallbacks) when a device's compute or a link's measured speed drifts from what the "
                   "plan in use assumed: every kept plan is re-costed with the measured figures and the best taken.")
@click.option("--adapt-threshold", type=float, default=THRESHOLD, show_default=True, metavar="FRACTION",
              help="With --adapt: the relative change of the plan in use, re-costed with the measured figures, "
                   "that counts as drift.")
@click.option("--adapt-for", type=click.Choice(["latency", "throughput"]), default=None,
              show_default="the build's objective; latency if the manifest does not say",
              help="With --adapt: re-cost plans by the latency of one request or by the period of streamed ones.")
@click.option("--slow", "slow_specs", multiple=True, metavar="NAME=FACTOR[@REQUEST]",
              help="With --emulate: from the REQUEST-th timed request (from 0; default 0) on, device NAME's fragment "
                   "runs take FACTOR x their predicted time, as if it slowed down (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object on stdout.")
@click.option("-v", "--verbose", is_flag=True,
              help="A line per timed request on stderr (on a terminal, a progress bar stands in for them).")
@click.pass_context
def run(ctx: click.Context, manifest: str, inputs_file, input_pairs, random_inputs, seed, verify, model_file,
        tolerance, repeat, warmup, output_file, threads, emulate, dilate, timeout, address_pairs, keys_dir, inflight,
        compress, heartbeat_ms, report_file, trace_file, adapt, adapt_threshold, adapt_for, slow_specs,
        as_json, verbose) -> None:
    """Run MANIFEST (a manifest.json, or the folder holding one) on the devices' workers: at each device's
    address (or --addresses), or in a worker process started on this machine for a device without one."""
    with request_lines(verbose):
        ctx.exit(command_exit_code(lambda: _run(
        manifest, inputs_file, input_pairs, random_inputs, seed, verify, model_file, tolerance, repeat, output_file,
        threads, emulate, timeout, as_json, address_pairs, keys_dir, inflight, compress=compress,
        heartbeat_ms=heartbeat_ms, report_file=report_file, dilate=dilate, trace_file=trace_file, adapt=adapt,
        adapt_threshold=adapt_threshold, adapt_for=adapt_for, slow_specs=slow_specs, warmup=warmup)))


def _run(manifest_arg, inputs_file, input_pairs, random_inputs, seed, verify, model_file, tolerance, repeat,
         output_file, threads, emulate, timeout, as_json, address_pairs, keys_dir, inflight, compress="none",
         heartbeat_ms=HEARTBEAT_MS, report_file=None, dilate=None, trace_file=None, adapt=False,
         adapt_threshold=THRESHOLD, adapt_for=None, slow_specs=(), warmup=1) -> int:
    manifest, result, checked = execute(manifest_arg, npz=inputs_file, pairs=input_pairs, random_inputs=random_inputs,
                                        seed=seed, verify=verify, model=model_file, tolerance=tolerance,
                                        repeat=repeat, warmup=warmup, threads=threads, emulate=emulate,
                                        timeout=timeout, addresses=parse_addresses(address_pairs), keys=keys_dir,
                                        inflight=inflight,
                                        compress=compress, heartbeat_ms=heartbeat_ms, report=report_file,
                                        dilate=dilate, trace=trace_file, adapt=adapt,
                                        adapt_threshold=adapt_threshold, adapt_for=adapt_for,
                                        slow=parse_slow(slow_specs))
    if result.accuracy is not None:
        for line in summary_lines(result.accuracy):
            click.echo(f"edgec: {line}", err=True)
    if output_file:
        write_npz(output_file, result.outputs)
    if as_json:
        click.echo(json.dumps(report(manifest, result, checked)))
    else:
        _print_human(manifest, result, checked)
    return EXIT_VERIFY_FAILED if checked is not None and not checked.passed else EXIT_OK


def _stats(a: np.ndarray) -> str:
    if a.size == 0 or a.dtype.kind not in "biuf":
        return ""
    v = a.astype(np.float64)
    return f"  min {v.min():.4g}  max {v.max():.4g}  mean {v.mean():.4g}"


MIN_THROUGHPUT_REQUESTS = 5  # fewer timed requests measure start-up and hand-offs, not a rate


def _print_human(manifest: Manifest, result: RunResult, checked: RequestsChecked | None) -> None:
    click.echo("outputs:")
    for spec in manifest.outputs:
        a = result.outputs[spec.name]
        click.echo(f"  {spec.name}  shape {list(a.shape)}  {a.dtype.name}{_stats(a)}")
    lat = result.latencies_ms
    click.echo(f"latency: median {result.latency_ms:.2f} ms, min {min(lat):.2f} ms over {len(lat)} request(s) "
               f"(after {result.warmup} warm-up)" + (f"; with up to {result.inflight} in flight a request also waits "
                                                      "for those ahead of it (--inflight 1: a lone request's)"
                                                      if result.inflight > 1 else ""))
    if len(lat) >= MIN_THROUGHPUT_REQUESTS:
        click.echo(f"throughput: {result.throughput_ips:.2f} requests/s with up to {result.inflight} in flight")
    else:
        click.echo(f"throughput: not measured over {len(lat)} request(s) (--repeat {MIN_THROUGHPUT_REQUESTS} or more "
                   "measures it)")
    for f in result.failovers:
        click.echo(f"failover: device {f['device']} lost after {f['at_request']} request(s); finished on {f['plan']} "
                   f"({result.completed} completed, {result.lost} lost)")
    for a in result.adaptations:
        took = f"kept {a['from']}" if a["to"] == a["from"] else \
            f"switched to {a['to']} after {a['switched_at']} request(s)" if a["switched_at"] is not None else \
            f"chose {a['to']}, but the run ended first"
        click.echo(f"adapt: after {a['at_request']} request(s), {a['reason']}: {took} (re-costed "
                   f"{a['recosted_ms'][a['to']]:.2f} ms)")
    busy = ", ".join(f"{n} {statistics.median(ms):.2f} ms" for n, ms in result.device_run_ms.items() if ms)
    click.echo(f"fragment run time (median): {busy}")
    if result.emulation is not None:
        overran = len(result.emulation["overruns"])
        click.echo(f"emulation: dilated x{result.emulation['dilate']:g} (times above divided by it); "
                   f"{overran or 'no'} fragment(s) overran their padding")
    if checked is not None:
        verdict = "PASSED" if checked.passed else "FAILED"
        click.echo(f"verify: {verdict}  max|diff| {checked.max_abs_diff:.3g} on {checked.worst_output!r} over "
                   f"{checked.requests_checked} request(s) (tolerance {checked.tolerance:g} x max(1, max|reference|))")


def main() -> None:
    run.main(prog_name="python -m edgec.runtime")


@click.command("keygen", cls=RunCommand, context_settings={"show_default": True},
               epilog="Copy DIR/public/ to every machine, and DIR/private/NAME.key_secret to machine NAME only. "
                      f"Workers accept runs only from the '{COORDINATOR}' key: give "
                      f"DIR/private/{COORDINATOR}.key_secret to the machines that run `edgec run --keys DIR`, and to "
                      "no device. Run again with more names to add members; existing keys are kept, never "
                      "overwritten.")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--name", "names", multiple=True, metavar="NAME", help="A device to make a key pair for (repeatable).")
@click.option("--devices", "devices_file", type=click.Path(), metavar="CLUSTER.yaml|manifest.json",
              help="Make a key pair for every device of this cluster file or build (its devices[].name).")
@click.pass_context
def keygen(ctx: click.Context, folder, names, devices_file) -> None:
    """Write CURVE key pairs (with pyzmq's zmq.auth) into FOLDER for the named devices and "coordinator"."""
    try:
        wanted = list(names)
        if devices_file:
            path = os.path.join(devices_file, "manifest.json") if os.path.isdir(devices_file) else devices_file
            wanted = names_from_file(path) + wanted
        if not wanted:
            raise InputError("keygen: name the devices with --name NAME (repeatable) or --devices cluster.yaml")
        if COORDINATOR in wanted:
            wanted.remove(COORDINATOR)
        for name, created in write_keys(folder, [COORDINATOR, *wanted]):
            where = os.path.join(folder, "private", f"{name}.key_secret")
            click.echo(f"{'created' if created else 'kept   '} {name}: {where}")
        code = EXIT_OK
    except EdgecRuntimeError as exc:
        click.echo(f"edgec: {exc}", err=True)
        code = exc.exit_code
    ctx.exit(code)


class _ProfileFormatter(logging.Formatter):
    """`edgec: warning: ...` for warnings, `edgec:   ...` (a detail, with --verbose) below them: as the full
    install prints them."""

    def format(self, record: logging.LogRecord) -> str:
        kind = "warning: " if record.levelno >= logging.WARNING else "  "
        return f"edgec: {kind}{record.getMessage()}"


@click.command("profile", cls=RunCommand, epilog="Exit codes: 0 ok, 2 bad input (or, with --strict, a busy "
               "machine or a noisy figure), 3 a failure while measuring.")
@measuring_options
@verbose_option
@click.pass_context
def profile(ctx: click.Context, output, model, threads, providers, strict, quick, power_idle, power_busy,
            verbose) -> None:
    """Measure this machine and write a device profile (flow-style YAML: a profile file for `edgec compile`).

    Each figure is measured per thread count and repeated until its spread is small; the load of the
    machine is checked before and during.  A busy machine or a figure that stays noisy is a warning, or
    with --strict an error.  Needs onnx, which builds the benchmark models: install edgec-runtime[profile].
    Refining a profile from a run's report (--refine) is the full install's."""
    try:
        with runtime_log_to_stderr(_ProfileFormatter(), logging.WARNING):
            if verbose:  # the profile's details, not every INFO record of the runtime
                logging.getLogger(PROFILE_LOGGER).setLevel(logging.INFO)
            measure_to(write_profile_flow, lambda msg: click.echo(f"edgec: {msg}", err=True), output=output,
                       model=model, threads=threads, strict=strict, quick=quick, power_idle=power_idle,
                       power_busy=power_busy, verbose=verbose, providers=providers)
        code = EXIT_OK
    except ModuleNotFoundError as exc:
        if exc.name != "onnx":
            raise
        click.echo("edgec: edgec profile builds its benchmark models with onnx, which is not installed: "
                   "pip install 'edgec-runtime[profile]' (or pip install onnx)", err=True)
        code = EXIT_INPUT
    except EdgecRuntimeError as exc:
        click.echo(f"edgec: {exc}", err=True)
        code = exc.exit_code
    ctx.exit(code)


class _DeviceGroup(OneLineErrors, click.Group):
    pass


@click.group("edgec", cls=_DeviceGroup, context_settings={"show_default": True})
@click.version_option(edgec_version(), "-V", "--version")
def device_cli() -> None:
    """edgec on a device that only runs builds (the distribution edgec-runtime, without the compiler)."""


device_cli.add_command(run)
device_cli.add_command(run_all)
device_cli.add_command(serve)
device_cli.add_command(generate)
device_cli.add_command(worker)
device_cli.add_command(keygen)
device_cli.add_command(profile)


def device_main() -> None:
    """The `edgec` command of the device-only distribution (runtime/dist)."""
    device_cli.main(prog_name="edgec")
