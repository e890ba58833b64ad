"""Output: the build (fragments and manifest.json, fallback and alternative builds in subfolders) written
to a temporary sibling folder, checked by onnxruntime and by the runtime's own manifest parser, then swapped into place."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from edgec.runtime import MANIFEST_FORMAT
from edgec.runtime.errors import InputError, one_line
from edgec.runtime.files import default_mode
from edgec.runtime.interrupts import check_interrupted
from edgec.runtime.manifest.load import load_manifest
from edgec.runtime.manifest.signatures import check_signatures

from ..errors import UserError
from .fragments import EmittedFragment, safe_name

__all__ = ["ExtraBuild", "EXTRA_KEYS", "fallback_build", "alternative_build", "alternative_folder",
           "manifest_text", "extra_entries",
           "write_output", "check_output_dir"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExtraBuild:
    """A complete build of its own beside the main one, in OUTDIR/<folder>/, that the main manifest's list
    `key` names: a fallback ("fallbacks", folder fallback-<device>, `info` {"without": device}) or an
    alternative plan ("alternatives", folder alt-<k>, `info` its strategy and predicted figures, and for a
    variant of the chosen plan what it changes). With
    `manifest` None (fallbacks only), `error` says why there is no such build."""

    key: str
    folder: str
    info: dict
    manifest: dict | None
    frags: tuple[EmittedFragment, ...] = ()
    error: str | None = None

    def entry(self) -> dict:
        """The build's entry in the main manifest's list: where its manifest is and the sha256 of its text."""
        if self.manifest is None:
            return self.info | {"manifest": None, "sha256": None, "error": self.error}
        digest = hashlib.sha256(manifest_text(self.manifest).encode("utf-8")).hexdigest()
        return self.info | {"manifest": f"{self.folder}/manifest.json", "sha256": digest}


EXTRA_KEYS = ("fallbacks", "alternatives")  # the main manifest's lists of builds in subfolders


def fallback_build(without: str, manifest: dict | None = None, frags=(), error: str | None = None) -> ExtraBuild:
    """The build planned without device `without`, or why no plan fits the devices left."""
    return ExtraBuild("fallbacks", f"fallback-{safe_name(without)}", {"without": without}, manifest, tuple(frags), error)


def alternative_folder(k: int) -> str:
    """The folder of the k-th alternative plan (k from 1, best first)."""
    return f"alt-{k}"


def alternative_build(k: int, manifest: dict, frags, variant: str | None = None) -> ExtraBuild:
    """The k-th alternative plan: its entry repeats the strategy and predictions of its manifest, and a
    variant of the chosen plan (a --shifts boundary shift) says what it changes. A --keep plan's entry has
    no `variant` key, so that builds without --shifts are what they were before it existed."""
    pred = manifest["predicted"]
    info = {"strategy": manifest["plan"]["strategy"],
            "predicted": {"latency_ms": pred["latency_ms"], "throughput_ips": pred["throughput_ips"],
                          "energy_mj": pred.get("energy_mj")}}
    if variant is not None:
        info["variant"] = variant
    return ExtraBuild("alternatives", alternative_folder(k), info, manifest, tuple(frags))


def manifest_text(manifest: dict) -> str:
    """manifest.json's exact text: sorted keys, so that a rebuild of the same plan is byte-identical."""
    return json.dumps(manifest, indent=1, sort_keys=True) + "\n"


def extra_entries(builds) -> list[dict]:
    """The main manifest's list (`fallbacks` or `alternatives`) naming `builds`, in their order."""
    return [b.entry() for b in builds]


