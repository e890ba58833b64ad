"""edgec: compile an ONNX model so that several edge devices run it together.

The Python API for build scripts, the same as the command line:

    import edgec
    summary = edgec.compile("model.onnx", "cluster.yaml", "build/")      # what `edgec compile --json` prints
    report = edgec.run("build/", random_inputs=True, verify=True)       # what `edgec run --json` prints
    assert report["verify"]["passed"]

This file is the ``edgec`` package itself. pyproject.toml maps it here (``package-dir``), beside the
runtime that every installation carries, so that the repository's top level holds only its folders:
compiler/, runtime/, models/ and profiles/ install as ``edgec.compiler``, ``edgec.runtime``,
``edgec.models`` and ``edgec.profiles``. The device-only distribution (runtime/dist) has ``run`` and no
``compile``.
"""

from importlib import metadata as _metadata

__all__ = ["compile", "run", "__version__"]

try:
    __version__ = _metadata.version("edgec")
except _metadata.PackageNotFoundError:  # the device-only distribution (runtime/dist)
    __version__ = _metadata.version("edgec-runtime")


def __getattr__(name: str):
    """`edgec.compile` and `edgec.run`, imported on first use: `import edgec` stays light, and the
    device-only distribution, which has no compiler, still imports."""
    if name == "compile":
        from edgec.compiler.api import compile

        return compile
    if name == "run":
        from edgec.runtime.api import run

        return run
    raise AttributeError(f"module 'edgec' has no attribute {name!r}")
