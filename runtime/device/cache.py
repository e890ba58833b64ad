"""A worker's fragment cache: ONNX files keyed by their sha256, received in chunks from a coordinator.

A file is written under a temporary name, hashed as it arrives, and renamed to `<sha256>.onnx` only when
its size and hash are the ones announced: the cache never holds a partial or wrong file under a final
name. Temporary files of a worker that was killed are removed by the next worker using the folder.
Least recently used files are evicted past `limit_bytes` (never those of the running session).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path

from ..errors import InputError

__all__ = ["FragmentCache", "Incoming", "default_cache_dir", "check_sha256"]

logger = logging.getLogger(__name__)

_SHA256 = re.compile(r"[0-9a-f]{64}")
_TEMP = re.compile(r"\.incoming-(\d+)-.*")


def default_cache_dir() -> Path:
    """$EDGEC_CACHE_DIR, else $XDG_CACHE_HOME/edgec/fragments, else ~/.cache/edgec/fragments."""
    if os.environ.get("EDGEC_CACHE_DIR"):
        return Path(os.environ["EDGEC_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgec" / "fragments"


def check_sha256(value: str) -> str:
    """The hash as a file name: exactly 64 lowercase hex digits (anything else could name another path)."""
    digest = value.lower() if isinstance(value, str) else ""
    if not _SHA256.fullmatch(digest):
        raise ValueError(f"sha256 {str(value)[:80]!r} is not 64 hex digits")
    return digest


class FragmentCache:
    def __init__(self, folder: str | os.PathLike, limit_bytes: int):
        self.folder = Path(folder)
        self.limit_bytes = limit_bytes

    def open(self) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            probe = self.folder / f".incoming-{os.getpid()}-probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise InputError(f"{self.folder}: cannot use as the fragment cache ({exc.strerror or exc})") from None
        for entry in self.folder.iterdir():
            m = _TEMP.fullmatch(entry.name)
            if m and not _alive(int(m.group(1))):
                entry.unlink(missing_ok=True)

    def path(self, sha256: str) -> Path:
        return self.folder / f"{check_sha256(sha256)}.onnx"

    def has(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def touch(self, sha256: str) -> None:
        try:
            os.utime(self.path(sha256))
        except OSError:
            pass

    def begin(self, sha256: str, size: int) -> "Incoming":
        return Incoming(self, check_sha256(sha256), size)

    def evict(self, keep: set[str]) -> int:
        """Delete least recently used files until the cache fits its limit; returns the bytes freed."""
        entries = []
        for entry in self.folder.glob("*.onnx"):
            try:
                st = entry.stat()
            except OSError:
                continue
            entries.append((st.st_mtime, st.st_size, entry))
        total = sum(size for _, size, _ in entries)
        freed = 0
        for _, size, entry in sorted(entries):
            if total - freed <= self.limit_bytes:
                break
            if entry.stem in keep:
                continue
            entry.unlink(missing_ok=True)
            freed += size
            logger.info("cache: evicted %s (%d bytes)", entry.name, size)
        return freed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


class Incoming:
    """One fragment file arriving in order, chunk by chunk; `abort` (or a failed check) leaves nothing."""

    def __init__(self, cache: FragmentCache, sha256: str, size: int):
        self.cache, self.sha256, self.size = cache, sha256, size
        self.received = 0
        self.hash = hashlib.sha256()
        fd_name = f".incoming-{os.getpid()}-{sha256[:16]}-{id(self):x}"
        self.temp = cache.folder / fd_name
        self.fh = open(self.temp, "wb")

    def write(self, offset: int, data: memoryview) -> bool:
        """Append a chunk; True when the file is complete and in place. ValueError on a chunk out of order,
        past the announced size, or (at the end) a hash that is not the announced one."""
        if offset != self.received:
            raise ValueError(f"chunk at offset {offset}, expected {self.received}")
        if self.received + len(data) > self.size:
            raise ValueError(f"more than the announced {self.size} bytes")
        self.fh.write(data)
        self.hash.update(data)
        self.received += len(data)
        if self.received < self.size:
            return False
        self.fh.close()
        if self.hash.hexdigest() != self.sha256:
            raise ValueError("the received bytes do not match their sha256")
        os.replace(self.temp, self.cache.path(self.sha256))
        return True

    def abort(self) -> None:
        try:
            self.fh.close()
        finally:
            self.temp.unlink(missing_ok=True)
