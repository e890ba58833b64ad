"""`edgec run-all`: every build of an `edgec allocate` folder at once, each on its own devices."""

from __future__ import annotations

import json

import click

from ..command import EXIT_OK, EXIT_PIPE, EXIT_VERIFY_FAILED, RunCommand
from ..machine import MAX_THREADS_HERE
from .api import MAX_TIMEOUT_S, MAX_WARMUP
from .kit import SEED, TIMEOUT, TOLERANCE, command_exit_code


_RUN_ALL_EPILOG = ("Exit codes: 0 ok (a missed SLA is reported, not an error), 1 verification failed, 2 bad input, "
                   f"3 run failure of a service, {EXIT_PIPE} stdout closed early, 128+N stopped by signal N.")


@click.command("run-all", cls=RunCommand, epilog=_RUN_ALL_EPILOG, context_settings={"show_default": True})
@click.argument("outdir", type=click.Path(file_okay=False))
@click.option("--repeat", type=click.IntRange(min=1), default=1, help="Timed requests per service (after the --warmup ones).")
@click.option("--warmup", type=click.IntRange(min=0, max=MAX_WARMUP), default=1, show_default=True,
              help="Untimed requests each service runs one at a time first, as `edgec run --warmup`.")
@click.option("--verify", is_flag=True, help="Compare every service's outputs with its source model run whole.")
@click.option("--tolerance", type=TOLERANCE, default=None, show_default="each plan's providers'",
              help="As `edgec run --tolerance`.")
@click.option("--seed", type=SEED, default=0, help="Seed of the random inputs.")
@click.option("--threads", type=click.IntRange(min=0, max=MAX_THREADS_HERE), default=None,
              show_default="cores / all the services' devices", help="onnxruntime intra-op threads per worker.")
@click.option("--emulate", is_flag=True, help="As `edgec run --emulate`: every service as on its planned devices.")
@click.option("--timeout", type=TIMEOUT, default=60.0,
              help=f"Seconds allowed for each service's start-up and for each request; at most {MAX_TIMEOUT_S:g}.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object on stdout.")
@click.pass_context
def run_all(ctx: click.Context, outdir, repeat, warmup, verify, tolerance, seed, threads, emulate, timeout,
            as_json) -> None:
    """Run every build of an `edgec allocate` OUTDIR at once, each on its own devices (random inputs), and
    report each service's measured median latency against its SLA. A device shared by several services
    (allocate --share) gets a local worker per service. Progress lines on stderr name their service."""
    from .runall import run_all as run_all_api

    def body() -> int:
        result = run_all_api(outdir, repeat=repeat, verify=verify, tolerance=tolerance, threads=threads,
                             emulate=emulate, timeout=timeout, seed=seed, warmup=warmup)
        click.echo(json.dumps(result) if as_json else _format_run_all(result))
        return EXIT_VERIFY_FAILED if result["verify_passed"] is False else EXIT_OK

    ctx.exit(command_exit_code(body))


def _format_run_all(result: dict) -> str:
    lines = []
    for name, s in result["services"].items():
        verdict = "met" if s["sla_met"] else "MISSED"
        check = "" if s["verify"] is None else f", verify {'PASSED' if s['verify']['passed'] else 'FAILED'}"
        lines.append(f"{name}: median {s['latency_ms']:.2f} ms (predicted {s['predicted_latency_ms']:.2f} ms) on "
                     f"{', '.join(s['devices'])}: SLA {s['sla_ms']:g} ms {verdict}{check}")
    lines.append(f"all SLAs met: {'yes' if result['all_sla_met'] else 'no'}")
    return "\n".join(lines)
