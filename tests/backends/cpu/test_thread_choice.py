"""The CPU partition's thread choice (``backends/cpu/thread_choice.py``): a partition runs on
one thread only when its own runs measured one thread faster in two probes in a row, per input
signature, measured again soon after, and the threads given are always set back."""

from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.cpu.native import omp
from anychip.backends.cpu.replay.run import REPLAY_FROM
from anychip.backends.cpu.thread_choice import ONE_WARM, PROBE, SOON, START, ThreadChoice
from anychip.errors import AnychipError

pytestmark = pytest.mark.skipif(not omp.available(), reason="libgomp is not loadable")

#: Runs until a signature's choice is made: ``START`` at the threads given, ``ONE_WARM`` warm
#: runs at one thread (to its replay), then the timed probe (the threads given kept), or two
#: (one thread taken).
WARM = START + ONE_WARM
KEPT = WARM + 2 * PROBE
SETTLED = KEPT + 2 * PROBE


@pytest.fixture
def two_threads():
    kept = omp.max_threads()
    omp.set_threads(2)
    yield
    omp.set_threads(kept)


def _program(slow_at: int, seen: list[int], delay: float = 0.004):
    """A partition program that takes ``delay`` seconds when run on ``slow_at`` threads (1,
    or 2 for 'two or more') and nothing otherwise, recording the threads it saw."""

    def run(tensors: list) -> list:
        n = omp.max_threads()
        seen.append(n)
        if (n >= 2) == (slow_at >= 2):
            time.sleep(delay)
        return [t * 2 for t in tensors]

    return run


@pytest.mark.parametrize(("slow_at", "chosen", "settled"), [(2, 1, SETTLED), (1, 2, KEPT)])
def test_the_faster_thread_count_is_chosen_and_kept(two_threads, slow_at, chosen, settled):
    seen: list[int] = []
    info: dict = {}
    run = ThreadChoice(_program(slow_at, seen), info)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for _ in range(settled + 5):
        np.testing.assert_array_equal(run([x])[0], x * 2)
        assert omp.max_threads() == 2
    assert seen[:WARM] == [2] * START + [1] * ONE_WARM  # as given, then one thread's warm runs
    probes = (settled - WARM) // (2 * PROBE)
    assert sorted(seen[WARM:settled]) == [1] * PROBE * probes + [2] * PROBE * probes
    assert seen[settled:] == [chosen] * 5
    assert run.chosen([x]) == chosen
    assert info["threads"].startswith(f"{chosen} of 2 for inputs [2, 3]: measured median")
    assert ("two probes in a row" in info["threads"]) is (chosen == 1)


def test_one_probe_alone_does_not_take_one_thread(two_threads):
    """One thread faster in the first probe only (another tenant held the second core for a
    moment): the second probe finds the threads given faster, and they stay."""
    seen: list[int] = []
    calls = [0]

    def noisy(tensors: list) -> list:
        calls[0] += 1
        n = omp.max_threads()
        seen.append(n)
        two_slow = calls[0] <= KEPT  # the moment passes with the first probe
        if (n >= 2) == two_slow:
            time.sleep(0.004)
        return tensors

    run = ThreadChoice(noisy, {})
    for _ in range(SETTLED + 3):
        run([np.zeros(2)])
    assert run.chosen([np.zeros(2)]) == 2 and seen[-3:] == [2, 2, 2]


def test_each_input_signature_chooses_apart(two_threads):
    """A batch that is slow on two threads and one that is slow on one choose differently."""
    seen: list[int] = []

    def run_by_shape(tensors: list) -> list:
        n = omp.max_threads()
        seen.append(n)
        slow = (n >= 2) if tensors[0].shape[0] == 1 else (n == 1)
        if slow:
            time.sleep(0.004)
        return tensors

    run = ThreadChoice(run_by_shape, {})
    one, many = np.zeros((1, 4), np.float32), np.zeros((64, 4), np.float32)
    for _ in range(SETTLED):
        run([one]), run([many])
    assert (run.chosen([one]), run.chosen([many])) == (1, 2)
    seen.clear()
    run([one]), run([many])
    assert seen == [1, 2]


