"""``examples/*.py`` run as written (a fresh interpreter each, as a reader would run them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(script: str, *args: str, cwd: Path) -> str:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=cwd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
def test_quickstart(tmp_path) -> None:
    out = _run("quickstart.py", cwd=tmp_path)
    assert "nodes per device: {'" in out and "max |npu,cpu - cpu|" in out


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
def test_placement_pictures(tmp_path) -> None:
    out = _run("placement_pictures.py", str(tmp_path / "pics"), cwd=tmp_path)
    for accel in ("npu", "xpu"):
        assert (tmp_path / "pics" / f"squeezenet-{accel}.html").stat().st_size > 5000
    assert "fallbacks" in out


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
@pytest.mark.parametrize("script", ["profile_and_inspect.py"])
def test_profile_and_inspect(tmp_path, script) -> None:
    out = _run(script, str(tmp_path), cwd=tmp_path)
    assert "FLOPs" in out and "profile of 3 run(s)" in out
    assert (tmp_path / "profile.html").exists() and (tmp_path / "profile.json").exists()