def write_output(outdir: Path, manifest: dict, frags: list[EmittedFragment],
                 extras: list[ExtraBuild] = ()) -> None:
    """Write into a temporary sibling folder, then swap it into place: a failure (or SIGTERM/SIGINT, when
    the caller turns them into exceptions) leaves nothing half-written and no temporary folder.

    An existing OUTDIR is replaced only when it is empty or holds exactly an earlier edgec build (see
    check_output_dir); every fragment must load in onnxruntime before the build is swapped in. Each extra
    build (a fallback or an alternative) goes to its own subfolder, which the manifest's list of its kind
    must name (extra_entries): all of them are written, or none.
    """
    outdir = Path(outdir).resolve()  # `-o .` has no name to put the temporary sibling beside
    _check_extras_named(manifest, list(extras))
    check_output_dir(outdir)
    tmp: Path | None = None
    try:
        with signals_held():  # the folder exists only once `tmp` names it, for the cleanup below
            outdir.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{outdir.name}.tmp-", dir=outdir.parent))
        tmp.chmod(default_mode(folder=True))  # mkdtemp's 0700 would make the build private to this user
        builds = [(tmp, outdir, manifest, frags)]
        builds += [(tmp / b.folder, outdir / b.folder, b.manifest, b.frags) for b in extras if b.manifest is not None]
        for folder, final, data, files in builds:
            folder.mkdir(exist_ok=True)
            _write_build(folder, final, data, files)
        for folder, _, _, _ in builds:
            _ensure_runtime_accepts(folder / "manifest.json")
        with signals_held():  # half a swap would leave the old build beside the new one, or neither in place
            swap_into_place(tmp, outdir, check_output_dir(outdir))  # checked again: files may have appeared
    except OSError as exc:
        raise UserError(f"cannot write the build: {exc.strerror or exc}", str(outdir)) from None
    finally:
        if tmp is not None and tmp.exists():  # tmp is gone once swapped into place
            shutil.rmtree(tmp, ignore_errors=True)


def _check_extras_named(manifest: dict, extras: list[ExtraBuild]) -> None:
    """The manifest names exactly the extra builds being written, each in its own folder."""
    folders = [b.folder for b in extras]
    if len(set(folders)) != len(folders):
        raise RuntimeError(f"two extra builds share a folder: {folders}")
    for key in {b.key for b in extras}:
        if manifest.get(key) != extra_entries([b for b in extras if b.key == key]):
            raise RuntimeError(f"the manifest's {key} do not describe the builds being written")


def _ensure_runtime_accepts(path: Path) -> None:
    """The emitter's postcondition, checked before the build is swapped into place: the runtime's own
    parser (which owns the schema) accepts the manifest as written, schedule included, and every tensor it
    names agrees with the fragments' own graph signatures, as `edgec run` checks before it starts. The
    fragment hashes are not recomputed: they were taken from the very bytes written."""
    try:
        check_signatures(load_manifest(path, check_files=False, generative=True))
    except InputError as exc:
        raise RuntimeError(f"the emitter wrote a manifest the runtime refuses: {exc}") from None


def _write_build(folder: Path, final: Path, manifest: dict, frags) -> None:
    """One build's fragments and manifest.json into `folder` (which becomes `final` once swapped in)."""
    for f in frags:
        check_interrupted()
        with open(folder / f.file, "wb") as fh:
            fh.writelines(f.encoded.chunks)
    # From the written files: onnxruntime reads them itself, where bytes would need each fragment
    # joined into one more copy (575 MB for VGG-19) first.
    _check_loadable(folder, frags, final, manifest)
    (folder / "manifest.json").write_text(manifest_text(manifest), encoding="utf-8")


def check_output_dir(outdir: Path) -> tuple[str, ...]:
    """The files of the earlier build that OUTDIR holds, as paths relative to it (a fallback's or an
    alternative's files as "<folder>/<file>"); empty if OUTDIR is missing or empty. UserError if OUTDIR is not a folder, or
    holds anything else: the user's files are never replaced."""
    outdir = Path(outdir).resolve()
    if not outdir.name:
        raise UserError("cannot write a build over the root folder", str(outdir))
    if not outdir.exists():
        return ()
    if not outdir.is_dir():
        raise UserError("output path exists and is not a folder", str(outdir))
    try:
        entries = sorted(outdir.iterdir())
        build = _build_files(outdir) if entries else set()
        found, foreign = _walk_build(outdir, entries, build)
    except OSError as exc:
        raise UserError(f"cannot read the output folder: {exc.strerror}", str(outdir)) from None
    if foreign:
        what = "which is not part of the earlier edgec build there" if build else "and is not an edgec build"
        raise UserError(f"output folder holds {foreign[0]!r} {what}; refusing to replace it (move that away or "
                        "choose another output folder)", str(outdir))
    return tuple(found)


