"""Test-run plumbing: one BLAS thread per pytest-xdist worker, and the ONNX conformance summary
(one line per device set, printed by the process that reports, worker or not).

The summary is also a check: an accelerator set (``xpu,cpu``, ``npu,cpu``) that ran the suite
must have placed a real share of the cases' nodes on its accelerator, or the run fails. It is
made here, from every worker's reports, because no single xdist worker sees the whole suite.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

# Placement in tests follows the backends' declared figures, the same on every machine; the
# tests of measured costs (tests/core/test_calibration.py) ask for calibration themselves.
os.environ.setdefault("ANYCHIP_CALIBRATION", "off")
# Graph-mode devices compile at load, as they did before background compiles: the tests of the
# background path (tests/core/test_specialize.py) turn it on themselves.
os.environ.setdefault("ANYCHIP_BACKGROUND_COMPILE", "0")
# a placement one test measured must not place the next (core/api/remembered.py)
os.environ.setdefault("ANYCHIP_REMEMBER_PLACEMENT", "0")


# onnx generates its ~1,900 node cases in every process that asks (5-7 s: each xdist worker's
# collection, each kit subprocess); anychip's case cache keeps them on disk, and onnx's loader
# (BackendTest, the kernel tests) reads them from there too.
import onnx.backend.test.loader as _onnx_loader

from anychip.conformance.case_cache import generated_node_cases

_onnx_loader.load_node_model_tests = generated_node_cases


def _session_cache() -> None:
    """The disk caches on, as users have them (issue 47: the suite ran with them off, which hid
    a cache that served one opset's partition for another), in a folder of this test session:
    the controller makes it and xdist's workers inherit it through the environment. What is a
    pure function of the installed code (onnx's node cases, built C and OpenCL binaries) is
    linked to the user's folders, so a session rebuilds none of it; compiled artifacts and
    calibrations start empty. ``ANYCHIP_COMPILE_CACHE=0`` (or an ``ANYCHIP_CACHE_DIR`` of
    one's own) set before pytest keeps the old behaviour."""
    import tempfile

    from anychip.paths import cache_root

    if "PYTEST_XDIST_WORKER" in os.environ or "ANYCHIP_CACHE_DIR" in os.environ:
        return
    if os.environ.get("ANYCHIP_COMPILE_CACHE") == "0":
        return
    user = cache_root()
    session = Path(tempfile.mkdtemp(prefix="anychip-test-cache-"))
    for shared in ("conformance", "codegen", "cpu-native", "xpu", "opencl", "pycache"):
        (user / shared).mkdir(parents=True, exist_ok=True)
        (session / shared).symlink_to(user / shared, target_is_directory=True)
    os.environ["ANYCHIP_CACHE_DIR"] = str(session)
    os.environ["ANYCHIP_TEST_SESSION_CACHE"] = str(session)  # removed at the end (below)
    os.environ["ANYCHIP_COMPILE_CACHE"] = "1"


_session_cache()

if sys.dont_write_bytecode and not sys.pycache_prefix:
    # PYTHONDONTWRITEBYTECODE (set on this project's machines) also stops pytest keeping its
    # assertion-rewritten test modules: each xdist worker parsed, rewrote and compiled all 140
    # of them again at every run (1.2 of its 3.1 s of collection). Kept under anychip's cache
    # folder instead, outside the source tree, for this process only.
    from anychip.paths import cache_root

    sys.pycache_prefix = str(cache_root() / "pycache")
    sys.dont_write_bytecode = False
    if "PYTEST_XDIST_WORKER" not in os.environ:
        # Each CI run's venv lies in a new temporary folder: drop the mirrors of gone folders.
        from tests.pycache_prune import prune

        prune(Path(sys.pycache_prefix))

if "PYTEST_XDIST_WORKER" in os.environ:
    # Two workers on two cores: a BLAS pool per worker would oversubscribe them.
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")


class _ConformanceSummary:
    """Counts conformance outcomes and placed nodes per device set from the test reports."""

    def __init__(self) -> None:
        self.outcomes: dict[str, Counter] = {}
        self.placed: dict[str, Counter] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        devices = props.get("anychip_devices")
        if devices is None:
            return
        if report.when == "call" or (report.when == "setup" and not report.passed):
            key = "passed" if report.passed else "skipped" if report.skipped else "failed"
            self.outcomes.setdefault(devices, Counter())[key] += 1
            self.placed.setdefault(devices, Counter()).update(props.get("anychip_placed", {}))

    #: An accelerator set must place more than this share of the cases' nodes on its
    #: accelerator (measured here: xpu 43%, npu 22%), else its passes are CPU fallbacks.
    MIN_SHARE = 0.15

    def problems(self) -> list[str]:
        """Accelerator sets that ran the suite but placed too little on their accelerator."""
        out = []
        for devices, placed in self.placed.items():
            accelerator = devices.split(",")[0].strip().lower()
            total = sum(placed.values())
            if accelerator == "cpu" or total < 1000:
                continue  # a subset run (-k): too few nodes to judge
            share = placed[accelerator] / total
            if share <= self.MIN_SHARE:
                out.append(f"{devices}: only {share:.0%} of the cases' nodes ran on {accelerator}")
        return out

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.problems():
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for devices, o in self.outcomes.items():
            placed = ", ".join(f"{d} {n}" for d, n in self.placed[devices].most_common())
            terminalreporter.write_line(
                f"anychip ONNX conformance on {devices}: {o['passed']} passed, "
                f"{o['failed']} failed, {o['skipped']} skipped; nodes placed: {placed}"
            )
        for problem in self.problems():
            terminalreporter.write_line(f"FAILED conformance placement check: {problem}", red=True)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Any:
    """Collection makes about 580,000 objects (the modules, 8,000 items, the conformance
    cases), none of them ever garbage. Each full collection walks every live object: 8 of them
    during collection (1 s per xdist worker) and, after it, each of the ~80 full collections a
    run asks for (``Session.close()``, the kit's memory checks, the tests of freed memory)
    took 0.3-0.5 s. So no full collection while collecting (young cycles are still
    collected), and what collection made is frozen out of the collector's reach after it."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, 1 << 30)
    try:
        return (yield)
    finally:
        gc.freeze()
        gc.set_threshold(young, middle, old)


#: Objects a test module may leave for good (the modules it imported, module caches) before
#: they are frozen too: test_public_api imports every module (45,000 objects), the
#: wild-model tests scikit-learn (30,000); each later full collection walked them again.
_FREEZE_ABOVE = 50_000


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    result = yield
    next_module = getattr(nextitem, "module", None)
    if next_module is not getattr(item, "module", None) and (
        len(gc.get_objects(generation=2)) > _FREEZE_ABOVE
    ):
        gc.collect()  # garbage first: frozen objects are never collected
        gc.freeze()
    return result


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the process that prints the summary
        config.pluginmanager.register(_ConformanceSummary(), "anychip-conformance-summary")
    from tests.cache_watch import register

    register(config)  # the cache's size against its limit (tests/cache_watch.py)


@pytest.fixture
def no_compile_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled-artifact cache off for one test: for tests that count compiles or patch a
    backend's ``compile`` (an artifact another test stored would be loaded instead)."""
    monkeypatch.setenv("ANYCHIP_COMPILE_CACHE", "0")


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = os.environ.get("ANYCHIP_TEST_SESSION_CACHE")
    if folder and not hasattr(config, "workerinput"):  # the session's cache (_session_cache)
        shutil.rmtree(folder, ignore_errors=True)  # the links go, not what they point at


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    suite = getattr(item, "module", None)
    devices_of = getattr(suite, "CASE_DEVICES", None)
    if devices_of is None:
        return
    report = outcome.get_result()
    devices = devices_of(item)
    if devices is None:
        return
    report.user_properties.append(("anychip_devices", devices))
    placed: Counter = Counter()
    while suite.CASE_PLACED:
        placed.update(suite.CASE_PLACED.pop()[1])
    if placed:
        report.user_properties.append(("anychip_placed", dict(placed)))
