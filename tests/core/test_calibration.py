"""Measured costs: the cache (reuse, invalidation, corrupt files), interpolation, and what the
measured figures do to placement (a slow device loses the whole graph, a fast one keeps it)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import anychip
from anychip.core.plan import calibration as C
from anychip.core.plan.cost_search import Costs, estimate
from anychip.core.plugin.host import get_registry
from tests.models import transformer_layer


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    return tmp_path


def _backend(name: str):
    return get_registry().backends[name]


def test_calibration_is_measured_once_then_read_from_the_cache(cache, monkeypatch):
    cpu = _backend("cpu")
    first = C.calibration_for(cpu)
    classes = {"elementwise", "matmul", "linear", "conv", "reduce", "data", "data_rows"}
    # complete up front: the classes, the masked chain's and every op measured on its own
    assert set(first.points) == classes | {"attention", "attention_mask"} | set(C.keys())
    assert set(first.spread) == set(first.points) and first.version == 1
    assert first.link is None  # host memory
    files = list((cache / "calibration").glob("cpu-*.json"))
    assert len(files) == 1

    def boom(*a, **k):
        raise AssertionError("measured again although cached")

    monkeypatch.setattr("anychip.core.plan.calibration_probes.measure_class", boom)
    again = C.calibration_for(cpu)
    assert again.points == {k: [tuple(p) for p in v] for k, v in first.points.items()}


def test_another_backend_version_or_machine_is_not_read(cache, monkeypatch):
    cpu = _backend("cpu")
    C.calibrate(cpu)
    assert C.load_calibration(cpu) is not None
    monkeypatch.setattr(type(cpu), "version", "2.0", raising=False)
    assert C.load_calibration(cpu) is None  # new key: measured again on next use
    monkeypatch.undo()
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(cache))
    monkeypatch.setattr(C, "_cpu_model", lambda: "another CPU")
    assert C.load_calibration(cpu) is None


def test_a_corrupt_file_is_removed_and_measured_again(cache):
    cpu = _backend("cpu")
    C.calibrate(cpu)
    (path,) = (cache / "calibration").glob("cpu-*.json")
    path.write_text('{"format": 1, "points": {"matmul": [[1, -5]]}')  # truncated JSON
    assert C.load_calibration(cpu) is None and not path.exists()
    data = C.calibrate(cpu).to_json()
    data["points"]["matmul"] = [[1.0, -5.0]]  # valid JSON, impossible figure
    path.write_text(json.dumps(data))
    assert C.load_calibration(cpu) is None
    assert C.calibration_for(cpu) is not None and path.exists()


def test_clear_removes_the_cached_files(cache):
    C.calibrate(_backend("cpu"))
    assert C.clear_calibrations("cpu") == 1
    assert C.clear_calibrations() == 0


def test_interpolation_between_and_beyond_the_measured_points():
    cal = C.Calibration("x", "k", {"matmul": [(100.0, 1.0), (200.0, 2.0), (400.0, 6.0)]})
    assert cal.time("matmul", 150) == pytest.approx(1.5)
    assert cal.time("matmul", 300) == pytest.approx(4.0)
    assert cal.time("matmul", 800) == pytest.approx(14.0)  # the last slope, extended
    assert cal.time("matmul", 0) == pytest.approx(0.5)  # never below half the fastest point
    assert cal.time("conv", 10) is None  # not measured: the declared figures are used


def test_an_unknown_mode_is_refused(monkeypatch):
    with pytest.raises(anychip.AnychipError, match="calibration="):
        C.resolve_calibration_mode("sometimes")
    monkeypatch.setenv("ANYCHIP_CALIBRATION", "bogus")
    with pytest.raises(anychip.AnychipError, match="ANYCHIP_CALIBRATION"):
        C.resolve_calibration_mode(None)


def _write(backend, scale: float, link: tuple[float, float] | None) -> None:
    points = {cls: [(1e3, 1e-5 * scale), (1e9, 1e-1 * scale)] for cls in C._CLASSES}
    spread = dict.fromkeys(points, 0.0)
    C._save(backend, C.Calibration(backend.name, C.cache_key(backend), points, link, spread=spread))


@pytest.mark.skipif(
    not any(d.name == "xpu" and d.available for d in anychip.devices()), reason="no XPU here"
)
def test_measured_costs_decide_between_mixed_and_single_device(cache):
    model = transformer_layer(seq=16, hidden=64, heads=2, ffn=128)
    x = np.random.default_rng(1).standard_normal((1, 16, 64)).astype(np.float32)
    _write(_backend("cpu"), 1.0, None)
    _write(_backend("xpu"), 1000.0, (1e-3, 1e6))  # a slow device behind a slow link
    slow = anychip.load(model, devices=["xpu", "cpu"], calibration="cached")
    report = slow.placement()
    assert report.by_device() == {"cpu": len(report.nodes)}
    assert any(n.reason.startswith("cost:") for n in report.nodes)

    _write(_backend("xpu"), 0.001, (1e-7, 1e12))  # a fast device behind a fast link
    fast = anychip.load(model, devices=["xpu", "cpu"], calibration="cached")
    assert fast.placement().by_device().get("xpu", 0) > 0
    # The estimate counts the copies the partitioner inserts.
    graph = fast.compiled.model.graph
    costs = Costs([_backend("xpu"), _backend("cpu")], fast.options.calibrations)
    est = estimate(graph, {n: n.meta["device"] for n in graph.nodes}, costs, "cpu")
    assert est.copies == fast.placement().copy_count and est.seconds > 0
    ref = anychip.load(model, devices=["cpu"]).run(None, {"x": x})[0]
    for sess in (slow, fast):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-4)


def test_a_static_shape_device_is_timed_on_its_own_executable(cache, monkeypatch):
    """With background compiles on (the default outside the tests), a probe's runs went to
    the host while the NPU compiled, so the NPU's calibration held the host's times (or, on a
    busy process, the wait for the compile: 12-16 ms for a 0.1 ms product)."""
    import anychip.core.api.session  # noqa: F401 - installs calibration_probes.open_probe
    from anychip.core.plan import calibration_probes as P

    monkeypatch.setenv("ANYCHIP_BACKGROUND_COMPILE", "1")
    sessions = []
    open_probe = P.open_probe

    def spy(*a, **k):
        sessions.append(open_probe(*a, **k))
        return sessions[-1]

    monkeypatch.setattr(P, "open_probe", spy)
    points = P.measure_class(_backend("npu"), "linear", 2)
    assert points and sessions
    for s in sessions:
        for sp in s.compiled.specialized.values():
            t = sp.telemetry()
            assert t["host_runs"] == 0 and t["compiles"] >= 1, t


class _Clock:
    """A clock that a probe's calls advance by scripted durations (the first: the warm-up)."""

    def __init__(self, durations: list[float]) -> None:
        self.now, self.durations, self.calls = 0.0, list(durations), 0

    def __call__(self) -> float:
        return self.now

    def run(self) -> None:
        self.calls += 1
        self.now += self.durations.pop(0)


