"""Batch-1 convolutions split into bands of output rows on the pool's threads
(``onednn/conv_split.py``): with two threads and the threshold at zero, every geometry
(strides, asymmetric and SAME pads, dilations, groups, depthwise, odd row counts), with bias,
activation and a residual, gives what onnxruntime and the unsplit primitive give."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import anychip
from anychip.backends.cpu.native import omp, pool
from anychip.backends.cpu.onednn import _lib, conv1x1, conv_split
from tests.backends.cpu.test_onednn import _close, _model, _rand, _run_both
from tests.backends.cpu.test_onednn_threads import two_threads

#: The second convolution's (input channels, rows, cols), weight shape and attributes; it
#: reads the first's channels-last output, which is what the split takes.
CASES = [
    ((8, 12, 12), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((8, 13, 11), (16, 8, 3, 3), {"strides": [2, 2], "pads": [1, 0, 2, 1]}),
    ((6, 15, 15), (6, 3, 3, 3), {"group": 2, "dilations": [2, 2]}),
    ((16, 14, 14), (16, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((8, 10, 10), (4, 8, 5, 5), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((8, 9, 10), (4, 8, 4, 4), {"auto_pad": "SAME_LOWER"}),
    ((8, 9, 9), (4, 8, 3, 3), {"auto_pad": "VALID"}),
    ((8, 7, 9), (8, 8, 1, 1), {}),
    ((8, 17, 6), (8, 8, 7, 1), {"pads": [3, 0, 3, 0], "dilations": [1, 1]}),
]


@pytest.fixture
def split(monkeypatch):
    """Two OpenMP threads, every batch-1 convolution under oneDNN's team on a channels-last
    source split by rows (the chains' first convolution, on the NCHW image, stays whole)."""
    limits = {"ROW_SPLIT_WORK": (conv_split, 0), "MIN_PART_ROWS": (conv_split, 1)}
    with two_threads(monkeypatch, FEW_CHANNELS=(conv_split, 0), **limits):
        yield


def _residual(nodes: list, feeds: dict, rng: np.random.Generator, shape: tuple) -> str:
    """Append ``s = c + z`` (``z`` a seeded feed of ``shape``); the sum's name."""
    feeds["z"] = _rand(rng, *shape)
    nodes.append(helper.make_node("Add", ["c", "z"], ["s"]))
    return "s"


def _chain(case: int, residual: bool, seed: int) -> tuple:
    (c, h, w_), wshape, attrs = CASES[case]
    rng = np.random.default_rng(seed)
    x = _rand(rng, 1, 3, h, w_)
    feeds = {"x": x}
    weights = {
        "W0": _rand(rng, c, 3, 1, 1),
        "W1": _rand(rng, *wshape, scale=0.3),
        "B1": _rand(rng, wshape[0]),
    }
    nodes = [
        helper.make_node("Conv", ["x", "W0"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "W1", "B1"], ["c"], **attrs),
    ]
    if residual:  # a residual of the output's shape, fused as the convolution's sum post-op
        out = anychip.load(_model(nodes, {"x": x}, weights, ["c"])).run(None, {"x": x})[0]
        feeds["z"] = _rand(rng, *np.asarray(out).shape)
        nodes.append(helper.make_node("Add", ["c", "z"], ["s"]))
    nodes.append(helper.make_node("Relu", ["s" if residual else "c"], ["t"]))
    # a oneDNN reader after it: the split convolution writes channels-last for it
    weights["W2"] = _rand(rng, 5, wshape[0], 1, 1)
    nodes.append(helper.make_node("Conv", ["t", "W2"], ["y"]))
    return _model(nodes, feeds, weights, ["y"]), feeds


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("residual", [False, True])
def test_split_conv_equals_onnxruntime_and_unsplit(split, monkeypatch, case, residual):
    model, feeds = _chain(case, residual, seed=case * 2 + residual)
    before = sum(conv_split.RUNS.values())
    got, want = _run_both(model, feeds)
    assert sum(conv_split.RUNS.values()) == before + 1  # the second convolution ran split
    _close(got, want, tol=1e-5)
    with monkeypatch.context() as mp:
        mp.setattr(conv_split, "ROW_SPLIT_WORK", 1 << 62)
        whole = anychip.load(model, devices=["cpu"]).run(None, feeds)
    _close(got, [np.asarray(whole[0])], tol=1e-5)


@pytest.mark.parametrize("case", [0, 1, 3, 8])
def test_fine_parts_equal_onnxruntime_and_unsplit(split, monkeypatch, case):
    """From ``FINE_WORK`` a convolution is cut into two parts a thread (four on two threads),
    taken by whichever thread is free; the bands still give onnxruntime's and the unsplit
    primitive's result, with a residual."""
    monkeypatch.setattr(conv_split, "FINE_WORK", 0)
    model, feeds = _chain(case, True, seed=40 + case)
    before = conv_split.RUNS[4]
    got, want = _run_both(model, feeds)
    assert conv_split.RUNS[4] == before + 1
    _close(got, want, tol=1e-5)
    with monkeypatch.context() as mp:
        mp.setattr(conv_split, "ROW_SPLIT_WORK", 1 << 62)
        whole = anychip.load(model, devices=["cpu"]).run(None, feeds)
    _close(got, [np.asarray(whole[0])], tol=1e-5)


@pytest.mark.parametrize("channels", [1, 3, 5])
@pytest.mark.parametrize("few", [4, 0])
def test_an_nchw_source_splits_through_channels_last(split, monkeypatch, channels, few):
    """A convolution on the NCHW image (a oneDNN reader after it) of at most ``FEW_CHANNELS``
    channels is reordered to channels-last and split, else runs whole; the split's result is
    onnxruntime's and the whole primitive's."""
    rng = np.random.default_rng(50 + channels)
    x = _rand(rng, 1, channels, 19, 17)
    weights = {
        "W0": _rand(rng, 8, channels, 3, 3),
        "B0": _rand(rng, 8),
        "W1": _rand(rng, 5, 8, 1, 1),
    }
    nodes = [
        helper.make_node("Conv", ["x", "W0", "B0"], ["a"], strides=[2, 2], pads=[1, 0, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "W1"], ["y"]),
    ]
    model = _model(nodes, {"x": x}, weights, ["y"])
    monkeypatch.setattr(conv_split, "FEW_CHANNELS", few)
    before = sum(conv_split.RUNS.values())
    got, want = _run_both(model, {"x": x})
    # one channel: NCHW is channels-last already
    assert sum(conv_split.RUNS.values()) - before == int(channels <= few or channels == 1)
    _close(got, want, tol=1e-5)
    with monkeypatch.context() as mp:
        mp.setattr(conv_split, "ROW_SPLIT_WORK", 1 << 62)
        whole = anychip.load(model, devices=["cpu"]).run(None, {"x": x})
    _close(got, [np.asarray(whole[0])], tol=1e-5)


@pytest.mark.parametrize("residual", [False, True])
def test_a_split_written_to_nchw_fills_the_plan(split, monkeypatch, residual):
    """A 3x3 convolution whose reader is numpy (here a graph output and a Concat) splits into
    channels-last bands and is reordered into its NCHW output: onnxruntime's result and the
    unsplit path's."""
    rng = np.random.default_rng(80 + residual)
    x = _rand(rng, 1, 8, 13, 11)
    feeds = {"x": x}
    weights = {"W0": _rand(rng, 8, 8, 1, 1), "W1": _rand(rng, 6, 8, 3, 3), "B1": _rand(rng, 6)}
    nodes = [
        helper.make_node("Conv", ["x", "W0"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "W1", "B1"], ["c"], pads=[1, 1, 1, 1]),
    ]
    last = _residual(nodes, feeds, rng, (1, 6, 13, 11)) if residual else "c"
    nodes.append(helper.make_node("Relu", [last], ["t"]))
    nodes.append(helper.make_node("Concat", ["t", "x"], ["y"], axis=1))
    model = _model(nodes, feeds, weights, ["y", "t"])
    before = sum(conv_split.RUNS.values())
    got, want = _run_both(model, feeds)
    assert sum(conv_split.RUNS.values()) == before + 1
    _close(got, want, tol=1e-5)
    with monkeypatch.context() as mp:
        mp.setattr(conv_split, "ROW_SPLIT_WORK", 1 << 62)
        whole = anychip.load(model, devices=["cpu"]).run(None, feeds)
    _close(got, [np.asarray(v) for v in whole], tol=1e-5)


def _three_convs(seed: int, x_shape: tuple, shapes: list, **middle: list) -> tuple:
    """``x -> Conv -> Relu -> Conv(**middle) -> Relu -> Conv -> y`` with seeded weights of
    ``shapes``: the model and ``x``."""
    rng = np.random.default_rng(seed)
    x = _rand(rng, *x_shape)
    weights = {f"W{i}": _rand(rng, *shape) for i, shape in enumerate(shapes)}
    nodes = [
        helper.make_node("Conv", ["x", "W0"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "W1"], ["c"], **middle),
        helper.make_node("Relu", ["c"], ["t"]),
        helper.make_node("Conv", ["t", "W2"], ["y"]),
    ]
    return _model(nodes, {"x": x}, weights, ["y"]), x


def test_a_strided_convolution_counts_its_output_positions(split, monkeypatch):
    """The work that decides oneDNN's team against the split is output positions times the
    weights: a stride-2 convolution whose input-sized estimate is over ``TEAM_WORK`` but whose
    own work is under it splits (SqueezeNet's first convolution, 21M multiply-adds, ran on
    the team as 87M)."""
    shapes = [(8, 8, 1, 1), (8, 8, 3, 3), (4, 8, 1, 1)]
    model, x = _three_convs(60, (1, 8, 32, 32), shapes, strides=[2, 2], pads=[1, 1, 1, 1])
    output_work = 16 * 16 * 8 * 8 * 9  # the strided convolution's multiply-adds
    monkeypatch.setattr(conv_split, "TEAM_WORK", 2 * output_work)  # input-sized: 4x
    monkeypatch.setattr(conv_split, "ROW_SPLIT_WORK", output_work)  # only the strided one
    before = sum(conv_split.RUNS.values())
    got, want = _run_both(model, {"x": x})
    assert sum(conv_split.RUNS.values()) == before + 1
    _close(got, want, tol=1e-5)


@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("source", ["nchw", "channels_last"])
@pytest.mark.parametrize("residual", [False, True])
def test_a_1x1_product_splits_its_output_channels(split, monkeypatch, group, source, residual):
    """A 1x1 convolution written to NCHW (a graph output) splits its output channels (whole
    groups) over the threads, with bias, residual and Relu: onnxruntime's result and the
    unsplit product's. Grouped on a channels-last source it stays whole (slower split)."""
    monkeypatch.setattr(conv1x1, "SPLIT_WORK", 0)
    rng = np.random.default_rng(70 + group * 4 + (source == "nchw") * 2 + residual)
    x = _rand(rng, 1, 8, 9, 7)
    weights = {"W0": _rand(rng, 48, 8, 1, 1), "W1": _rand(rng, 40, 48 // group, 1, 1)}
    weights["B1"] = _rand(rng, 40)
    first = "x"
    nodes = []
    if source == "channels_last":  # a oneDNN producer: the 1x1 reads its channels-last output
        nodes = [
            helper.make_node("Conv", ["x", "W0"], ["a"]),
            helper.make_node("Relu", ["a"], ["r"]),
        ]
        first = "r"
    else:
        x = _rand(rng, 1, 48, 9, 7)
    feeds = {"x": x}
    nodes.append(helper.make_node("Conv", [first, "W1", "B1"], ["c"], group=group))
    last = _residual(nodes, feeds, rng, (1, 40, 9, 7)) if residual else "c"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    model = _model(nodes, feeds, weights, ["y"])
    before = sum(conv1x1.RUNS.values())
    got, want = _run_both(model, feeds)
    split_ran = sum(conv1x1.RUNS.values()) - before
    assert split_ran == (0 if group > 1 and source == "channels_last" else 1)
    _close(got, want, tol=1e-5)
    with monkeypatch.context() as mp:
        mp.setattr(conv1x1, "SPLIT_WORK", 1 << 62)
        whole = anychip.load(model, devices=["cpu"]).run(None, feeds)
    _close(got, [np.asarray(whole[0])], tol=1e-5)


def test_a_weighty_1x1_convolution_runs_on_the_team_not_split(split, monkeypatch):
    """A batch-1 1x1 convolution whose weights outweigh its source (each band of a row split
    re-reads them all) runs on oneDNN's team from ``WEIGHTY_TEAM_WORK``; a 3x3 one of the same
    work, or a 1x1 one with light weights, still splits. Results equal onnxruntime's."""
    x4 = np.zeros((1, 64, 7, 7), np.float32)
    assert conv_split.team_work(x4, np.zeros((256, 64, 1, 1), np.float32)) == (
        conv_split.WEIGHTY_TEAM_WORK
    )
    assert conv_split.team_work(x4, np.zeros((256, 64, 3, 3), np.float32)) == conv_split.TEAM_WORK
    wide = np.zeros((1, 64, 28, 28), np.float32)  # the source outweighs 64 x 64 weights
    assert conv_split.team_work(wide, np.zeros((64, 64, 1, 1), np.float32)) == conv_split.TEAM_WORK
    shapes = [(32, 8, 1, 1), (128, 32, 1, 1), (4, 128, 1, 1)]  # the second: channels-last
    model, x = _three_convs(61, (1, 8, 8, 8), shapes)
    work = 8 * 8 * 128 * 32  # the second convolution's: weights 2x its source's bytes
    monkeypatch.setattr(conv_split, "WEIGHTY_TEAM_WORK", work)
    monkeypatch.setattr(conv_split, "TEAM_WORK", 4 * work)
    before = sum(conv_split.RUNS.values())
    got, want = _run_both(model, {"x": x})
    assert sum(conv_split.RUNS.values()) == before  # none split (the first: NCHW source)
    monkeypatch.setattr(conv_split, "WEIGHTY_TEAM_WORK", 2 * work)  # under it: split
    _run_both(model, {"x": x})
    assert sum(conv_split.RUNS.values()) > before
    _close(got, want, tol=1e-5)


def test_a_convolution_with_weights_past_the_cache_runs_on_the_team(split, monkeypatch):
    """A batch-1 convolution of any window whose weights reach ``WEIGHTY_BYTES`` (each band
    would read them all again, from past the core's cache) runs on oneDNN's team from
    ``WEIGHTY_TEAM_WORK``; with lighter weights it splits. Results equal onnxruntime's."""
    x7 = np.zeros((1, 192, 7, 7), np.float32)
    heavy = np.zeros((320, 192, 3, 3), np.float32)  # Inception-v2's, 2.2 MB
    assert heavy.nbytes >= conv_split.WEIGHTY_BYTES
    assert conv_split.team_work(x7, heavy) == conv_split.WEIGHTY_TEAM_WORK
    light = np.zeros((64, 192, 3, 3), np.float32)
    assert conv_split.team_work(x7, light) == conv_split.TEAM_WORK
    shapes = [(16, 8, 1, 1), (24, 16, 3, 3), (4, 24, 1, 1)]
    model, x = _three_convs(62, (1, 8, 10, 10), shapes, pads=[1, 1, 1, 1])
    work = 10 * 10 * 24 * 16 * 9  # the 3x3 convolution's
    monkeypatch.setattr(conv_split, "WEIGHTY_TEAM_WORK", work)
    monkeypatch.setattr(conv_split, "TEAM_WORK", 4 * work)
    monkeypatch.setattr(conv_split, "WEIGHTY_BYTES", 24 * 16 * 9 * 4)  # its weights' bytes
    before = sum(conv_split.RUNS.values())
    got, want = _run_both(model, {"x": x})
    assert sum(conv_split.RUNS.values()) == before  # on the team
    _close(got, want, tol=1e-5)
    monkeypatch.setattr(conv_split, "WEIGHTY_BYTES", 24 * 16 * 9 * 4 + 4)  # lighter: split
    got, want = _run_both(model, {"x": x})
    assert sum(conv_split.RUNS.values()) > before
    _close(got, want, tol=1e-5)


def test_one_thread_never_splits(monkeypatch):
    kept = omp.max_threads()
    omp.set_threads(1)
    monkeypatch.setattr(conv_split, "ROW_SPLIT_WORK", 0)
    try:
        model, feeds = _chain(0, False, seed=7)
        before = dict(conv_split.RUNS)
        _close(*_run_both(model, feeds))
        assert dict(conv_split.RUNS) == before
    finally:
        omp.set_threads(kept)


def test_a_backing_off_pool_keeps_the_convolution_whole(split, monkeypatch):
    monkeypatch.setattr(pool, "try_parallel", lambda: False)
    model, feeds = _chain(1, True, seed=9)
    before = dict(conv_split.RUNS)
    _close(*_run_both(model, feeds))
    assert dict(conv_split.RUNS) == before


def test_the_pool_is_held_only_inside_a_run(split):
    """``pool.held`` counts holders: a run holds it and lets go after, errors included."""
    if not pool.address():
        pytest.skip("needs a C compiler (gcc)")
    model, feeds = _chain(0, False, seed=11)
    sess = anychip.load(model, devices=["cpu"])
    sess.run(None, feeds)
    assert pool.holders() == 0
    with pytest.raises(anychip.AnychipError):
        sess.run(None, {"x": np.zeros((1, 3, 2, 2), np.float32)})
    assert pool.holders() == 0


def test_onednn_team_pauses_the_pool_and_small_work_does_not():
    """Above its threshold oneDNN's OpenMP team runs with the pool paused (its spinning
    threads asleep), below it on one thread with the pool as it was; errors unpause."""
    if not pool.address():
        pytest.skip("needs a C compiler (gcc)")
    kept = omp.max_threads()
    omp.set_threads(2)
    try:
        with _lib.team_for(1 << 62):
            assert pool.pauses() == 1
        with _lib.team_for(0):
            assert pool.pauses() == 0 and omp.max_threads() == 1
        with pytest.raises(RuntimeError), _lib.team_for(1 << 62):
            raise RuntimeError("a failing primitive")
        assert pool.pauses() == 0
    finally:
        omp.set_threads(kept)


def test_a_program_holds_the_pool_once_a_run_of_it_used_the_pool():
    """The CPU's partition wrapper: a run that asked the pool for threads makes the next runs
    hold it (spinning) while they run, and lets go after them, errors included; a program that
    never asks never holds it."""
    from anychip.backends.cpu.thread_choice import ThreadChoice

    if not pool.address():
        pytest.skip("needs a C compiler (gcc)")
    kept = omp.max_threads()
    omp.set_threads(2)
    seen: list[int] = []

    def asks(tensors: list) -> list:
        seen.append(pool.holders())
        pool.try_parallel()  # what a kernel splitting its work asks
        if tensors:
            raise RuntimeError("a failing kernel")
        return []

    def small(tensors: list) -> list:
        seen.append(pool.holders())
        return []

    try:
        run, quiet = ThreadChoice(asks, choose=False), ThreadChoice(small, choose=False)
        run([]), run([]), quiet([]), quiet([])
        assert seen == [0, 1, 0, 0] and pool.holders() == 0
        with pytest.raises(RuntimeError):
            run([1])
        assert seen[-1] == 1 and pool.holders() == 0
    finally:
        omp.set_threads(kept)
        pool.reset_backoff()


def test_team_for_yields_the_threads_given():
    """Inside ``team_for`` a kernel learns the threads it was given (what a one-thread
    primitive may split over), whether oneDNN's team stays whole or drops to one thread."""
    if not omp.available():
        pytest.skip("libgomp is not loadable")
    kept = omp.max_threads()
    try:
        for given in (1, 2, 3):
            omp.set_threads(given)
            with _lib.team_for(1 << 62) as team:
                assert team == given and omp.max_threads() == given
            with _lib.team_for(0) as team:
                assert team == given and omp.max_threads() == 1
            assert omp.max_threads() == given
    finally:
        omp.set_threads(kept)


def test_a_batch_of_two_few_channel_images_is_not_reordered_for_a_split(split, monkeypatch):
    """Only batch 1 splits: a batch-2 NCHW image of few channels is not first reordered to
    channels-last for a split that then declines it (a wasted copy of the image)."""
    from anychip.backends.cpu.onednn import _prim

    monkeypatch.setattr(conv_split, "FEW_CHANNELS", 4)
    reorders = []
    reorder = _prim._reorder  # every reorder's way, by key

    def recording(key, *args):
        reorders.append(key)
        return reorder(key, *args)

    monkeypatch.setattr(_prim, "_reorder", recording)
    rng = np.random.default_rng(80)
    feeds = {"x": _rand(rng, 2, 3, 12, 12)}
    weights = {"W": _rand(rng, 8, 3, 3, 3), "B": _rand(rng, 8)}
    node = helper.make_node("Conv", ["x", "W", "B"], ["y"], pads=[1, 1, 1, 1])
    before = dict(conv_split.RUNS)
    _close(*_run_both(_model([node], feeds, weights, ["y"]), feeds))
    assert dict(conv_split.RUNS) == before
    assert not [k for k in reorders if k[0][0] == "conv-nchw"]


@pytest.mark.parametrize("case", [0, 1, 3])
@pytest.mark.parametrize("residual", [False, True])
def test_a_remembered_split_runs_again_with_new_inputs(split, monkeypatch, case, residual):
    """The split convolution is remembered by its node (``conv_split.Fast``), with its
    residual Z or without: three runs of a session on three seeded inputs each split again
    and equal onnxruntime's result."""
    monkeypatch.setenv("ANYCHIP_REPLAY", "0")  # the kernels' path counted: not a replay
    model, feeds = _chain(case, residual, seed=60 + case)
    # On the threads given: the thread choice would run some of the runs on one thread.
    sess = anychip.load(model, devices=["cpu"], device_options={"cpu": {"thread_choice": False}})
    rng = np.random.default_rng(70 + case)
    for k in range(3):
        feeds = {name: _rand(rng, *v.shape) for name, v in feeds.items()}
        before = sum(conv_split.RUNS.values())
        got = sess.run(None, feeds)
        assert sum(conv_split.RUNS.values()) == before + 1, k
        _, want = _run_both(model, feeds)
        _close(got, want, tol=1e-5)
    kept = [n.meta.get("onednn_conv") for n in sess.partitions[0].graph.nodes]
    remembered = [k[1].get("fast") for k in kept if k is not None]
    assert any(isinstance(f, conv_split.Fast) for f in remembered)
