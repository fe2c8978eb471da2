"""``anychip new-backend``: the package it writes installs, is listed by ``anychip devices``,
and passes the conformance kit in strict mode (its own generated test), in both styles."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from anychip.cli.main import main
from anychip.cli.scaffold import new_backend
from anychip.errors import AnychipError


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
def test_the_skeletons_install_and_pass_the_kit(tmp_path):
    """Both styles written, installed into one target folder by one pip call, listed by one
    ``anychip devices`` and tested by one pytest run (each of the three costs a process)."""
    pkgs = {
        "kchip": new_backend("kchip", graph_mode=False, out_dir=tmp_path),
        "gchip": new_backend("gchip", graph_mode=True, out_dir=tmp_path),
    }
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    proc = _run(pip + ["--target", str(site), *map(str, pkgs.values())])
    assert proc.returncode == 0, proc.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site)] + sys.path)}
    devices = _run([sys.executable, "-m", "anychip", "devices"], env=env)
    tests = _run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist"]
        + [str(p / "tests") for p in pkgs.values()],
        env=env,
        cwd=tmp_path,
    )
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert "4 passed" in tests.stdout
    passed = [ln for ln in tests.stdout.splitlines() if ln.startswith("PASSED")]
    for name in pkgs:
        line = next(ln for ln in devices.stdout.splitlines() if ln.startswith(name))
        assert " yes " in line, devices.stdout
        assert len([ln for ln in passed if f"test_{name}.py" in ln]) == 2, tests.stdout[-3000:]


@pytest.mark.parametrize("bad", ["MyChip", "1chip", "my-chip", "class", "cpu", ""])
def test_a_bad_name_is_refused(tmp_path, bad):
    with pytest.raises(AnychipError):
        new_backend(bad, out_dir=tmp_path)


def test_the_command_writes_the_package(tmp_path, capsys):
    assert main(["new-backend", "zchip", "-o", str(tmp_path)]) == 0
    assert (tmp_path / "anychip-zchip" / "anychip_zchip" / "__init__.py").exists()
    assert main(["new-backend", "zchip", "-o", str(tmp_path)]) == 2  # exists: refused
    assert "exists already" in capsys.readouterr().err
