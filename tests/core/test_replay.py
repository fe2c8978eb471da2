"""The recorded kernel calls of a static-shape CPU partition, replayed
(``backends/cpu/replay/record.py``):
equal to the kernels' path and to onnxruntime on new random inputs every run, at one and two
threads; outputs the caller owns; the switches; profiling through the kernels; a second
thread meanwhile on the usual path; the buffers placed as the dry pass timed them."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from threadpoolctl import threadpool_limits

import anychip
from anychip.backends.cpu.onednn import _lib
from anychip.backends.cpu.replay import run as replay
from anychip.backends.cpu.replay.record import Recorder, seal
from bench.cpu_models import densenet_like, mobilenet_like, shufflenet_like

RUNS = 8  # past replay.RECORD_AT: the later runs replay
#: Runs within which a trace is kept (timing rules off: ``_no_timing``).
ENOUGH = replay.REPLAY_FROM - 1


@pytest.fixture(autouse=True)
def _no_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules that time runs (a partition of slow nodes is not recorded, a replay slower
    than the kernels is not kept) off: a loaded machine's timings would decide these tests;
    ``test_the_timing_rules`` sets them."""
    monkeypatch.setattr(replay, "SLOW_NODE", float("inf"))
    monkeypatch.setattr(replay, "GAIN", float("inf"))


def _session(model: onnx.ModelProto, **cpu: object) -> anychip.Session:
    return anychip.load(model.SerializeToString(), devices=["cpu"], device_options={"cpu": cpu})


def _replay_of(sess: anychip.Session) -> replay.Replay:
    (pm,) = sess.compiled.part_memory.values()
    assert pm.around is not None  # the CPU's runner hook installed its replay
    return pm.around.__self__


def _inputs(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random images; for the tiny BERT, token ids under 100 and a mask whose tail is cut."""
    weights = {t.name for t in model.graph.initializer}
    feeds = {}
    for x in [v for v in model.graph.input if v.name not in weights]:
        shape = [d.dim_value or 24 for d in x.type.tensor_type.shape.dim]  # symbolic: 24
        if x.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            feeds[x.name] = rng.standard_normal(shape).astype(np.float32)
        elif "mask" in x.name:
            feeds[x.name] = (np.arange(shape[-1]) < rng.integers(8, shape[-1])).astype(np.int64)
            feeds[x.name] = np.broadcast_to(feeds[x.name], shape).copy()
        else:
            feeds[x.name] = rng.integers(0, 100, shape).astype(np.int64)
    return feeds


def _squeezenet(size: int, seed: int) -> onnx.ModelProto:
    """The light SqueezeNet (its channel Concats channels-last between oneDNN kernels)."""
    from anychip.zoo import light_model

    return light_model("squeezenet", seed=seed)  # type: ignore[return-value]


def _hf_bert_tiny(size: int, seed: int) -> onnx.ModelProto:
    """The tiny BERT export (a symbolic length: a plan per shape; a ShapeMemo node with a
    nested graph; MatMulAdd, attention and SkipLayerNormalization kernels)."""
    import os

    return onnx.load(os.path.join(os.path.dirname(__file__), "..", "data", "hf_bert_tiny.onnx"))


def _lstm(size: int, seed: int) -> onnx.ModelProto:
    """The bench's LSTM (batch 8: split by batch over two threads, the parts joined)."""
    from bench.models import lstm

    return onnx.load_from_string(lstm(seed=seed))


def _bert_like(size: int, seed: int) -> onnx.ModelProto:
    """The bench's BERT-like layer (its attention on the pool at two threads)."""
    from bench.models import _bert_like

    return onnx.load_from_string(_bert_like())


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "build",
    [shufflenet_like, densenet_like, mobilenet_like, _squeezenet, _hf_bert_tiny, _lstm, _bert_like],
)
def test_replays_equal_the_kernels_and_onnxruntime_on_new_inputs(build, threads) -> None:
    assert _lib.available(), _lib.unavailable_reason()
    model = build(size=64, seed=3)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(threads)
    with threadpool_limits(limits=threads):
        sess = _session(model, thread_choice=False)
        plain = _session(model, replay=False, thread_choice=False)
        r, replayed, tol = _replay_of(sess), 0, 1e-5 if threads == 1 else 1e-4
        for k in range(ENOUGH + RUNS):
            feeds = _inputs(model, rng)
            replayed += bool(r.traces)  # this run replays
            got, kernels, want = sess.run(None, feeds), plain.run(None, feeds), ref.run(None, feeds)
            for g, p, w in zip(got, kernels, want, strict=True):
                # two threads: a split may run whole in one session (the pool backing off)
                np.testing.assert_allclose(g, p, rtol=tol, atol=tol / 10, err_msg=f"run {k}")
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"run {k}")
    assert replayed >= RUNS, r.info
    assert len(r.traces) == 1, r.info
    (trace,) = r.traces.values()
    assert trace.sealed * 2 >= trace.total
    assert "nodes replayed as" in r.info["replay"]


