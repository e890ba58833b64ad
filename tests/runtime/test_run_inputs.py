"""`edgec run` on bad input: every case one line and exit 2, decided before anything large is allocated;
progress printed once; --model for a moved build; usage errors of `python -m edgec.runtime`."""

from __future__ import annotations

import io
import logging
import os
import shutil
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from numpy.lib import format as npy_format

from edgec.runtime.front.cli import run
from edgec.runtime.machine import MAX_THREADS_HERE
from edgec.runtime.errors import InputError
from edgec.runtime.coordinator.inputs import check_memory, load_inputs
from edgec.runtime.manifest.load import load_manifest

REPO = Path(__file__).resolve().parents[2]


def invoke(*args):
    return CliRunner().invoke(run, [str(a) for a in args], prog_name="python -m edgec.runtime")


def error_line(res, code: int = 2) -> str:
    assert res.exit_code == code, (res.exit_code, res.output)
    assert "Traceback" not in res.stderr and res.stdout == "", res.output
    last = res.stderr.splitlines()[-1]
    assert last.startswith("edgec: "), res.stderr
    return last


def test_a_single_array_as_inputs_says_how_to_pass_it(chain, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    line = error_line(invoke(chain.path, "--inputs", tmp_path / "x.npy"))
    assert "x.npy" in line and "--input NAME=" in line and ".npz" in line


def test_an_input_too_large_for_this_machine_is_refused_before_allocating(chain, make_symbolic_stem):
    chain.replace_fragment("f0", make_symbolic_stem())  # the graph takes any size: only memory can refuse it
    chain.manifest["inputs"][0]["shape"] = [1, 3, 2**19, 2**19]  # 3 x 2**38 float32: 3 TiB
    chain.write()
    line = error_line(invoke(chain.path, "--random-inputs"))
    assert "'data'" in line and "3.0 TiB" in line and "memory" in line


def test_check_memory_counts_every_input_and_their_sum(chain):
    manifest = load_manifest(chain.path, check_files=False)  # one input of 1x3x8x8 float32: 768 bytes
    check_memory(manifest, budget=768)
    with pytest.raises(InputError, match=r"'data' \(shape \[1, 3, 8, 8\], float32\) needs 768 B"):
        check_memory(manifest, budget=767)


def write_npy_member(archive: zipfile.ZipFile, name: str, shape, dtype=np.float32, data_bytes: int | None = None):
    """A member as np.savez_compressed writes it, its data all zeros: `data_bytes` defaults to what the
    header's shape needs, and may say otherwise (a lying archive)."""
    header = io.BytesIO()
    npy_format.write_array_header_1_0(header, {"descr": npy_format.dtype_to_descr(np.dtype(dtype)),
                                               "fortran_order": False, "shape": tuple(shape)})
    size = np.dtype(dtype).itemsize * int(np.prod(shape)) if data_bytes is None else data_bytes
    zeros = bytes(1 << 20)
    with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
        member.write(header.getvalue())
        for start in range(0, size, len(zeros)):
            member.write(zeros[: min(len(zeros), size - start)])


BOMB = 256 << 20  # 256 MiB of zeros: a few hundred KB compressed


@pytest.mark.parametrize("name, shape, data_bytes, needle", [
    ("nodata", (BOMB // 4,), None, "'nodata' is not a model input"),
    ("data", (BOMB // 4,), None, "holds 256.0 MiB uncompressed"),
    ("data", (1, 3, 8, 8), BOMB, "holds 256.0 MiB uncompressed"),
])
def test_a_zip_bomb_is_refused_before_its_data_is_read(chain, tmp_path, name, shape, data_bytes, needle):
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        write_npy_member(archive, name, shape, data_bytes=data_bytes)
    assert bomb.stat().st_size < 2 << 20
    manifest = load_manifest(chain.path, check_files=False)
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=needle):
            load_inputs(manifest, npz=str(bomb))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


def test_a_member_whose_header_lies_about_its_size_is_refused(chain, tmp_path):
    """The declared size fits the manifest, but the header's shape is another: refused at the header."""
    lying = tmp_path / "lying.npz"
    with zipfile.ZipFile(lying, "w", zipfile.ZIP_DEFLATED) as archive:
        write_npy_member(archive, "data", (1, 3, 8, 7), data_bytes=768)
    manifest = load_manifest(chain.path, check_files=False)
    with pytest.raises(InputError, match=r"has shape \[1, 3, 8, 7\], the manifest expects \[1, 3, 8, 8\]"):
        load_inputs(manifest, npz=str(lying))


def test_inputs_read_from_npz_and_npy_are_exact(chain, tmp_path):
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.savez_compressed(tmp_path / "in.npz", data=x)
    np.save(tmp_path / "f.npy", np.asfortranarray(x * 2))
    np.save(tmp_path / "be.npy", (x * 3).astype(">f4"))
    manifest = load_manifest(chain.path, check_files=False)
    assert np.array_equal(load_inputs(manifest, npz=str(tmp_path / "in.npz"))["data"], x)
    got = load_inputs(manifest, npz=str(tmp_path / "in.npz"), pairs=[f"data={tmp_path / 'f.npy'}"])["data"]
    assert np.array_equal(got, x * 2)
    got = load_inputs(manifest, pairs=[f"data={tmp_path / 'be.npy'}"])["data"]
    assert got.dtype == np.float32 and got.dtype.isnative and np.array_equal(got, x * 3)
    (tmp_path / "cut.npy").write_bytes((tmp_path / "f.npy").read_bytes()[:-4])
    with pytest.raises(InputError, match="cut.npy: input 'data' is"):
        load_inputs(manifest, pairs=[f"data={tmp_path / 'cut.npy'}"])


def test_absurd_thread_counts_are_refused_and_zero_still_means_the_default(tmp_path):
    line = error_line(invoke(tmp_path / "m.json", "--threads", "100000"))
    assert "--threads" in line and f"0<=x<={MAX_THREADS_HERE}" in line
    assert "manifest not found" in error_line(invoke(tmp_path / "m.json", "--threads", "0", "--random-inputs"))


@pytest.mark.parametrize("args, needle", [
    (["m.json", "--tolerance", "-1"], "Invalid value for '--tolerance'"),
    (["m.json", "--bogus"], "No such option '--bogus'"),
    ([], "Missing argument 'MANIFEST'"),
])
def test_usage_errors_are_one_line(args, needle):
    res = invoke(*args)
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1, res.stderr
    assert needle in res.stderr and res.stderr.rstrip().endswith("(see 'python -m edgec.runtime --help')")


def test_progress_and_warnings_are_printed_once(chain):
    """Through `edgec run`, whose main() also gives the root logger a handler (the compiler's warnings)."""
    # an input that no device receives: the manifest loads with a warning
    chain.manifest["inputs"].append({"name": "unused", "shape": [1], "dtype": "float32"})
    chain.write()
    proc = subprocess.run([sys.executable, "-m", "edgec.compiler", "run", str(chain.path), "--random-inputs"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == len(set(lines)), proc.stderr
    assert sum("2 worker(s) ready (2 local)" in ln for ln in lines) == 1
    warnings = [ln for ln in lines if "are never received by any device" in ln]
    assert len(warnings) == 1 and warnings[0].startswith("edgec: warning: "), proc.stderr
    assert not [ln for ln in lines if ln.startswith("edgec: warning: ") and ln not in warnings], proc.stderr


def test_the_progress_logger_is_restored_after_a_run(tmp_path):
    log = logging.getLogger("edgec.runtime")
    before = log.level, log.propagate, list(log.handlers)
    invoke(tmp_path / "m.json", "--random-inputs")
    assert (log.level, log.propagate, list(log.handlers)) == before


def test_a_moved_build_verifies_with_model(chain, tmp_path):
    moved = tmp_path / "moved"
    moved.mkdir()
    for p in chain.folder.iterdir():
        if p.suffix in (".json", ".onnx") and p.name != "model.onnx":
            shutil.copy(p, moved / p.name)
    line = error_line(invoke(moved, "--random-inputs", "--verify"))
    assert "model.onnx" in line and "not found" in line and "--model" in line
    res = invoke(moved, "--random-inputs", "--verify", "--model", chain.folder / "model.onnx")
    assert res.exit_code == 0 and "verify: PASSED" in res.stdout, res.output
    other = tmp_path / "other.onnx"
    other.write_bytes((chain.folder / "pi5-a.f0.onnx").read_bytes())
    line = error_line(invoke(moved, "--random-inputs", "--verify", "--model", other))
    assert "other.onnx" in line and "sha256 does not match" in line
    line = error_line(invoke(moved, "--random-inputs", "--model", chain.folder / "model.onnx"))
    assert "--model" in line and "--verify" in line


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX pipes")
def test_a_closed_stdout_exits_141_quietly(chain):
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run([sys.executable, "-m", "edgec.runtime", str(chain.path), "--random-inputs", "--json"],
                              stdout=w, stderr=subprocess.PIPE, text=True, timeout=120, cwd=REPO)
    finally:
        os.close(w)
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception" not in proc.stderr, proc.stderr
