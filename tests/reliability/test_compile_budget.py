"""Every compile ends (issue 47, decision 050): a graph compile past its ``compile_timeout``
is abandoned (a cooperative compile stops at its next checkpoint, a child process is killed,
anything else is left to finish and its result given back), its partition runs elsewhere with
the reason in the report, ``strict`` makes it an error naming the partition, and ``close()``
never waits for a hung compile."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import anychip
from anychip.backends.npu_stub.backend import NpuBackend
from anychip.backends.npu_stub.passes.convert_to_nhwc import ConvertToNhwcPass
from anychip.core.plugin.budget import Deadline, current, default_timeout, run_tool, within
from tests.reliability.test_termination import _layer_norm_scale

pytestmark = pytest.mark.usefixtures("no_compile_cache")  # they watch the compile itself

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def npu_hangs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The NPU's compile hangs (it checks no deadline) until the test ends; the list counts
    the compiles that got there."""
    release, started = threading.Event(), []

    def compile(self: NpuBackend, graph: object) -> object:
        started.append(1)
        release.wait(120)
        raise RuntimeError("the hung compile ended with its test")

    monkeypatch.setattr(NpuBackend, "compile", compile)
    yield started
    release.set()


def _x() -> np.ndarray:
    return np.random.default_rng(21).standard_normal((1, 4, 8, 8)).astype(np.float32)


def _on_cpu(model: object) -> np.ndarray:
    return anychip.load(model, devices=["cpu"]).run(None, {"x": _x()})[0]


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "anychip-compile-worker"]


def test_a_hung_compile_at_load_is_abandoned_and_its_partition_runs_on_the_cpu(
    npu_hangs: list[int],
) -> None:
    model = _layer_norm_scale(True)
    t0 = time.monotonic()
    sess = anychip.load(
        model, devices=["npu", "cpu"], cost_model=False, background_compile=False,
        compile_timeout=0.5,
    )  # fmt: skip
    assert time.monotonic() - t0 < 20 and npu_hangs  # it never returned before
    assert sess.placement().by_device() == {"cpu": 4}
    text = str(sess.placement())
    assert "compile of partition 0 on npu abandoned after its 0.5 s budget" in text, text
    np.testing.assert_allclose(sess.run(None, {"x": _x()})[0], _on_cpu(model), rtol=1e-5)


def test_strict_makes_the_timeout_an_error_naming_the_partition(npu_hangs: list[int]) -> None:
    with pytest.raises(anychip.CompileTimeout, match="partition 0 on npu.*raise compile_timeout"):
        anychip.load(
            _layer_norm_scale(True), devices=["npu"], strict=True, background_compile=False,
            compile_timeout=0.3,
        )  # fmt: skip


def test_a_hung_background_compile_leaves_the_partition_on_the_host(
    npu_hangs: list[int],
) -> None:
    model = _layer_norm_scale(True)
    sess = anychip.load(
        model, devices=["npu", "cpu"], cost_model=False, background_compile=True,
        compile_timeout=0.3,
    )  # fmt: skip
    (sp,) = sess.compiled.specialized.values()
    sess.run(None, {"x": _x()})  # the host serves it and the compile starts
    assert sp.wait(20), "the compile thread still waits for the hung compile"
    got = sess.run(None, {"x": _x()})[0]
    np.testing.assert_allclose(got, _on_cpu(model), rtol=1e-5, atol=1e-5)
    text = str(sess.placement())
    assert "runs_on_host=2 of 2" in text, text
    assert "on npu abandoned after its 0.3 s budget; ran on the host" in text, text
    t0 = time.monotonic()
    sess.close()
    assert time.monotonic() - t0 < 5


def test_strict_background_runs_get_the_timeout(npu_hangs: list[int]) -> None:
    sess = anychip.load(
        _layer_norm_scale(True), devices=["npu"], strict=True, background_compile=True,
        compile_timeout=0.3,
    )  # fmt: skip
    (sp,) = sess.compiled.specialized.values()
    sess.run(None, {"x": _x()})
    assert sp.wait(20)
    with pytest.raises(anychip.DeviceError, match="abandoned after.*raise compile_timeout"):
        sess.run(None, {"x": _x()})


