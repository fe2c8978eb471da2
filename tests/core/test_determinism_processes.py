"""Issue 44's "the same ``partition`` command run twice on a fresh cache and after 100 runs of
other models gives the same placement", as a user meets it: every step its own ``anychip``
process, a fresh cache folder, the user's defaults (calibration ``auto``, placements
remembered, background compiles: the test run's settings from ``tests/conftest.py`` taken
out), 100 runs of two other models between (``anychip run``, their sessions' feedback on),
and the command once more in a second fresh folder. ``tests/core/test_determinism.py`` is the
same check in one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.models import HELD_OUT
from tests.models import transformer_layer

#: What ``tests/conftest.py`` sets for the test run that a user does not have.
_TEST_RUN_SETTINGS = (
    "ANYCHIP_CALIBRATION",
    "ANYCHIP_REMEMBER_PLACEMENT",
    "ANYCHIP_BACKGROUND_COMPILE",
    "ANYCHIP_DEVICES",
)


def _anychip(cache: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in _TEST_RUN_SETTINGS}
    env["ANYCHIP_CACHE_DIR"] = str(cache)
    done = subprocess.run(
        [sys.executable, "-m", "anychip", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _partition(cache: Path, model: Path) -> dict[str, str]:
    out = _anychip(cache, "partition", str(model), "--devices", "xpu,cpu", "--json", "-q")
    return {n["name"]: n["device"] for n in json.loads(out)["nodes"]}


@pytest.mark.slow
def test_partition_twice_after_100_runs_of_other_models_and_in_a_fresh_cache(tmp_path) -> None:
    model = tmp_path / "layer.onnx"
    model.write_bytes(transformer_layer(seq=64, hidden=128, heads=4, ffn=512).SerializeToString())
    cache = tmp_path / "cache"
    # measures the CPU and the XPU here first (on a 2-core EPYC every node stays on the CPU:
    # the XPU is a simulation in C, slower per node than oneDNN; elsewhere it may split)
    first = _partition(cache, model)
    assert len(first) == 27 and set(first.values()) <= {"xpu", "cpu"}, first
    assert _partition(cache, model) == first
    calibrations = sorted((cache / "calibration").glob("*.json"))
    before = {f.name: f.read_bytes() for f in calibrations}
    for name in ("gpt_like", "mlp"):  # their own op mixes and shapes, 50 runs each
        other = tmp_path / f"{name}.onnx"
        made = HELD_OUT[name][0]()  # serialized already
        other.write_bytes(made if isinstance(made, bytes) else made.SerializeToString())
        _anychip(cache, "run", str(other), "--devices", "xpu,cpu", "--repeat", "40", "-q")
    assert {f.name: f.read_bytes() for f in calibrations} == before  # never grown by pricing
    assert _partition(cache, model) == first
    assert _partition(tmp_path / "fresh", model) == first  # measured again from nothing
