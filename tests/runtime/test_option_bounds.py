"""Every numeric option of `edgec run`, `edgec run-all` and `edgec worker` refuses huge, infinite, nan,
negative and zero values it cannot take in one line (exit 2), before any work: no OverflowError, no
endless wait. The API's run() checks the same bounds."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import edgec
from edgec.runtime.front.api import MAX_TIMEOUT_S, check_options
from edgec.runtime.front.cli import run, run_all
from edgec.runtime.device.worker import worker
from edgec.runtime.errors import InputError

HUGE = "99999999999999999999999"
BAD_FLOATS = ("inf", "-inf", "nan", "1e400", "-1")


def refused(command, *args: str) -> str:
    res = CliRunner().invoke(command, list(args), prog_name="edgec")
    assert res.exit_code == 2, (args, res.exit_code, res.output)
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgec: ") and "Traceback" not in res.output, res.stderr
    return lines[0]


@pytest.mark.parametrize("value", ("3000000", "1e9", "0", *BAD_FLOATS))
def test_run_timeout_is_bounded(tmp_path, value):
    line = refused(run, str(tmp_path), "--random-inputs", "--timeout", value)
    assert "--timeout" in line


def test_run_timeout_bound_is_in_the_help():
    res = CliRunner().invoke(run, ["--help"])
    assert f"at most {MAX_TIMEOUT_S:g}" in " ".join(res.output.split())


@pytest.mark.parametrize("option,values", [
    ("--tolerance", ("inf", "nan", "-1")),
    ("--seed", ("-1",)),
    ("--repeat", ("0", "-1")),  # a huge count is a run until interrupted (tests do that)
    ("--warmup", (HUGE, "-1")),
    ("--threads", (HUGE, "-1")),
    ("--inflight", (HUGE, "0", "-1")),
    ("--heartbeat-ms", (HUGE, "0", "-1")),
])
def test_run_numeric_options(tmp_path, option, values):
    for value in values:
        assert option in refused(run, str(tmp_path), "--random-inputs", option, value)


@pytest.mark.parametrize("option,values", [
    ("--timeout", ("3000000", "inf", "nan", "0", "-1")),
    ("--tolerance", ("inf", "nan", "-1")),
    ("--seed", ("-1",)),
    ("--repeat", ("0", "-1")),
    ("--warmup", (HUGE, "-1")),
    ("--threads", (HUGE, "-1")),
])
def test_run_all_numeric_options(tmp_path, option, values):
    for value in values:
        assert option in refused(run_all, str(tmp_path), option, value)


@pytest.mark.parametrize("option,values", [
    ("--idle-timeout", ("inf", "nan", "1e400", "3601", "0", "-1")),
    ("--max-message-mb", (HUGE, "0", "-1")),
    ("--max-buffer-mb", (HUGE, "0", "-1")),
    ("--cache-max-mb", ("-1",)),
    ("--threads", (HUGE, "-1")),
    ("--data-port", (HUGE, "65536", "-1")),
])
def test_worker_numeric_options(option, values):
    for value in values:
        assert option in refused(worker, "--listen", "tcp://127.0.0.1:0", "--once", option, value)


@pytest.mark.parametrize("kwargs", [dict(timeout=1e9), dict(timeout=float("inf")), dict(timeout=float("nan")),
                                    dict(tolerance=float("inf")), dict(seed=-1), dict(repeat=0)])
def test_api_refuses_the_same(tmp_path, kwargs):
    with pytest.raises(InputError):
        edgec.run(tmp_path, random_inputs=True, **kwargs)


def test_check_options_accepts_the_bounds():
    check_options(10**30, 0, MAX_TIMEOUT_S, 0.0, seed=2**70)
