"""Thread safety: one session run from 8 threads, and racing first use in fresh processes.

Both compare every output bit for bit with the same input run serially, on ``cpu``,
``xpu,cpu`` and ``npu,cpu``, with seeded random inputs (the model: ``tests/thread_race.py``).

Bounded by default (8 threads x 25 runs; 4 fresh processes per device set). The full target,
8 threads x 200 runs and 12 fresh processes per device set::

    ANYCHIP_THREADS_FULL=1 PYTHONPATH=/work/pp-threads python -m pytest tests/test_threads.py \
        -n 0 -p no:cacheprovider

passed: 6 tests in 16 s on 2 cores (the default run: 6 in 7-9 s). Before the NPU's device
memory was created under a lock, the racing first use of ``npu,cpu`` failed in 5, 4, 2 and 4
of 12 fresh processes (four rounds of ``python -P tests/thread_race.py npu,cpu``) and in 2 of
4 in this test: a session compiled against one ``NpuMemory`` while its inputs went to another
("belongs to another NPU instance"), and failover hid it by re-running on the host. After: 0
of 12 in five rounds. ``xpu,cpu`` never failed (its driver singleton was already locked).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.thread_race import feeds_for, load_session, mlp_model

FULL = os.environ.get("ANYCHIP_THREADS_FULL") == "1"
THREADS = 8
RUNS = 200 if FULL else 25
PROCESSES = 12 if FULL else 4
DEVICE_SETS = ["cpu", "xpu,cpu", "npu,cpu"]
RACE_SCRIPT = Path(__file__).with_name("thread_race.py")


def _session(devices: str):
    names = devices.split(",")
    if names[0] != "cpu":
        from anychip.core.plugin.host import get_registry

        ok, why = get_registry().backends[names[0]].available()
        if not ok:
            pytest.skip(f"{names[0]} is not available here: {why}")
    sess = load_session(mlp_model(), names)
    placed = sess.placement().by_device()
    assert placed.get(names[0], 0) > 0, placed  # the accelerator really runs nodes
    return sess


@pytest.mark.parametrize("devices", DEVICE_SETS)
def test_one_session_many_threads_matches_serial(devices: str) -> None:
    sess = _session(devices)
    seeds = [[10_000 * t + r for r in range(RUNS)] for t in range(THREADS)]
    serial = {s: sess.run(None, feeds_for(s))[0] for row in seeds for s in row}
    barrier = threading.Barrier(THREADS)
    got: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def work(row: list[int]) -> None:
        try:
            barrier.wait()
            for s in row:
                got[s] = sess.run(None, feeds_for(s))[0]
        except BaseException as e:
            errors.append(e)

    pool = [threading.Thread(target=work, args=(row,)) for row in seeds]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    assert not errors, errors
    assert sess.unhealthy == {}, sess.unhealthy  # no device failed and was failed over
    assert sorted(got) == sorted(serial)
    differ = [s for s in serial if not np.array_equal(got[s], serial[s])]
    assert not differ, f"{len(differ)} of {len(serial)} runs differ from serial: {differ[:5]}"
    # The inputs really differ, so a mix-up between threads' results could not go unseen.
    assert not np.array_equal(serial[seeds[0][0]], serial[seeds[1][0]])


def _race_env() -> dict[str, str]:
    """This process's environment (PYTHONPATH included), with the settings of conftest.py."""
    env = dict(os.environ)
    for key, value in {
        "ANYCHIP_CALIBRATION": "off",
        "ANYCHIP_BACKGROUND_COMPILE": "0",
        "ANYCHIP_COMPILE_CACHE": "0",
    }.items():
        env.setdefault(key, value)
    return env


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
@pytest.mark.parametrize("devices", ["npu,cpu", "xpu,cpu"])
def test_racing_first_use_in_fresh_processes(devices: str) -> None:
    _session(devices)  # skips when the accelerator is missing (and builds the XPU driver once)
    failed = []
    for i in range(PROCESSES):
        proc = subprocess.run(
            [sys.executable, "-P", str(RACE_SCRIPT), devices, str(THREADS), "3"],
            capture_output=True,
            text=True,
            env=_race_env(),
            timeout=300,
        )
        if proc.returncode != 0:
            failed.append(f"process {i} (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    assert not failed, f"{len(failed)} of {PROCESSES} fresh processes failed:\n" + "\n".join(failed)


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
def test_racing_first_build_of_the_xpu_driver(tmp_path: Path) -> None:
    """An empty driver cache: racing threads in processes started together build the C driver
    (once per process under a lock, renamed into place across processes) and all succeed."""
    _session("xpu,cpu")
    env = {**_race_env(), "ANYCHIP_CACHE_DIR": str(tmp_path)}
    count = 3 if FULL else 2
    procs = [
        subprocess.Popen(
            [sys.executable, "-P", str(RACE_SCRIPT), "xpu,cpu", str(THREADS), "3"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for _ in range(count)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    failed = [f"exit {p.returncode}:\n{out}" for p, out in zip(procs, outputs) if p.returncode]
    assert not failed, "\n".join(failed)
    assert len(list(tmp_path.glob("xpu/*/libxpu.so"))) == 1
    assert not list(tmp_path.glob("xpu/*/*.tmp"))  # no half-written library left behind