def test_a_looping_pass_stops_at_its_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NHWC pass's cancel step made slow and endless (1 s a round, 24 rounds to its
    bound): the compile thread itself stops at the deadline, not only the wait for it."""

    def spin(graph: object) -> bool:
        time.sleep(1.0)
        return True

    monkeypatch.setattr(ConvertToNhwcPass, "_cancel", staticmethod(spin))
    model = _layer_norm_scale(True)
    sess = anychip.load(
        model, devices=["npu", "cpu"], cost_model=False, background_compile=False,
        compile_timeout=0.3,
    )  # fmt: skip
    assert sess.placement().by_device() == {"cpu": 4}
    assert "abandoned after its 0.3 s budget" in str(sess.placement())
    end = time.monotonic() + 5
    while _workers() and time.monotonic() < end:
        time.sleep(0.05)
    assert not _workers(), "the compile thread kept running past its deadline"


def test_the_npu_with_a_tiny_budget_runs_a_real_model_on_the_cpu() -> None:
    ort = pytest.importorskip("onnxruntime")
    from tests.models import light

    model = light("squeezenet")
    x = np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString())
    name = ref.get_inputs()[0].name
    sess = anychip.load(
        model, devices=["npu", "cpu"], background_compile=False, compile_timeout=0.001
    )
    report = sess.placement()
    assert set(report.by_device()) == {"cpu"} and "abandoned after" in str(report)
    want = ref.run(None, {name: x})[0]
    np.testing.assert_allclose(sess.run(None, {name: x})[0], want, rtol=1e-4, atol=1e-4)
    # with the default budget it compiles for the NPU as before
    assert "npu" in anychip.load(model, devices=["npu", "cpu"]).placement().by_device()


def test_a_child_process_is_killed_at_the_deadline() -> None:
    done: list[subprocess.CompletedProcess] = []
    deadline = Deadline(0.3, "compile of a test")
    t0 = time.monotonic()
    with pytest.raises(anychip.CompileTimeout, match="after its 0.3 s budget"):
        within(deadline, lambda: done.append(run_tool(["sleep", "30"], b"")))
    assert time.monotonic() - t0 < 5
    end = time.monotonic() + 5
    while _workers() and time.monotonic() < end:  # the worker saw its tool killed and ended
        time.sleep(0.05)
    assert not _workers() and not done


def test_iree_compile_is_a_child_process_killed_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """IREE's compiler stands in as a tool that never ends (``sleep``): at the deadline it is
    killed, its thread ends, and the partition runs on the CPU."""
    from iree.compiler.tools import core as iree_tools

    from tests.backends.iree.conftest import backend_or_skip

    backend_or_skip("iree-cpu")
    marker = f"{time.time_ns() % 10**9 / 1000:.3f}"  # the stand-in's own argument, to find it
    real = iree_tools.build_compile_command_line

    def command(*args: object) -> list[str]:  # the partition's compile, not the op probes'
        return ["sleep", f"{3600 + float(marker)}"] if current() else real(*args)

    monkeypatch.setattr(iree_tools, "build_compile_command_line", command)
    model = _layer_norm_scale(False)
    sess = anychip.load(
        model, devices=["iree-cpu", "cpu"], cost_model=False, background_compile=False,
        compile_timeout=2,
    )  # fmt: skip
    assert sess.placement().by_device() == {"cpu": 4}
    assert "on iree-cpu abandoned after its 2.0 s budget" in str(sess.placement())
    np.testing.assert_allclose(sess.run(None, {"x": _x()})[0], _on_cpu(model), rtol=1e-5)
    end = time.monotonic() + 5
    while _workers() and time.monotonic() < end:
        time.sleep(0.05)
    assert not _workers()
    left = subprocess.run(["pgrep", "-f", f"sleep {3600 + float(marker)}"], capture_output=True)
    assert left.returncode == 1, left.stdout  # no process matched: the tool was killed


def test_a_probe_past_its_budget_refuses_for_this_process_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """IREE's capability probes compile outside any partition's deadline: their tool has the
    default budget; one killed refuses the nodes still unasked, and nothing of it is cached
    on disk (the next process asks again)."""
    from iree.compiler.tools import core as iree_tools
    from onnx import TensorProto, helper

    from tests.backends.iree.conftest import backend_or_skip

    backend = backend_or_skip("iree-cpu")
    monkeypatch.setattr(backend.prober, "_timed_out", None)  # put back after the test
    monkeypatch.setattr(iree_tools, "build_compile_command_line", lambda *a: ["sleep", "3600"])
    monkeypatch.setenv("ANYCHIP_COMPILE_TIMEOUT", "1")
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Sin", ["x"], ["s"]), helper.make_node("Cos", ["s"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "probe",
        [helper.make_tensor_value_info("x", f, [3, 29])],
        [helper.make_tensor_value_info("y", f, [3, 29])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    t0 = time.monotonic()
    sess = anychip.load(model, devices=["iree-cpu", "cpu"], cost_model=False, compile_timeout=1)
    assert time.monotonic() - t0 < 30
    assert sess.placement().by_device() == {"cpu": 2}
    assert "sleep killed after its 1.0 s budget" in str(sess.placement())
    x = np.random.default_rng(8).standard_normal((3, 29)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.cos(np.sin(x)), rtol=1e-5)
    assert not list(tmp_path.rglob("probes-*.json")) or "sleep" not in "".join(
        p.read_text() for p in tmp_path.rglob("probes-*.json")
    )


def test_a_tool_outside_any_compile_has_the_default_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANYCHIP_COMPILE_TIMEOUT", "0.3")
    t0 = time.monotonic()
    with pytest.raises(anychip.CompileTimeout, match="sleep killed after its 0.3 s budget"):
        run_tool(["sleep", "30"], b"")
    assert time.monotonic() - t0 < 5
    assert run_tool(["cat"], b"vmfb").stdout == b"vmfb"


def test_within_returns_and_raises_what_the_compile_does() -> None:
    assert within(Deadline(None, "x"), lambda: 7) == 7
    with pytest.raises(ZeroDivisionError):
        within(Deadline(5, "x"), lambda: 1 / 0)
    given_back: list[str] = []
    gate = threading.Event()

    def late() -> str:
        gate.wait(10)
        return "executable"

    with pytest.raises(anychip.CompileTimeout):
        within(Deadline(0.1, "x"), late, late=given_back.append)
    gate.set()
    end = time.monotonic() + 5
    while not given_back and time.monotonic() < end:
        time.sleep(0.02)
    assert given_back == ["executable"]  # what an abandoned compile made goes back


def test_the_budget_option_and_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANYCHIP_COMPILE_TIMEOUT", raising=False)
    assert anychip.SessionOptions().compile_timeout == 300.0
    monkeypatch.setenv("ANYCHIP_COMPILE_TIMEOUT", "12.5")
    assert anychip.SessionOptions().compile_timeout == 12.5
    monkeypatch.setenv("ANYCHIP_COMPILE_TIMEOUT", "none")
    assert default_timeout() is None
    monkeypatch.setenv("ANYCHIP_COMPILE_TIMEOUT", "soon")
    with pytest.raises(anychip.AnychipError, match="ANYCHIP_COMPILE_TIMEOUT='soon'"):
        anychip.SessionOptions()
    monkeypatch.delenv("ANYCHIP_COMPILE_TIMEOUT")
    assert anychip.SessionOptions(compile_timeout=None).compile_timeout is None
    assert anychip.SessionOptions(compile_timeout=float("inf")).compile_timeout is None
    for bad in (0, -1, "30", True, float("nan")):
        with pytest.raises(anychip.AnychipError, match="compile_timeout must be"):
            anychip.SessionOptions(compile_timeout=bad)


_CLOSE_WHILE_HUNG = """
import threading, time
import numpy as np
import anychip
from anychip.backends.npu_stub.backend import NpuBackend
from tests.reliability.test_termination import _layer_norm_scale

def compile(self, graph):
    threading.Event().wait()  # hangs for good, deaf to every deadline

NpuBackend.compile = compile
x = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype(np.float32)
sess = anychip.load(_layer_norm_scale(True), devices=["npu", "cpu"], cost_model=False,
                    background_compile=True, compile_timeout=None)
sess.run(None, {"x": x})
(sp,) = sess.compiled.specialized.values()
sp.start_compiles()
time.sleep(0.5)
assert sp.compiling()
t0 = time.monotonic()
sess.run(None, {"x": x})  # the hung compile blocks no run
sess.close()
print("closed in", round(time.monotonic() - t0, 2))
"""


def test_close_while_a_compile_hangs_returns() -> None:
    """No budget at all (None) and a compile that never ends: ``close()`` stops waiting for
    it. In a child process, with a timeout: a hang would otherwise hang the test run."""
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", ""), ANYCHIP_COMPILE_CACHE="0")
    done = subprocess.run(
        [sys.executable, "-c", _CLOSE_WHILE_HUNG],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seconds = float(done.stdout.split("closed in")[1])
    assert seconds < 10, done.stdout
