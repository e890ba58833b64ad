"""`edgec --version` and `-V`, for the full command and the device-only one."""

from __future__ import annotations

from importlib import metadata

import pytest
from click.testing import CliRunner

from edgec.compiler.cli import cli
from edgec.runtime.front.cli import device_cli


@pytest.mark.parametrize("group", [cli, device_cli], ids=["full", "device"])
@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(group, flag):
    result = CliRunner().invoke(group, [flag], prog_name="edgec")
    assert result.exit_code == 0, result.output
    assert result.output == f"edgec, version {metadata.version('edgec')}\n"
