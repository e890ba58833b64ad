"""edgec on a device: the package root of the device-only distribution (edgec-runtime, runtime/dist).

`edgec.run(...)` runs a compiled build, as `edgec run --json` does (see `edgec.runtime.front.api.run`), and
`edgec.Cluster(...)` serves it request by request (`edgec.runtime.serve.session.Cluster`);
`edgec.generate(...)` generates tokens with a build compiled with --generate, as `edgec generate --json` does
(`edgec.runtime.generate.api.generate`). The
compiler is not installed here: the full distribution's root (compiler/_root) adds `edgec.compile`.
"""

from importlib import metadata as _metadata

__all__ = ["run", "generate", "Cluster", "__version__"]

__version__ = _metadata.version("edgec-runtime")


def __getattr__(name: str):
    """`edgec.run`, `edgec.generate` and `edgec.Cluster`, imported on first use so that `import edgec` stays light."""
    if name == "run":
        from edgec.runtime.front.api import run

        return run
    if name == "generate":
        from edgec.runtime.generate.api import generate

        return generate
    if name == "Cluster":
        from edgec.runtime.serve.session import Cluster

        return Cluster
    raise AttributeError(f"module 'edgec' has no attribute {name!r} (the device-only distribution has no compiler)")
