"""edgec: compile an ONNX model so that several edge devices run it together.

This file is the ``edgec`` package itself. pyproject.toml maps it here (``package-dir``), beside the
runtime that every installation carries, so that the repository's top level holds only its folders:
compiler/, runtime/, models/ and profiles/ install as ``edgec.compiler``, ``edgec.runtime``,
``edgec.models`` and ``edgec.profiles``.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("edgec")
except _metadata.PackageNotFoundError:  # the device-only distribution (runtime/dist)
    __version__ = _metadata.version("edgec-runtime")
