"""Command line: `python -m edgec.models build [-o DIR] [--only A,B] [--force]` and `python -m edgec.models list`."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import onnx

from . import DESCRIPTIONS, default_dir, MODEL_NAMES, ON_REQUEST_NAMES, TORCH_MISSING, build, is_current


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m edgec.models", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build models into DIR/NAME.onnx")
    b.add_argument("-o", "--out", type=Path, default=None, metavar="DIR",
                   help="output directory (default: $EDGEC_MODELS_DIR, else ./models/build)")
    b.add_argument("--only", action="append", metavar="NAME[,NAME...]",
                   help="build only these models (default: all but the int8 ones, which are built when named)")
    b.add_argument("--force", action="store_true", help="rebuild even if the file is up to date")
    sub.add_parser("list", help="list model names with a description")
    return parser.parse_args(argv)


def _names(only: list[str] | None) -> list[str]:
    if not only:
        return list(MODEL_NAMES)
    names = [n.strip() for group in only for n in group.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODEL_NAMES + ON_REQUEST_NAMES]
    if unknown:
        hint = f"; {TORCH_MISSING}" if TORCH_MISSING and any(n.endswith("_torch") for n in unknown) else ""
        raise SystemExit(_error(f"unknown model(s): {', '.join(unknown)}"
                                f" (known: {', '.join(MODEL_NAMES + ON_REQUEST_NAMES)}){hint}"))
    return list(dict.fromkeys(names))  # drop repeats, keep order


def _error(msg: str) -> int:
    print(f"python -m edgec.models: error: {msg}", file=sys.stderr)
    return 2


def _loads(path: Path) -> bool:
    try:
        onnx.load(path, load_external_data=False)
    except Exception:  # a truncated or foreign file: rebuild it
        return False
    return True


def _build(out: Path, names: list[str], force: bool) -> int:
    for name in names:
        path = out / f"{name}.onnx"
        start = time.perf_counter()
        if not force and is_current(name, path) and _loads(path):
            status = "up to date"
        else:
            path = build(name, out)
            status = f"{time.perf_counter() - start:7.2f} s"
        size = path.stat().st_size / 1e6
        print(f"{name:<18} {size:9.2f} MB  {status}", file=sys.stderr, flush=True)
        print(path, flush=True)
    return 0


def _list() -> int:
    for name in MODEL_NAMES:
        print(f"{name:<18} {DESCRIPTIONS[name]}")
    print(f"built when named (--only): {', '.join(ON_REQUEST_NAMES)}", file=sys.stderr)
    if TORCH_MISSING:
        print(f"not listed: {TORCH_MISSING}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.command == "list":
        return _list()
    return _build(args.out or default_dir(), _names(args.only), args.force)


if __name__ == "__main__":
    sys.exit(main())
