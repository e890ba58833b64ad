"""The device's `edgec profile` (runtime/front/cli.py): the full install's measuring options, refine left out, and bad
input refused in one line with exit 2 before anything is measured."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgec.compiler.cli import cli as full_cli
from edgec.runtime.front.cli import device_cli
from edgec.runtime.profile import measure

REFINE = {"refine", "profile_ref", "device"}


def _params(cmd) -> set[str]:
    return {p.name for p in cmd.params}


def test_the_device_measures_with_every_option_of_the_full_install_but_refine():
    device, full = device_cli.commands["profile"], full_cli.commands["profile"]
    assert _params(device) == _params(full) - REFINE
    for name in _params(device):
        a, b = (next(p for p in c.params if p.name == name) for c in (device, full))
        assert (a.opts, a.help, a.default) == (b.opts, b.help, b.default), name


@pytest.mark.parametrize("args, needle", [
    (["-o", "{tmp}/no/p.yaml"], "{tmp}/no/p.yaml: folder '{tmp}/no' does not exist"),
    (["-o", "{tmp}/p.yaml", "--power-idle", "5", "--power-busy", "4"], "--power-busy 4 is below --power-idle 5"),
    (["-o", "{tmp}/p.yaml", "--model", "{tmp}/absent.onnx"], "{tmp}/absent.onnx: no such ONNX file"),
    (["-o", "{tmp}/p.yaml", "--threads", "0"], "'--threads'"),
    (["-o", "{tmp}/p.yaml", "--refine", "r.json"], "No such option '--refine'"),
])
def test_bad_input_is_one_line_and_exit_2_before_measuring(tmp_path, monkeypatch, args, needle):
    monkeypatch.setattr(measure, "measure_host", lambda *a, **k: pytest.fail("measured"))
    res = CliRunner().invoke(device_cli, ["profile", *(a.format(tmp=tmp_path) for a in args)])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("edgec: ") and needle.format(tmp=tmp_path) in lines[0], lines
    assert not (tmp_path / "p.yaml").exists()