def test_a_probe_whose_runs_spread_widely_is_timed_again():
    # Another process took a core for most of the first round: its runs spread (median 20,
    # fastest 8); the next round, undisturbed, gives the device's time.
    clock = _Clock([50.0, 20.0, 20.0, 8.0, 20.0, 20.0, 1.0, 1.1, 1.0, 1.2, 1.0])
    assert C.best_of(clock.run, 5, clock) == 1.0
    assert clock.calls == 11 and not clock.durations
    # Runs that agree are timed once.
    steady = _Clock([50.0, 5.0, 5.2, 5.1, 5.0, 5.3, 1.0])
    assert C.best_of(steady.run, 5, steady) == 5.0
    assert steady.calls == 6
    # At most MAX_ROUNDS rounds, however wide.
    noisy = _Clock([50.0] + [1.0, 9.0, 9.0] * C.MAX_ROUNDS + [0.1] * 3)
    assert C.best_of(noisy.run, 3, noisy) == 1.0
    assert noisy.calls == 1 + 3 * C.MAX_ROUNDS


def test_each_point_is_the_faster_of_two_sweeps(cache, monkeypatch):
    sweeps: dict[str, int] = {}

    def measure(backend, cls, repeat):
        sweeps[cls] = sweeps.get(cls, 0) + 1
        if cls != "matmul":
            return []
        # A burst of load over the first sweep's large probe, over the second's small one.
        return [(1e3, 5e-6), (1e6, 9e-4)] if sweeps[cls] == 1 else [(1e3, 8e-6), (1e6, 3e-4)]

    monkeypatch.setattr("anychip.core.plan.calibration_probes.measure_class", measure)
    cal = C.calibrate(_backend("cpu"))
    assert cal.points == {"matmul": [(1e3, 5e-6), (1e6, 3e-4)]}
    assert set(sweeps.values()) == {C.SWEEPS} and C.SWEEPS == 2


