"""The Python in the user docs runs as written: each page's ```python blocks, in order, as one
script in a fresh interpreter (in a temporary folder: the pages write pictures)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ["getting-started.md", "several-devices.md", "placement-report.md", "ir-and-passes.md"]


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
@pytest.mark.parametrize("page", PAGES)
def test_page_code_runs(page: str, tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S)
    assert blocks, f"{page} has no python blocks"
    script = tmp_path / "page.py"
    script.write_text("\n".join(blocks))
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]


def test_cli_page_lists_every_command() -> None:
    from anychip.cli.main import _parser

    text = (DOCS / "cli.md").read_text()
    sub = next(a for a in _parser()._actions if a.dest == "cmd")
    for name in sub.choices:
        assert f"`anychip {name}" in text, name