def test_the_switches_turn_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    model = shufflenet_like(size=32, seed=1)
    sess = _session(model, replay=False)
    assert all(pm.around is None for pm in sess.compiled.part_memory.values())
    monkeypatch.setenv("ANYCHIP_REPLAY", "0")
    sess = _session(model)
    feeds = _inputs(model, np.random.default_rng(0))
    for _ in range(RUNS):
        sess.run(None, feeds)
    # ANYCHIP_REPLAY=0: no interceptor at all, the runs go straight to the kernels
    assert all(pm.around is None for pm in sess.compiled.part_memory.values())
    with pytest.raises(anychip.AnychipError, match="replay is True or False"):
        _session(model, replay="yes")


def test_outputs_belong_to_the_caller() -> None:
    """Each run returns new arrays: the next replay does not write into the last result."""
    model = shufflenet_like(size=32, seed=2)
    sess = _session(model)
    rng = np.random.default_rng(5)
    outs = []
    for _ in range(RUNS):
        feeds = _inputs(model, rng)
        (y,) = sess.run(None, feeds)
        outs.append((y, y.copy()))
    assert _replay_of(sess).traces
    for y, kept in outs:
        np.testing.assert_array_equal(y, kept)
    assert len({id(y) for y, _ in outs}) == len(outs)
    assert not np.array_equal(outs[-1][0], outs[-2][0])


def test_profile_times_every_node_through_its_kernel() -> None:
    model = shufflenet_like(size=32, seed=4)
    sess = _session(model)
    feeds = _inputs(model, np.random.default_rng(6))
    for _ in range(RUNS):
        sess.run(None, feeds)
    assert _replay_of(sess).traces
    prof = sess.profile(feeds, runs=2)
    ops = {op for _, op, _, _ in prof.node_times()}
    assert "FusedConv" in ops and len(prof.node_times()) > 10
    assert not _replay_of(sess).suspended  # replays again after


def _replaying(
    model: onnx.ModelProto, seed: int
) -> tuple[anychip.Session, anychip.Session, np.random.Generator]:
    """A session past its recording (``RUNS`` runs on new inputs), one without the replay,
    and the inputs' generator."""
    sess = _session(model, thread_choice=False)
    plain = _session(model, replay=False, thread_choice=False)
    rng = np.random.default_rng(seed)
    for _ in range(RUNS):
        sess.run(None, _inputs(model, rng))
    return sess, plain, rng


def test_a_second_thread_meanwhile_gets_its_own_answer() -> None:
    model = densenet_like(size=32, seed=5)
    sess, plain, rng = _replaying(model, 7)
    cases = [_inputs(model, rng) for _ in range(12)]
    want = [plain.run(None, f)[0] for f in cases]
    got: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def worker(ids: range) -> None:
        try:
            for i in ids:
                got[i] = sess.run(None, cases[i])[0]
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(range(k, 12, 3),)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, w in enumerate(want):
        np.testing.assert_allclose(got[i], w, rtol=1e-5, atol=1e-6, err_msg=f"case {i}")


