"""Fragment shipping: the fragment files a worker's cache lacks (its `opened` lists them), sent in BLOB_CHUNK
pieces with at most BLOB_WINDOW unacknowledged, each file hashed as it is read. A part of WorkerPool (pool.py)."""

from __future__ import annotations

import hashlib
from typing import Iterator

from ..errors import InputError, RunError
from ..manifest.types import Fragment
from ..wire.net import Endpoint
from ..wire.protocol import BLOB_CHUNK, BLOB_WINDOW
from .workers import WorkerLink

__all__ = ["Shipping"]


class Shipping:
    """WorkerPool's fragment shipping: `opened` starts it, each `ack` sends the next piece."""

    def _on_opened(self, w: WorkerLink, msg: dict, payload) -> None:
        if w.phase != "welcomed":
            return self.drops.drop(f"unexpected 'opened' from {w.name}")
        port = msg["data_port"]
        if port is not None:
            host = w.endpoint.host
            if w.local and self._local_data_host(w.name):
                host = self._local_data_host(w.name)
            w.data_addr = str(Endpoint(host, port))
        frags = {f.sha256.lower(): f for f in self.manifest.device_fragments(w.name)}
        need = [frags[s] for s in msg["need"] if isinstance(s, str) and s in frags]
        if len(need) != len(msg["need"]):
            raise RunError(f"{w.where}: asked for fragments that are not its own")
        w.phase = "opened"
        w.blobs = self._blobs(w, need)
        self._feed(w)

    def _blobs(self, w: WorkerLink, frags: list[Fragment]) -> Iterator[tuple[dict, bytes]]:
        for frag in frags:
            path = self.manifest.fragment_path(frag)
            where = f"{self.manifest.path}: fragment {frag.id} ({frag.file})"
            h, offset = hashlib.sha256(), 0
            try:
                size = path.stat().st_size
                with open(path, "rb") as fh:
                    while True:
                        data = fh.read(BLOB_CHUNK)
                        h.update(data)
                        yield {"t": "blob", "sha256": frag.sha256.lower(), "offset": offset, "size": size}, data
                        offset += len(data)
                        if offset >= size or not data:
                            break
            except OSError as exc:
                raise InputError(f"{where}: cannot read it ({exc.strerror or exc})") from None
            if offset != size or h.hexdigest() != frag.sha256.lower():
                raise InputError(f"{where}: the file changed while it was being sent")

    def _feed(self, w: WorkerLink) -> None:
        while w.blobs is not None and w.unacked < BLOB_WINDOW:
            item = next(w.blobs, None)
            if item is None:
                w.blobs = None
                return
            header, data = item
            self._send(w, header, data)
            w.unacked += 1
            w.fragment_bytes_sent += len(data)

    def _on_ack(self, w: WorkerLink, msg: dict, payload) -> None:
        w.unacked = max(0, w.unacked - 1)
        self._feed(w)
