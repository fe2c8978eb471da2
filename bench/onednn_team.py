"""Where a second OpenMP thread pays for a oneDNN convolution: ``_lib.SMALL_WORK``'s measurement.

Each case is a model of two 3x3 convolutions (C -> M -> C channels at H x W, Relu between) run
with the primitives' team at one thread and at two (``SMALL_WORK`` switched: the primitive
cache is keyed by the team, so both stay built), interleaved in a new random order each round;
medians of wall and process CPU time. Run it on an idle machine: on a loaded one the second
thread gets no core of its own (CPU time equals wall time) and every case reads about 1x.

    python bench/onednn_team.py [--rounds 60] [--cases 16x16x28,32x32x28,64x64x56]
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

DEFAULT = "8x8x28,16x16x28,32x32x28,24x24x56,64x64x28,64x64x56,128x128x28"


def _model(c: int, m: int, hw: int, rng: np.random.Generator):
    def w(o: int, i: int) -> np.ndarray:
        return (rng.standard_normal((o, i, 3, 3)) * np.sqrt(2 / (9 * i))).astype(np.float32)

    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "team",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w(m, c), "w1"), numpy_helper.from_array(w(c, m), "w2")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--cases", default=DEFAULT, help="CxMxHW, comma separated")
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits

    import anychip
    from anychip.backends.cpu.onednn import _lib

    if not _lib.available():
        sys.exit(f"oneDNN is not available: {_lib.unavailable_reason()}")
    rng = np.random.default_rng(0)
    kept = _lib.SMALL_WORK
    print(f"load average {os.getloadavg()[0]:.2f}; SMALL_WORK now 2^{kept.bit_length() - 1}")
    print("case           MACs/conv   wall 1 / 2 threads (us)   ratio   CPU 1 / 2 (us)")
    try:
        for case in args.cases.split(","):
            c, m, hw = (int(v) for v in case.split("x"))
            sess = anychip.load(_model(c, m, hw, rng), devices=["cpu"])
            feeds = {"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32)}
            wall: dict[int, list[float]] = {1: [], 2: []}
            cpu: dict[int, list[float]] = {1: [], 2: []}
            with threadpool_limits(limits=2):
                for team in [1, 2] * 3:  # build both primitives, warm both
                    _lib.SMALL_WORK = 1 << 62 if team == 1 else 1
                    sess.run(None, feeds)
                for _ in range(args.rounds):
                    for team in random.sample([1, 2], 2):
                        _lib.SMALL_WORK = 1 << 62 if team == 1 else 1
                        t, p = time.perf_counter(), time.process_time()
                        sess.run(None, feeds)
                        wall[team].append(time.perf_counter() - t)
                        cpu[team].append(time.process_time() - p)
            w1, w2 = (statistics.median(wall[k]) * 1e6 for k in (1, 2))
            c1, c2 = (statistics.median(cpu[k]) * 1e6 for k in (1, 2))
            macs = c * m * hw * hw * 9
            print(f"{case:14s} {macs / 1e6:8.1f}M   {w1:9.0f} / {w2:9.0f}   {w1 / w2:6.2f}x"
                  f"   {c1:7.0f} / {c2:7.0f}")  # fmt: skip
    finally:
        _lib.SMALL_WORK = kept


if __name__ == "__main__":
    main()