def _walk_build(outdir: Path, entries: list[Path], build: set[str]) -> tuple[list[str], list[str]]:
    """(the build's files found, relative paths; what is not the build's: other files, links, folders)."""
    found, foreign = [], []
    folders = {name.split("/")[0] for name in build if "/" in name}
    for e in entries:
        if e.is_symlink():
            foreign.append(e.name)
        elif e.is_dir() and e.name in folders:
            for sub in sorted(e.iterdir()):
                rel = f"{e.name}/{sub.name}"
                (found if rel in build and sub.is_file() and not sub.is_symlink() else foreign).append(rel)
            found.append(f"{e.name}/")
        elif e.is_file() and e.name in build:
            found.append(e.name)
        else:
            foreign.append(e.name)
    return found, foreign


def _build_files(folder: Path) -> set[str]:
    """manifest.json and the fragment files it names, if folder/manifest.json is an edgec manifest; else
    empty. Each extra build it names (a fallback or an alternative: FOLDER/manifest.json, FOLDER one plain
    name) adds that folder's build files as "FOLDER/<file>"."""
    data = _read_manifest(folder / "manifest.json")
    files = _own_files(data)
    if not files:
        return set()
    for entry in [e for key in EXTRA_KEYS if isinstance(data.get(key), list) for e in data[key]]:
        path = entry.get("manifest") if isinstance(entry, dict) else None
        if path is None:
            continue
        sub, _, name = path.partition("/") if isinstance(path, str) else ("", "", "")
        inner = _own_files(_read_manifest(folder / sub / name)) if name == "manifest.json" and _plain(sub) else set()
        if not inner:
            return set()  # an extra build that is not a folder of ours: not a build we wrote
        files |= {f"{sub}/{f}" for f in inner}
    return files


def _read_manifest(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _own_files(data) -> set[str]:
    """manifest.json and the fragment files named by `data`, if it is an edgec manifest; else empty."""
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT or not isinstance(data.get("fragments"), list):
        return set()
    files = {"manifest.json"}
    for frag in data["fragments"]:
        name = frag.get("file") if isinstance(frag, dict) else None
        if not _plain(name):
            return set()  # a name reaching outside the folder: not a manifest we wrote
        files.add(name)
    return files


def _plain(name) -> bool:
    """A file name of its own, without any folder part."""
    return isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name and "\\" not in name


def _check_loadable(folder: Path, frags: list[EmittedFragment], outdir: Path, manifest: dict) -> None:
    """UserError naming the fragment and onnxruntime's reason if a fragment does not load (e.g. an
    operator of a custom domain): the build would fail on the devices instead. Loading is what is
    checked, so neither graph optimisation nor weight prepacking (half the load time of VGG-19's 575 MB)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.add_session_config_entry("session.disable_prepacking", "1")
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    model = os.path.normpath(outdir / manifest["model"]["path"])
    for f in frags:
        check_interrupted()  # the sessions freed here may swallow a signal's first raise
        try:
            ort.InferenceSession(str(folder / f.file), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises several pybind error types
            raise UserError(f"fragment {f.id} for {f.device} ({f.file}) does not load in onnxruntime, so no "
                            f"device could run it: {one_line(exc, 300)}", model) from None


@contextlib.contextmanager
def signals_held():
    """Hold SIGTERM and SIGINT within (main thread only), then deliver them to the handlers in place before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: pending.append(signum)) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for s in dict.fromkeys(pending):
            signal.raise_signal(s)


def swap_into_place(tmp: Path, outdir: Path, old_files: tuple[str, ...]) -> None:
    """Put the finished folder `tmp` where `outdir` is, in one rename; an earlier output there (whose files
    and folders `old_files` names, relative, folders ending in "/") is moved aside first and removed after.
    Shared by compile's builds and allocate's allocations."""
    if not outdir.exists():
        os.replace(tmp, outdir)
        return
    old = outdir.with_name(f".{outdir.name}.old-{os.getpid()}")
    os.replace(outdir, old)
    try:
        os.replace(tmp, outdir)
    except BaseException:
        os.replace(old, outdir)
        raise
    _remove_old_build(old, old_files)


def _remove_old_build(old: Path, files: tuple[str, ...]) -> None:
    """Delete the earlier build's files by name, then its extra builds' folders ("NAME/" entries) and its
    folder: a file that appeared in one after the last check keeps it, which is reported, not deleted."""
    for name in files:
        if not name.endswith("/"):
            (old / name).unlink(missing_ok=True)
    for folder in sorted({old / name for name in files if name.endswith("/")}, reverse=True) + [old]:  # deepest first
        try:
            folder.rmdir()
        except OSError:
            logger.warning("kept %s: files appeared in the earlier output while the new one was written", folder)
