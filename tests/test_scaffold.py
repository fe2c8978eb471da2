"""``anychip new-backend``: the package it writes installs, is listed by ``anychip devices``,
and passes the conformance kit in strict mode (its own generated test), in both styles."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from anychip.cli import main
from anychip.errors import AnychipError
from anychip.scaffold import new_backend


def _pip_target(pkg, site) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(pkg),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("graph_mode", [False, True], ids=["kernels", "graph"])
def test_the_skeleton_installs_and_passes_the_kit(tmp_path, graph_mode):
    name = "gchip" if graph_mode else "kchip"
    pkg = new_backend(name, graph_mode=graph_mode, out_dir=tmp_path)
    site = tmp_path / "site"
    _pip_target(pkg, site)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site)] + sys.path)}
    devices = subprocess.run(
        [sys.executable, "-m", "anychip", "devices"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next(ln for ln in devices.stdout.splitlines() if ln.startswith(name))
    assert " yes " in line, devices.stdout
    tests = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            str(pkg / "tests"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=pkg,
    )
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert "2 passed" in tests.stdout


@pytest.mark.parametrize("bad", ["MyChip", "1chip", "my-chip", "class", "cpu", ""])
def test_a_bad_name_is_refused(tmp_path, bad):
    with pytest.raises(AnychipError):
        new_backend(bad, out_dir=tmp_path)


def test_the_command_writes_the_package(tmp_path, capsys):
    assert main(["new-backend", "zchip", "-o", str(tmp_path)]) == 0
    assert (tmp_path / "anychip-zchip" / "anychip_zchip" / "__init__.py").exists()
    assert main(["new-backend", "zchip", "-o", str(tmp_path)]) == 2  # exists: refused
    assert "exists already" in capsys.readouterr().err
