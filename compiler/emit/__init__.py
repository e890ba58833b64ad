"""Emit: (normalised model, LayerGraph, Plan) -> per-device ONNX fragments and manifest.json, atomically.

In processing order:

- encode.py: `assemble`, an ONNX model from nodes and weights, checked and encoded as byte chunks.
- tiles.py: `build_tile_model`, a segment's nodes restricted to the rows (and columns) one tile computes.
- fragments.py: `build_fragments`, the plan's fragments (a pipeline stage's layers, or each tile).
- schedule.py: `assemble_manifest`, each device's steps and the transfer list around those fragments.
- output.py: `write_output`, the build written beside OUTDIR, checked by onnxruntime and by the runtime's
  own manifest parser, then swapped into place (`check_output_dir`: what OUTDIR may hold before).

With ingest/, the only code that handles ONNX protobufs; the planners never import it.
"""

from .encode import EncodedModel
from .fragments import EmittedFragment, build_fragments
from .output import (EXTRA_KEYS, ExtraBuild, alternative_build, alternative_folder, check_output_dir, extra_entries, fallback_build,
                     manifest_text, write_output)
from .schedule import assemble_manifest
from .tiles import build_tile_model

__all__ = ["EmittedFragment", "EncodedModel", "ExtraBuild", "EXTRA_KEYS", "build_fragments", "build_tile_model",
           "assemble_manifest", "write_output", "check_output_dir", "manifest_text", "extra_entries", "fallback_build",
           "alternative_build", "alternative_folder"]