def test_mostly_unrecorded_partitions_are_not_kept() -> None:
    """CumSum's nodes are numpy calls that are not noted: the trace is dropped and the runs
    take the usual path, with the reason in the partition's info; every run's answer, the
    recording run's too, is the kernels'. (An MLP was the example until its FusedGemm and
    Softmax noted their calls: ``tests/backends/cpu/test_replay_small.py``.)"""
    axis = onnx.numpy_helper.from_array(np.array(1, np.int64), "axis")
    nodes = [
        onnx.helper.make_node("CumSum", ["x", "axis"], ["a"]),
        onnx.helper.make_node("CumSum", ["a", "axis"], ["b"], reverse=1),
        onnx.helper.make_node("CumSum", ["b", "axis"], ["y"], exclusive=1),
    ]
    graph = onnx.helper.make_graph(
        nodes,
        "cumsums",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 64])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 64])],
        [axis],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    sess = _session(model)
    plain = _session(model, replay=False)
    rng = np.random.default_rng(8)
    for k in range(RUNS):
        feeds = {"x": rng.standard_normal((4, 64)).astype(np.float32)}
        np.testing.assert_allclose(
            sess.run(None, feeds)[0], plain.run(None, feeds)[0], rtol=1e-6, err_msg=f"run {k}"
        )
    r = _replay_of(sess)
    assert not r.traces and r.info["replay"].startswith("not kept:"), r.info


def test_buffers_share_bytes_only_when_their_lifetimes_do_not_meet() -> None:
    rec = Recorder(lambda: None)
    a = rec.empty((256,), np.float32)  # 1 KiB
    b = rec.empty((256,), np.float32)
    del a  # dropped before c is made: c may take its bytes
    c = rec.empty((256,), np.float32)
    offsets, size = rec.plan()
    assert offsets[0][0] == offsets[2][0] and offsets[1][0] != offsets[0][0]
    assert [n for _, n, _ in offsets] == [1024] * 3
    assert size == 2048
    block = np.zeros(size, np.uint8)
    placed = Recorder(lambda: None, block, offsets)
    views = [placed.empty((256,), np.float32) for _ in range(3)]
    assert all(v.base is not None for v in views) and not placed.broken
    assert placed.empty((9,), np.float32).size == 9 and placed.broken  # not as timed
    del b, c


def test_a_kernel_that_seals_work_it_did_not_note_is_caught_by_the_check_replay() -> None:
    """A kernel claiming its numpy work was noted calls (here the head's Gemm, sealing with
    nothing noted): the replay on the check input differs from the kernels' run, the trace is
    not kept, and every run's answer stays the kernels'."""
    model = shufflenet_like(size=32, seed=9)
    sess = _session(model, thread_choice=False)
    plain = _session(model, replay=False, thread_choice=False)
    (pm,) = sess.compiled.part_memory.values()
    (ins,) = [i for i in pm.program.instrs if i.node.op_type == "Gemm"]
    honest = ins.fn

    def lying(*args: object, **kw: object) -> object:
        y = honest(*args, **kw)
        seal()
        return y

    ins.fn = lying
    rng = np.random.default_rng(10)
    for k in range(ENOUGH):
        feeds = _inputs(model, rng)
        np.testing.assert_allclose(
            sess.run(None, feeds)[0], plain.run(None, feeds)[0], rtol=1e-5, atol=1e-6,
            err_msg=f"run {k}",
        )  # fmt: skip
    r = _replay_of(sess)
    assert not r.traces
    assert (
        r.info["replay"] == "not kept: its replay differed from the kernels' run on a check input"
    )


