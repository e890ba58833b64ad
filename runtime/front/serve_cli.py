"""`edgec serve`: a build, or every service of an allocation, behind the Open Inference Protocol."""

from __future__ import annotations

import os

import click

from ..command import RunCommand
from ..coordinator.liveness import HEARTBEAT_MS
from ..device.session import MAX_INFLIGHT
from ..errors import InputError
from ..machine import MAX_THREADS_HERE, edgec_version
from ..wire.compress import MODES as COMPRESS_MODES
from .api import MAX_HEARTBEAT_MS, MIN_HEARTBEAT_MS, parse_addresses
from .kit import command_exit_code


_SERVE_EPILOG = ("Exit codes: 0 stopped by SIGTERM or SIGINT (every request accepted answered, the workers stopped), "
                 "2 bad input (a build, an address it cannot listen on, a non-loopback address without --token-file), "
                 "3 a worker failed at start-up. Logs `edgec: ready: ...` on stderr once it serves, then a status line "
                 "a minute.")


@click.command("serve", cls=RunCommand, epilog=_SERVE_EPILOG, context_settings={"show_default": True})
@click.argument("build", type=click.Path())
@click.option("--http", "http_bind", default="127.0.0.1:8000", metavar="HOST:PORT",
              help="Where the Open Inference Protocol's REST endpoints listen (port 0: any free port).")
@click.option("--grpc", "grpc_bind", default=None, metavar="HOST:PORT",
              help="Also serve the protocol's gRPC service (inference.GRPCInferenceService) here.")
@click.option("--model-name", default=None, metavar="NAME", show_default="the build folder's name",
              help="The name clients ask for (/v2/models/NAME); not with an allocation, whose services keep theirs.")
@click.option("--token-file", type=click.Path(dir_okay=False), metavar="FILE",
              help="A bearer token (one line) every request must carry; required on a non-loopback address.")
@click.option("--max-body-mb", type=click.FloatRange(min=0, min_open=True), default=None,
              show_default="sized from the model's inputs", help="Larger request bodies are refused unread (413).")
@click.option("--queue", type=click.IntRange(min=1, max=100_000), default=None,
              show_default="4 x --inflight, at least 64", help="Requests waiting behind those in flight; more get 429.")
@click.option("--threads", type=click.IntRange(min=0, max=MAX_THREADS_HERE), default=None,
              show_default="cores / local devices", help="onnxruntime intra-op threads per local worker.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=60.0,
              help="Seconds allowed for start-up and for each request in the devices.")
@click.option("--addresses", "address_pairs", multiple=True, metavar="NAME=tcp://HOST:PORT",
              help="As `edgec run --addresses` (repeatable).")
@click.option("--keys", "keys_dir", type=click.Path(file_okay=False), metavar="DIR", help="As `edgec run --keys`.")
@click.option("--inflight", type=click.IntRange(min=1, max=MAX_INFLIGHT), default=None,
              show_default="the plan's pipeline depth", help="Requests in the devices at once.")
@click.option("--compress", type=click.Choice(COMPRESS_MODES, case_sensitive=False), default="none",
              help="As `edgec run --compress`.")
@click.option("--heartbeat-ms", type=click.IntRange(min=MIN_HEARTBEAT_MS, max=MAX_HEARTBEAT_MS),
              default=HEARTBEAT_MS, help="As `edgec run --heartbeat-ms`.")
@click.option("--adapt", is_flag=True, help="As `edgec run --adapt`: switch between the build's kept plans.")
@click.option("--status-every", type=click.FloatRange(min=0.1), default=60.0, hidden=True,
              help="Seconds between status lines (tests shorten it).")
@click.pass_context
def serve(ctx: click.Context, build, http_bind, grpc_bind, model_name, token_file, max_body_mb, queue, threads,
          timeout, address_pairs, keys_dir, inflight, compress, heartbeat_ms, adapt, status_every) -> None:
    """Serve BUILD (a build folder, or an `edgec allocate` folder: every service at its own
    /v2/models/NAME) with the Open Inference Protocol (KServe v2) over HTTP, and gRPC with --grpc, until
    SIGTERM or SIGINT. Binds 127.0.0.1 unless told otherwise."""
    from ..serve.server import serve_forever

    def body() -> int:
        builds = _served_builds(build, model_name)
        if address_pairs and len(builds) > 1:
            raise InputError(f"--addresses: {build} is an allocation; its builds carry their devices' addresses")
        return serve_forever(builds, http=http_bind, grpc=grpc_bind, token_file=token_file,
                             max_body=None if max_body_mb is None else int(max_body_mb * (1 << 20)),
                             version=edgec_version(), status_every=status_every, threads=threads, timeout=timeout,
                             addresses=parse_addresses(address_pairs), keys=keys_dir,
                             inflight=inflight, compress=compress, heartbeat_ms=heartbeat_ms, adapt=adapt, queue=queue)

    ctx.exit(command_exit_code(body))


def _served_builds(build: str, model_name: str | None) -> dict[str, str]:
    """{model name: build folder}: one build, or every service of an allocation."""
    from .runall import load_allocation

    folder = build[:-len("manifest.json")] if build.endswith("manifest.json") else build
    if os.path.isfile(os.path.join(folder, "allocation.json")):
        if model_name is not None:
            raise InputError(f"--model-name: {build} is an allocation, whose services keep their own names")
        allocation = load_allocation(folder)
        return {s.name: str(s.manifest) for s in allocation.services}
    name = model_name or os.path.basename(os.path.normpath(os.path.abspath(folder or ".")))
    if not name or "/" in name:
        raise InputError(f"--model-name {name!r}: expected a name without '/'")
    return {name: build}
