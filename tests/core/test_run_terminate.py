"""``RunOptions.terminate`` honoured while a request runs (core/run/cancel.py): set from
another thread, it stops the request between nodes and partitions with
``RunTerminatedError``; the session stays usable and its next run equals onnxruntime's."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.core.api.ort_api import RunOptions
from anychip.errors import RunTerminatedError

RNG = np.random.default_rng(44)
N = 256  # the chain's width: a MatMul of [N, N] by [N, N] takes a few ms


def _chain(layers: int, n: int = N) -> bytes:
    """y = Tanh(...Tanh(x @ W0) @ W1 ...): ``layers`` MatMul+Tanh pairs, scaled to stay in range."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        w = (RNG.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        out = "y" if i == layers - 1 else f"t{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [out], name=f"tanh{i}"))
        prev = out
    graph = helper.make_graph(nodes, "chain", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


def _ort(model: bytes, x: np.ndarray) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _x(n: int = N) -> np.ndarray:
    return RNG.standard_normal((n, n)).astype(np.float32)


class _Watched(RunOptions):
    """RunOptions whose reads of ``terminate`` are counted; ``started`` is set at the second
    (the first is the check before the run: the second is the run's own, at its first step)."""

    def __init__(self) -> None:
        super().__init__(run_tag="long")
        self.started = threading.Event()
        self.reads = 0

    def __getattribute__(self, name: str):
        if name == "terminate":
            self.reads += 1
            if self.reads >= 2:
                self.started.set()
        return super().__getattribute__(name)


def _terminate_from_a_thread(sess: anychip.Session, x: np.ndarray) -> tuple[_Watched, str]:
    """Run ``sess`` on ``x`` in a thread, set ``terminate`` from this one once it runs; the
    error's text."""
    opts = _Watched()
    caught: list[BaseException] = []

    def request() -> None:
        try:
            sess.run(None, {"x": x}, opts)
        except BaseException as e:  # handed to the test's thread
            caught.append(e)

    worker = threading.Thread(target=request)
    worker.start()
    assert opts.started.wait(120), "the request never started"
    opts.terminate = True
    worker.join(120)
    assert not worker.is_alive()
    assert len(caught) == 1 and isinstance(caught[0], RunTerminatedError), caught
    return opts, str(caught[0])


def test_terminate_from_another_thread_stops_a_cpu_run_between_nodes() -> None:
    layers = 60
    model, x = _chain(layers), _x()
    sess = anychip.load(model, devices=["cpu"])
    opts, text = _terminate_from_a_thread(sess, x)
    assert "long: terminated (RunOptions.terminate) while running, before node" in text, text
    # stopped inside the run: far fewer checks than its 2 * layers nodes (one per node)
    assert opts.reads < 2 * layers, (opts.reads, text)
    for _ in range(2):  # usable after: the next runs are onnxruntime's answer
        x = _x()
        _close(sess.run(None, {"x": x})[0], _ort(model, x))


def test_terminate_between_partitions_blames_no_device() -> None:
    """On xpu+cpu (every Tanh pinned to the cpu: one partition per node) a terminated request
    is no device failure: no failover, the placement kept, the xpu's memory given back."""
    layers = 30
    model, x = _chain(layers), _x()
    sess = anychip.load(
        model, devices=["xpu", "cpu"], cost_model=False, placement={"Tanh": "cpu", "MatMul": "xpu"}
    )
    where = sess.placement().by_device()
    assert set(where) == {"xpu", "cpu"}, where
    xpu = next(b for b in sess.compiled.backends if b.name == "xpu")
    _close(sess.run(None, {"x": x})[0], _ort(model, x))
    in_use = xpu.memory_stats().in_use
    opts, text = _terminate_from_a_thread(sess, x)
    assert "while running, before" in text, text
    assert sess.unhealthy == {} and sess.failed_over == {}
    assert sess.placement().by_device() == where
    assert xpu.memory_stats().in_use == in_use  # what the stopped run held is given back
    x = _x()
    _close(sess.run(None, {"x": x})[0], _ort(model, x))


class _AfterReads:
    """onnxruntime's RunOptions shape whose ``terminate`` turns true at read ``at``: the
    request stops at a known node, no thread needed."""

    log_severity_level = 2
    logid = "counted"

    def __init__(self, at: int) -> None:
        self.at, self.reads = at, 0

    @property
    def terminate(self) -> bool:
        self.reads += 1
        return self.reads >= self.at


@pytest.mark.parametrize("at", [2, 5, 40])
def test_terminate_at_any_node_leaves_the_replay_and_next_runs_right(at: int) -> None:
    """A CPU partition is replayed after a few runs (backends/cpu/replay): a request
    terminated there, or while it records, keeps the replay and the next answers right."""
    model = _chain(20, n=8)  # small nodes: a replay is much faster than the kernels' path
    sess = anychip.load(model, devices=["cpu"])
    info = sess.partitions[0].info
    for i in range(16):
        # at the recording's first step, at its third (it starts again: 5 steps, one a run,
        # backends/cpu/replay/run.STEPS), and at a replayed run
        if i in (2, 4, 12):
            before = info.get("replay")
            opts = _AfterReads(at)
            with pytest.raises(RunTerminatedError, match="counted: terminated"):
                sess.run(None, {"x": _x(8)}, opts)
            assert opts.reads == at
            assert info.get("replay") == before  # the trace is neither dropped nor changed
        x = _x(8)
        _close(sess.run(None, {"x": x})[0], _ort(model, x))
    # recorded (kept or not is the replay's timing: a loaded machine may find it slower)
    assert "replay" in info and "RunTerminated" not in info["replay"], info


def test_options_are_per_thread_and_gone_after_the_run() -> None:
    from anychip.core.run import cancel

    model, x = _chain(2), _x()
    sess = anychip.load(model, devices=["cpu"])
    sess.run(None, {"x": x}, RunOptions(run_tag="t"))
    assert cancel.current() is None
    with pytest.raises(RunTerminatedError):
        sess.run(None, {"x": x}, _AfterReads(2))
    assert cancel.current() is None  # a terminated run leaves nothing watched behind