def test_the_threads_given_are_set_back_after_an_error(two_threads):
    def failing(tensors: list) -> list:
        if omp.max_threads() == 1:
            raise RuntimeError("a kernel failed")
        return tensors

    run = ThreadChoice(failing, {})
    for _ in range(START):
        run([np.zeros(2)])
    with pytest.raises(RuntimeError, match="a kernel failed"):
        run([np.zeros(2)])  # the warm run at one thread
    assert omp.max_threads() == 2


def test_one_threads_first_runs_are_not_timed(two_threads):
    """A partition's first runs at a thread count are its slowest (its primitives are built,
    its replay recorded: ``cpu/replay/run.REPLAY_FROM``). One thread faster once warm is chosen:
    its first ``ONE_WARM`` runs are not in the probe."""
    seen: list[int] = []

    def program(tensors: list) -> list:
        n = omp.max_threads()
        seen.append(n)
        first = n == 1 and seen.count(1) < REPLAY_FROM  # the kernels' path, then the recording
        time.sleep(0.03 if first else 0.002 if n >= 2 else 0.0005)
        return tensors

    run = ThreadChoice(program, {})
    for _ in range(SETTLED):
        run([np.zeros(2)])
    assert run.chosen([np.zeros(2)]) == 1


def test_runs_that_raise_during_a_probe_leave_it_measuring(two_threads):
    """Every probe run on one thread raises (bad feeds, say): the probe has nothing to compare
    and starts again, and the runs that succeed still return their results."""

    def fails_on_one(tensors: list) -> list:
        if omp.max_threads() == 1:
            raise RuntimeError("a kernel failed")
        return tensors

    run = ThreadChoice(fails_on_one, {})
    x = np.zeros(2)
    for _ in range(START):
        assert run([x])[0] is x
    failed = 0
    for _ in range(3 * 2 * PROBE):
        try:
            run([x])
        except RuntimeError:
            failed += 1
    assert failed >= 3 * PROBE and run.chosen([x]) == 0 and omp.max_threads() == 2


def test_new_threads_given_and_the_recheck_start_a_new_probe(two_threads):
    """One thread once taken is measured again after ``SOON`` runs (then twice as long each
    time it wins); new threads given start over."""
    seen: list[int] = []
    run = ThreadChoice(_program(2, seen), {})
    x = np.zeros(3, np.float32)
    for _ in range(SETTLED):
        run([x])
    assert run.chosen([x]) == 1
    seen.clear()
    for _ in range(SOON + 2 * PROBE):
        run([x])
    assert seen[:SOON] == [1] * SOON and seen[SOON:].count(2) == PROBE  # measured again
    assert run.chosen([x]) == 1  # won again (no second probe needed): kept, for longer
    seen.clear()
    for _ in range(2 * SOON):
        run([x])
    assert seen == [1] * (2 * SOON)
    omp.set_threads(3)
    run([x])
    assert run.chosen([x]) == 0 and seen[-1] == 3  # measured again, from its first run
    for _ in range(SETTLED - 1):
        run([x])
    assert run.chosen([x]) == 1


def test_one_thread_given_or_the_choice_off_runs_as_given(two_threads):
    seen: list[int] = []
    run = ThreadChoice(_program(2, seen), {}, choose=False)
    for _ in range(SETTLED + 2):
        run([np.zeros(2)])
    assert seen == [2] * (SETTLED + 2)
    omp.set_threads(1)
    seen.clear()
    run = ThreadChoice(_program(1, seen), {})
    for _ in range(SETTLED + 2):
        run([np.zeros(2)])
    assert seen == [1] * (SETTLED + 2) and run.chosen([np.zeros(2)]) == 0


