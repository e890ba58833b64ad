"""edgec: compile an ONNX model so that several edge devices run it together.

The Python API for build scripts, the same as the command line:

    import edgec
    summary = edgec.compile("model.onnx", "cluster.yaml", "build/")      # what `edgec compile --json` prints
    report = edgec.run("build/", random_inputs=True, verify=True)       # what `edgec run --json` prints
    assert report["verify"]["passed"]
    tokens = edgec.generate("lm-build/", prompt_ids=[5, 17, 300], max_new_tokens=8)  # `edgec generate --json`
    with edgec.Cluster("build/") as cluster:                            # a session serving requests
        outputs = cluster.infer({"input": x})                           # {output name: array}

This file is the ``edgec`` package of the full distribution. pyproject.toml maps it here
(``package-dir``), so that the repository's top level holds only its folders: compiler/, runtime/,
models/ and profiles/ install as ``edgec.compiler``, ``edgec.runtime``, ``edgec.models`` and
``edgec.profiles``. The device-only distribution (runtime/dist) has its own root, runtime/dist/root, with
``run`` and no ``compile``: nothing under runtime/ imports the compiler.
"""

from importlib import metadata as _metadata

__all__ = ["compile", "run", "generate", "Cluster", "__version__"]

__version__ = _metadata.version("edgec")


def __getattr__(name: str):
    """`edgec.compile`, `edgec.run`, `edgec.generate` and `edgec.Cluster`, imported on first use: `import edgec` stays light."""
    if name == "compile":
        from edgec.compiler.api import compile

        return compile
    if name == "run":
        from edgec.runtime.front.api import run

        return run
    if name == "generate":
        from edgec.runtime.generate.api import generate

        return generate
    if name == "Cluster":
        from edgec.runtime.serve.session import Cluster

        return Cluster
    raise AttributeError(f"module 'edgec' has no attribute {name!r}")
