"""Starting and stopping `edgec serve` in the serving tests: a process on loopback ports it picks itself."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgec.runtime.manifest.load import load_manifest
from tests.runtime.conftest import build_chain

EDGEC = [sys.executable, "-c", "from edgec.compiler.cli import main; main()"]
_READY = re.compile(r"edgec: ready: http://127\.0\.0\.1:(\d+)/\S*(?:.*grpc 127\.0\.0\.1:(\d+))?")


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """The chain model built once per test module (import the fixture into the module that uses it)."""
    folder = tmp_path_factory.mktemp("chain")
    build_chain(folder)
    return folder


class Server:
    """`edgec serve BUILD --http 127.0.0.1:0 ...`, its ports read from its ready line; stop() sends SIGTERM."""

    def __init__(self, build: Path, *args: str, timeout: float = 60.0):
        self.proc = subprocess.Popen([*EDGEC, "serve", str(build), "--http", "127.0.0.1:0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.http_port = self.grpc_port = None
        deadline = time.monotonic() + timeout
        for line in self.proc.stderr:
            self.lines.append(line)
            m = _READY.search(line)
            if m:
                self.http_port = int(m.group(1))
                self.grpc_port = int(m.group(2)) if m.group(2) else None
                break
            if time.monotonic() > deadline:
                break
        if self.http_port is None:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("edgec serve did not get ready: " + "".join(self.lines))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(5)
        return code


def reference(build: Path, inputs: dict) -> dict:
    m = load_manifest(build / "manifest.json")
    session = ort.InferenceSession(str(m.model_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in m.outputs]
    return dict(zip(names, session.run(names, inputs)))


def assert_close(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert np.abs(got - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))