def test_the_timing_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes slower than ``SLOW_NODE`` on average: not recorded, the partition off; a replay
    not under ``GAIN`` of the kernels' time: not kept, recorded again after ``RETRY`` runs."""
    model = shufflenet_like(size=32, seed=11)
    feeds = _inputs(model, np.random.default_rng(12))
    monkeypatch.setattr(replay, "SLOW_NODE", 0.0)
    sess = _session(model)
    for _ in range(RUNS):
        sess.run(None, feeds)
    r = _replay_of(sess)
    assert r.off and r.info["replay"].startswith("off: its nodes take"), r.info
    monkeypatch.setattr(replay, "SLOW_NODE", float("inf"))
    monkeypatch.setattr(replay, "GAIN", 0.0)
    sess = _session(model)
    r = _replay_of(sess)
    for _ in range(replay.REPLAY_FROM - 1):
        sess.run(None, feeds)
    assert not r.traces and "recorded again in 8 runs" in r.info["replay"], r.info
    assert r.info["replay"].startswith("not kept: its replay took"), r.info
    monkeypatch.setattr(replay, "GAIN", float("inf"))
    for _ in range(replay.RETRY + replay.STEPS - 2):  # the wait, then the recording's steps
        sess.run(None, feeds)
    assert not r.traces
    sess.run(None, feeds)
    assert r.traces, r.info


def test_a_view_kernel_is_sealed_only_for_views_of_its_arguments() -> None:
    """An ``alias=True`` kernel that noted nothing replays as nothing only when each result
    is an argument's memory (Reshape's view); a copy (Reshape of a strided input) re-runs."""
    from anychip.backends.cpu.replay.run import _views_of

    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert _views_of([x.reshape(6, 4)], [x, np.array([6, 4])])
    assert _views_of([x, None], [x])  # Dropout's identity, its mask not asked for
    assert not _views_of([x.T.reshape(-1)], [x.T])
    assert not _views_of([None], [x])


def test_a_replayed_call_that_raises_drops_the_trace_and_the_kernels_answer() -> None:
    """A recorded call failing on replay (a driver error, say): the trace is dropped with
    the reason in the partition's info and the run's answer comes from the kernels' path."""
    model = shufflenet_like(size=32, seed=13)
    sess, plain, rng = _replaying(model, 14)
    r = _replay_of(sess)
    (trace,) = r.traces.values()

    def failing() -> None:
        raise RuntimeError("device lost")

    trace.steps.insert(len(trace.steps) // 2, (failing, (), trace.steps[0][2]))
    feeds = _inputs(model, rng)
    np.testing.assert_allclose(sess.run(None, feeds)[0], plain.run(None, feeds)[0], rtol=1e-6)
    assert not r.traces
    assert r.info["replay"] == "dropped: a replayed call raised RuntimeError: device lost"


def test_no_request_runs_the_partition_more_than_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recording is spread over ``STEPS`` requests: each runs its own inputs once and at
    most one more run (of the check) besides, where all of it in one request made that run
    7-20x the steady time (a fresh process's third run)."""
    model = shufflenet_like(size=32, seed=5)
    feeds = _inputs(model, np.random.default_rng(6))
    sess = _session(model, thread_choice=False)
    r = _replay_of(sess)
    calls = {"n": 0}
    program_run, play = r.program.run, replay.Trace.play

    def counted_run(*a: object, **k: object) -> object:
        calls["n"] += 1
        return program_run(*a, **k)

    def counted_play(self: replay.Trace, *a: object, **k: object) -> object:
        calls["n"] += 1
        return play(self, *a, **k)

    monkeypatch.setattr(r.program, "run", counted_run)
    monkeypatch.setattr(replay.Trace, "play", counted_play)
    per_request = []
    for _ in range(replay.REPLAY_FROM + 2):
        calls["n"] = 0
        sess.run(None, feeds)
        per_request.append(calls["n"])
    assert r.traces, r.info  # kept at the end of the steps
    assert max(per_request) == 2 and per_request[-1] == 1, per_request
    assert sum(n > 1 for n in per_request) == 2, per_request  # the check's two halves
