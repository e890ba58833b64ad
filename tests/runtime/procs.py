"""The local workers a coordinator process started, found in /proc (Linux): below it, whichever of its threads
started them, either processes of their own running `edgec.runtime.device.worker` or the children of its
zygote (runtime/device/zygote.py), which forks them."""

from __future__ import annotations

from pathlib import Path

WORKER, ZYGOTE = "edgec.runtime.device.worker", "edgec.runtime.device.zygote"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _live(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def children(pid: int) -> list[int]:
    """The children of process `pid`, of every thread of it, zombies included (not yet reaped)."""
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return kids


def local_workers(pid: int) -> list[int]:
    """The live local workers below process `pid`."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        zygote = ZYGOTE in _cmdline(parent)
        for kid in children(parent):
            if _live(kid) and (zygote or WORKER in _cmdline(kid)):
                found.append(kid)
            frontier.append(kid)
    return found
