"""Where a second OpenMP thread pays for a oneDNN primitive, per kind: ``_lib.SMALL_WORK``'s
and ``rnn.BATCH_SPLIT_WORK``'s measurement.

``--kind conv``: a model of two 3x3 convolutions (CxMxHW: C -> M -> C channels at H x W, Relu
between); ``matmul``: one MatMul by constant weights (MxKxN); ``lstm``: one LSTM (TxNxIxH:
steps, batch, input, hidden). Each runs with the primitives' team at one thread and at two
(``SMALL_WORK`` switched: the primitive cache is keyed by the team, so both stay built) and,
for ``lstm`` and ``matmul``, split by batch or rows over the two (``split``), interleaved in
a new random order each round; medians of wall and process CPU time. Run it on an idle
machine: on a loaded one the second thread gets no core of its own (CPU time equals wall
time) and every case reads about 1x.

    python bench/onednn_team.py [--kind conv] [--rounds 60] [--cases 16x16x28,32x32x28]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

DEFAULT = {
    "conv": "8x8x28,16x16x28,32x32x28,24x24x56,64x64x28,64x64x56,128x128x28",
    "matmul": "128x256x256,128x256x1024,512x256x256,64x1024x1024",
    "lstm": "32x8x64x128,100x2x64x128,32x32x128x256,16x4x32x64",
}


def _conv(case: list[int], rng: np.random.Generator):
    c, m, hw = case

    def w(o: int, i: int) -> np.ndarray:
        return (rng.standard_normal((o, i, 3, 3)) * np.sqrt(2 / (9 * i))).astype(np.float32)

    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    inits = [numpy_helper.from_array(w(m, c), "w1"), numpy_helper.from_array(w(c, m), "w2")]
    return nodes, (1, c, hw, hw), inits, 2 * c * m * hw * hw * 9


def _matmul(case: list[int], rng: np.random.Generator):
    m, k, n = case
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    return nodes, (m, k), [numpy_helper.from_array(w, "w")], m * k * n


def _lstm(case: list[int], rng: np.random.Generator):
    t, n, i, h = case
    w = (rng.standard_normal((1, 4 * h, i)) * 0.1).astype(np.float32)
    r = (rng.standard_normal((1, 4 * h, h)) * 0.1).astype(np.float32)
    nodes = [helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=h)]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R")]
    return nodes, (t, n, i), inits, t * n * 4 * h * (i + h)


def _model(kind: str, case: list[int], rng: np.random.Generator):
    nodes, shape, inits, macs = {"conv": _conv, "matmul": _matmul, "lstm": _lstm}[kind](case, rng)
    graph = helper.make_graph(
        nodes,
        "team",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, shape, macs


def _set(team: str) -> None:
    """Thresholds for contender ``team``: "1", "2" (oneDNN's team) or "split" (by batch or
    rows, on ``backends/cpu/native/pool.py``)."""
    from anychip.backends.cpu.native import pool
    from anychip.backends.cpu.onednn import _lib, matmul, rnn

    _lib.SMALL_WORK = 1 if team == "2" else 1 << 62
    _lib.MATMUL_SMALL_WORK = _lib.SMALL_WORK
    rnn.BATCH_SPLIT_WORK = 0 if team == "split" else 1 << 62
    matmul.ROW_SPLIT_WORK = 0 if team == "split" else 1 << 62
    pool.reset_backoff()  # the split's own figure, not the backoff's


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=sorted(DEFAULT), default="conv")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--cases", default=None, help="comma separated (see the docstring)")
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits

    import anychip
    from anychip.backends.cpu.onednn import _lib, rnn

    if not _lib.available():
        sys.exit(f"oneDNN is not available: {_lib.unavailable_reason()}")
    rng = np.random.default_rng(0)
    from anychip.backends.cpu.onednn import matmul

    kept = _lib.SMALL_WORK, _lib.MATMUL_SMALL_WORK, rnn.BATCH_SPLIT_WORK, matmul.ROW_SPLIT_WORK
    teams = ["1", "2", "split"] if args.kind in ("lstm", "matmul") else ["1", "2"]
    print(f"load average {os.getloadavg()[0]:.2f}; SMALL_WORK now 2^{kept[0].bit_length() - 1}")
    print(f"case              MACs   wall {' / '.join(teams)} (us)   CPU {' / '.join(teams)} (us)")
    try:
        for case in (args.cases or DEFAULT[args.kind]).split(","):
            model, shape, macs = _model(args.kind, [int(v) for v in case.split("x")], rng)
            sess = anychip.load(model, devices=["cpu"])
            feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
            wall: dict[str, list[float]] = {k: [] for k in teams}
            cpu: dict[str, list[float]] = {k: [] for k in teams}
            with threadpool_limits(limits=2):
                for team in teams * 3:  # build every primitive, warm them
                    _set(team)
                    sess.run(None, feeds)
                for _ in range(args.rounds):
                    for team in random.sample(teams, len(teams)):
                        _set(team)
                        t, p = time.perf_counter(), time.process_time()
                        sess.run(None, feeds)
                        wall[team].append(time.perf_counter() - t)
                        cpu[team].append(time.process_time() - p)
            w = [statistics.median(wall[k]) * 1e6 for k in teams]
            c = [statistics.median(cpu[k]) * 1e6 for k in teams]
            print(f"{case:16s} {macs / 1e6:7.1f}M   {' / '.join(f'{v:7.0f}' for v in w)}"
                  f"   {' / '.join(f'{v:7.0f}' for v in c)}")  # fmt: skip
    finally:
        _lib.SMALL_WORK, _lib.MATMUL_SMALL_WORK, rnn.BATCH_SPLIT_WORK, matmul.ROW_SPLIT_WORK = kept


if __name__ == "__main__":
    main()