def _cnn() -> onnx.ModelProto:
    """Two seeded 3x3 convolutions with a ReLU: large enough to be split on two threads."""
    rng = np.random.default_rng(7)
    w1 = rng.standard_normal((32, 16, 3, 3)).astype(np.float32) * 0.2
    w2 = rng.standard_normal((32, 32, 3, 3)).astype(np.float32) * 0.1
    b1 = rng.standard_normal(32).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 56, 56])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 56, 56])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (b1, "b1"))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("choose", [True, False])
def test_a_session_equals_onnxruntime_on_either_thread_count(two_threads, choose):
    """Every run of a session, probe and choice included, equals onnxruntime's result on new
    seeded inputs; the placement report says what was chosen and why."""
    model = _cnn()
    opts = {"cpu": {"thread_choice": choose}}
    sess = anychip.load(model.SerializeToString(), "cpu", device_options=opts)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(11)
    for _ in range(SETTLED + 2):
        x = rng.standard_normal((1, 16, 56, 56)).astype(np.float32)
        got = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
        assert omp.max_threads() == 2
    info = sess.placement().partitions[0].info
    if choose:
        assert info["threads"].split(" of ")[0] in ("1", "2")
        assert "at 1 thread" in info["threads"] and "at 2 (" in info["threads"]
    else:
        assert "threads" not in info


def test_the_choice_is_off_from_the_environment(two_threads, monkeypatch):
    monkeypatch.setenv("ANYCHIP_THREAD_CHOICE", "0")
    sess = anychip.load(_cnn().SerializeToString(), "cpu")
    x = np.random.default_rng(3).standard_normal((1, 16, 56, 56)).astype(np.float32)
    for _ in range(SETTLED + 1):
        sess.run(None, {"x": x})
    assert "threads" not in sess.placement().partitions[0].info


def test_a_bad_option_is_named():
    with pytest.raises(AnychipError, match="thread_choice is True or False"):
        anychip.load(_cnn(), "cpu", device_options={"cpu": {"thread_choice": "yes"}})
    with pytest.raises(AnychipError, match="thread_choice"):
        anychip.load(_cnn(), "cpu", device_options={"cpu": {"thread_count": 1}})
    with pytest.raises(AnychipError, match="threads is an int >= 1"):
        anychip.load(_cnn(), "cpu", device_options={"cpu": {"threads": "2"}})


@pytest.mark.parametrize("asks", [False, True])
def test_quiet_runs_stop_asking_the_pool_and_asking_ones_hold_it(two_threads, monkeypatch, asks):
    """After ``QUIET`` runs on the threads given that never asked the generated code's pool
    for threads, a signature's runs skip the two questions; a program whose runs ask holds
    the pool from then on."""
    from contextlib import nullcontext

    from anychip.backends.cpu import thread_choice

    counter = {"wanted": 0, "asked": 0, "held": 0}

    def wanted() -> int:
        counter["wanted"] += 1
        return counter["asked"]

    def held():
        counter["held"] += 1
        return nullcontext()

    monkeypatch.setattr(thread_choice.pool, "wanted", wanted)
    monkeypatch.setattr(thread_choice.pool, "held", held)
    seen: list[int] = []
    inner = _program(1, seen, delay=0.002)  # one thread slower: the threads given are kept

    def program(tensors: list) -> list:
        counter["asked"] += asks
        return inner(tensors)

    run = ThreadChoice(program)
    x = np.ones((2, 3), np.float32)
    for _ in range(KEPT):
        run([x])
    assert run.chosen([x]) == 2
    before = dict(counter)
    for _ in range(thread_choice.QUIET + 10):
        np.testing.assert_array_equal(run([x])[0], x * 2)
    if asks:
        assert run.uses and counter["held"] - before["held"] == thread_choice.QUIET + 10
    else:
        assert not run.uses and counter["wanted"] - before["wanted"] <= 2 * thread_choice.QUIET
        assert seen[-5:] == [2] * 5
