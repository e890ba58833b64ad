"""ONNX Runtime sessions for one device's fragments: load (from bytes whose sha256 was checked) and run."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

import numpy as np
import onnxruntime as ort

from ..errors import InputError, RunError, one_line
from ..manifest.types import Fragment, Manifest
from ..manifest.load import file_sha256
from ..providers import missing_provider, ort_providers, refusal

__all__ = ["Executor", "session_options"]

logger = logging.getLogger(__name__)


def session_options(threads: int = 0, stop_spinning: bool = False) -> ort.SessionOptions:
    """Sequential execution with `threads` intra-op threads (0 = onnxruntime's default, all cores)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(0, threads)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3  # errors only: warnings would clutter the user's stderr
    if stop_spinning:
        # A worker's next move after Run() is transport: idle pool threads spinning on would take the
        # cores that zmq's I/O threads and the other local workers need.
        opts.add_session_config_entry("session.force_spinning_stop", "1")
    return opts


class Executor:
    """Runs the fragments that belong to `device`. `files` says where each fragment's file is (the build
    folder by default; a worker's cache, a folder only its user can write). `load` checks each file's
    sha256 just before onnxruntime reads it. (onnxruntime loads from a path: from bytes it keeps a second
    copy of the weights, 65 MB more for ResNet-50's second half.)"""

    def __init__(self, manifest: Manifest, device: str, threads: int = 0,
                 files: Callable[[Fragment], Path] | None = None):
        self.manifest = manifest
        self.device = device
        self.threads = threads
        self.files = files or manifest.fragment_path
        self.fragments = {f.id: f for f in manifest.device_fragments(device)}
        self.sessions: dict[str, ort.InferenceSession] = {}
        self.providers = next((d.providers for d in manifest.devices if d.name == device), ())

    def check_providers(self) -> None:
        """InputError when this onnxruntime lacks a provider the plan gives the device: onnxruntime itself would
        only warn and run the fragments on the CPU."""
        available = ort.get_available_providers()
        missing = missing_provider(self.providers, available)
        if missing is not None:
            raise InputError(refusal(f"device {self.device}", missing, available))

    def load(self) -> None:
        self.check_providers()
        for frag in self.fragments.values():
            self.sessions[frag.id] = self._session(frag)

    def close(self) -> None:
        self.sessions.clear()

    def _session(self, frag: Fragment) -> ort.InferenceSession:
        where = f"{self.manifest.path}: fragment {frag.id} ({frag.file})"
        path = self.files(frag)
        try:
            digest = file_sha256(path)
        except OSError as exc:
            raise InputError(f"{where}: cannot read it ({exc.strerror or exc})") from None
        if digest != frag.sha256.lower():
            raise InputError(f"{where}: sha256 mismatch (the manifest expects {frag.sha256[:12]}...); the file "
                             "was changed after compiling")
        try:
            sess = ort.InferenceSession(str(path), session_options(self.threads, stop_spinning=True),
                                        providers=ort_providers(self.providers))
        except Exception as exc:  # onnxruntime raises several pybind error types
            raise InputError(f"{where}: onnxruntime cannot load it: {one_line(exc, 200)}") from None
        registered = sess.get_providers()
        lost = missing_provider(self.providers, registered)
        if lost is not None:  # the provider exists but would not start (a driver missing, say): no silent CPU
            raise InputError(f"{where}: device {self.device}: onnxruntime did not register {lost} for it "
                             f"(the session has {', '.join(registered)})")
        graph_inputs = {i.name for i in sess.get_inputs()}
        graph_outputs = {o.name for o in sess.get_outputs()}
        missing = sorted(graph_inputs - set(frag.inputs))
        if missing:
            raise InputError(f"{where}: graph input(s) {missing} are not in the manifest's fragment inputs")
        extra = sorted(set(frag.inputs) - graph_inputs)
        if extra:
            raise InputError(f"{where}: manifest input(s) {extra} are not graph inputs of the fragment")
        unknown = sorted(set(frag.outputs) - graph_outputs)
        if unknown:
            raise InputError(f"{where}: manifest output(s) {unknown} are not graph outputs of the fragment")
        return sess

    def run(self, fragment_id: str, store: dict[str, np.ndarray]) -> float:
        """Run one fragment on the store (outputs are added to it); returns the run time in seconds."""
        frag = self.fragments[fragment_id]
        sess = self.sessions.get(fragment_id)
        if sess is None:
            sess = self.sessions[fragment_id] = self._session(frag)
        feeds = {name: store[name] for name in frag.inputs}
        start = time.perf_counter()
        try:
            results = sess.run(list(frag.outputs), feeds)
        except Exception as exc:
            raise RunError(f"device {self.device}: fragment {frag.id} ({frag.file}) failed: {one_line(exc, 300)}") from None
        elapsed = time.perf_counter() - start
        store.update(zip(frag.outputs, results))
        return elapsed
