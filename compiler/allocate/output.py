"""OUTDIR of `edgec allocate`: one ordinary build per service (OUTDIR/<service>/) and allocation.json,
written beside OUTDIR and swapped into place: a failure leaves nothing half-written."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from edgec.runtime.errors import InputError
from edgec.runtime.files import default_mode
from edgec.runtime.interrupts import check_interrupted
from edgec.runtime.front.runall import load_allocation

from ..emit import EmittedFragment, check_output_dir, write_output
from ..emit.output import signals_held, swap_into_place
from ..errors import UserError

__all__ = ["ServiceBuild", "allocation_text", "check_allocation_dir", "write_allocation"]


@dataclass(frozen=True)
class ServiceBuild:
    name: str
    manifest: dict
    frags: tuple[EmittedFragment, ...]


def allocation_text(allocation: dict) -> str:
    """allocation.json's exact text, which `--json` prints too."""
    return json.dumps(allocation, indent=1, sort_keys=True) + "\n"


def check_allocation_dir(outdir: Path) -> tuple[str, ...]:
    """The files of the earlier allocation OUTDIR holds (relative paths, folders ending in "/"); empty if
    OUTDIR is missing or empty. UserError if it holds anything else: the user's files are never replaced."""
    outdir = Path(outdir).resolve()
    if not outdir.name:
        raise UserError("cannot write an allocation over the root folder", str(outdir))
    if not outdir.exists():
        return ()
    if not outdir.is_dir():
        raise UserError("output path exists and is not a folder", str(outdir))
    entries = sorted(e.name for e in outdir.iterdir())
    if not entries:
        return ()
    try:
        old = load_allocation(outdir / "allocation.json")
    except InputError:
        raise UserError("output folder is not empty and holds no edgec allocation; refusing to replace it (move "
                        "its files away or choose another output folder)", str(outdir)) from None
    folders = {s.manifest.parent.name for s in old.services if s.manifest.parent.parent == outdir}
    found = ["allocation.json"]
    for name in entries:
        if name == "allocation.json":
            continue
        if name not in folders or (outdir / name).is_symlink():
            raise UserError(f"output folder holds {name!r}, which is not part of the earlier allocation there; "
                            "refusing to replace it", str(outdir))
        found += [f"{name}/{f}" for f in check_output_dir(outdir / name)] + [f"{name}/"]
    return tuple(found)


def write_allocation(outdir: Path, builds: list[ServiceBuild], allocation: dict) -> None:
    """Every service's build (checked as `edgec compile` checks one) and allocation.json (checked by the
    runtime's reader), in a temporary sibling folder that then replaces OUTDIR."""
    outdir = Path(outdir).resolve()
    check_allocation_dir(outdir)
    tmp: Path | None = None
    try:
        outdir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{outdir.name}.tmp-", dir=outdir.parent))
        tmp.chmod(default_mode(folder=True))  # mkdtemp's 0700 would make the allocation private to this user
        for b in builds:
            check_interrupted()
            write_output(tmp / b.name, b.manifest, list(b.frags))
        (tmp / "allocation.json").write_text(allocation_text(allocation), encoding="utf-8")
        try:
            load_allocation(tmp / "allocation.json")
        except InputError as exc:
            raise RuntimeError(f"allocate wrote an allocation the runtime refuses: {exc}") from None
        with signals_held():  # half a swap would leave the old allocation beside the new one, or neither
            swap_into_place(tmp, outdir, check_allocation_dir(outdir))  # checked again: files may have appeared
    except OSError as exc:
        raise UserError(f"cannot write the allocation: {exc.strerror or exc}", str(outdir)) from None
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