def test_a_cached_calibration_is_never_measured_again_by_a_load(cache, monkeypatch):
    """Fixed figures: one taken under load 8 two minutes ago stays when the machine is at
    load 0 (the same placement every time); ``anychip calibrate`` replaces it, one version
    on, with the sweeps' spread as its uncertainty."""
    import time

    cpu = _backend("cpu")
    old = C.Calibration("cpu", C.cache_key(cpu), load=8.0, when=time.time() - 120)
    old.points = {"matmul": [(1e3, 5e-6), (1e6, 9e-4)]}
    C._save(cpu, old)
    sweeps: list[str] = []

    def measure(backend, cls, repeat):
        sweeps.append(cls)
        # the second sweep 20% slower at the small point
        slow = 1.2 if sweeps.count(cls) == 2 else 1.0
        return [(1e3, 8e-6 * slow), (1e6, 3e-4)] if cls == "matmul" else []

    monkeypatch.setattr("anychip.core.plan.calibration_probes.measure_class", measure)
    monkeypatch.setattr(C, "_load_average", lambda: 0.0)
    assert C.calibration_for(cpu).points == old.points
    anychip.load(transformer_layer(), devices=["cpu"], calibration="auto")
    assert not sweeps and C.load_calibration(cpu).points == old.points
    new = C.calibrate(cpu, since=old)
    assert sweeps.count("matmul") == C.SWEEPS and new.version == 2
    assert new.points["matmul"] == [(1e3, 8e-6), (1e6, 3e-4)]
    assert new.spread["matmul"] == pytest.approx(0.2)
    assert new.uncertainty("matmul") == pytest.approx(0.2)
    assert new.uncertainty("conv") == C.DEFAULT_SPREAD  # not measured: no spread
    assert C.load_calibration(cpu).version == 2


def test_a_load_never_waits_for_a_new_device_to_be_measured(cache, monkeypatch):
    """No calibration here: the load places on the host at once (declared figures are not
    trusted), a background thread measures (slowly, here) and saves; the next load uses the
    figures. A calibration saved meanwhile (another process's) is not replaced."""
    import threading
    import time

    from anychip.core.plan import calibration_background as B

    started, release = threading.Event(), threading.Event()

    def measure(backend, cls, repeat):
        started.set()
        release.wait(10)  # a calibration that takes as long as the test wants
        return [(1e3, 1e-6), (1e6, 1e-3)] if cls == "matmul" else []

    monkeypatch.setattr("anychip.core.plan.calibration_probes.measure_class", measure)
    monkeypatch.setattr("anychip.core.plan.calibration_probes.measure_link", lambda b, r: None)
    model = transformer_layer()
    t0 = time.perf_counter()
    sess = anychip.load(model, devices=["xpu", "cpu"], calibration="auto")
    assert started.wait(10) and not release.is_set()  # measuring, and the load is done
    assert time.perf_counter() - t0 < 10
    assert sess.compiled.costs is not None and not sess.compiled.costs.cals
    assert set(sess.placement().by_device()) == {"cpu"}  # nothing unmeasured is trusted
    threads = [t for t in threading.enumerate() if t.name.startswith("anychip-calibrate-")]
    assert {t.name for t in threads} == {"anychip-calibrate-xpu", "anychip-calibrate-cpu"}
    assert B.measure_in_background(_backend("xpu")) in threads  # one thread per device
    cpu = _backend("cpu")
    saved = C.Calibration("cpu", C.cache_key(cpu), {"op:Tanh": [(4096.0, 2e-6)]})
    C._save(cpu, saved)  # another process's, saved meanwhile
    release.set()
    for t in threads:
        t.join(30)
    assert C.load_calibration(cpu).points == saved.points  # the first one stays
    assert C.load_calibration(_backend("xpu")).points["matmul"] == [(1e3, 1e-6), (1e6, 1e-3)]
    again = anychip.load(model, devices=["xpu", "cpu"], calibration="auto")
    assert set(again.compiled.costs.cals) == {"xpu", "cpu"}
    assert not [t for t in threading.enumerate() if t.name.startswith("anychip-calibrate-")]
