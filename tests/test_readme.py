"""README's Python API example runs as written, from a folder laid out like the checkout."""

from __future__ import annotations

import os
import re
from pathlib import Path

from edgec import models

ROOT = Path(__file__).resolve().parents[1]


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_python_api_example_runs(tmp_path, monkeypatch, capsys):
    (block,) = _python_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    (tmp_path / "models" / "build").mkdir(parents=True)
    (tmp_path / "models" / "build" / "tinychain.onnx").symlink_to(models.ensure("tinychain"))
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("pipeline ") and "median latency" in out
    assert (tmp_path / "build" / "tinychain" / "manifest.json").is_file()
    assert os.listdir(tmp_path / "build") == ["tinychain"]
