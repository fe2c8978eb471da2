"""Where the OpenMP team pays for generated C: ``native.fused.PARALLEL_WORK``'s measurement.

Each case is one call of a fused element-wise chain (``add``, ``silu`` x*sigmoid(x), ``gelu``
the erf form) or a row kernel (``softmax`` over rows of 128, ``layernorm`` over rows of 256) on
N floats, run on one thread and on two (the threshold switched per call), interleaved in a new
random order each round (the pool's backoff reset before each call); medians of wall time, and
the work in ``PARALLEL_WORK``'s units. Run it on an idle machine: on a loaded one the second
thread gets no core of its own.

    python bench/codegen_threads.py [--rounds 200] [--cases silu,gelu] [--sizes 65536,262144]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import numpy as np

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if _ROOT not in sys.path:
    sys.path.insert(0, os.path.dirname(_ROOT))

EXPRS = {
    "add": "add(in0,in1)",
    "silu": "mul(in0,sigmoid(in0))",
    "gelu": "mul(mul(in0,0.5),add(erf(div(in0,1.4142135)),1.0))",
}


def _case(name: str, n: int, rng: np.random.Generator):
    """``(call, work)`` for one case of ``n`` floats."""
    import anychip.codegen as cg
    from anychip.backends.cpu.kernels.op_fused_elementwise import fused_elementwise
    from anychip.backends.cpu.native import rows

    x = rng.standard_normal(n).astype(np.float32)
    out = np.empty_like(x)
    if name in EXPRS:
        e = EXPRS[name]
        ins = (x, rng.standard_normal(n).astype(np.float32)) if "in1" in e else (x,)
        spec = cg.KernelSpec(cg.parse(e), "float32", ("F",) * len(ins))
        return (lambda: fused_elementwise(*ins, expr=e, out=out)), n * cg.work_per_element(spec)
    if name == "softmax":
        x2 = x.reshape(-1, 128)
        return (lambda: rows.softmax_rows(x2, out.reshape(x2.shape))), n * rows.SOFTMAX_WORK
    x2 = x.reshape(-1, 256)
    s, b = np.ones(256, np.float32), np.zeros(256, np.float32)
    return (lambda: rows.layer_norm_rows(x2, s, b, 1e-5, -1)), n * rows.LAYER_NORM_WORK


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--cases", default="add,silu,gelu,softmax,layernorm")
    ap.add_argument("--sizes", default="16384,65536,262144,1048576")
    args = ap.parse_args()
    import anychip.codegen as cg
    from anychip.backends.cpu.native import omp, pool

    if not omp.available():
        sys.exit("libgomp is not loadable: generated C runs on one thread")
    omp.set_threads(2)
    rng = np.random.default_rng(0)
    kept = cg.PARALLEL_WORK
    print(f"load average {os.getloadavg()[0]:.2f}; PARALLEL_WORK now 2^{kept.bit_length() - 1}")
    print("case        floats     work   wall 1 / 2 threads (us)   ratio")
    try:
        for name in args.cases.split(","):
            for n in (int(s) for s in args.sizes.split(",")):
                call, work = _case(name, n, rng)
                wall: dict[int, list[float]] = {1: [], 2: []}
                for team in [1, 2] * 5:  # build, warm both
                    cg.PARALLEL_WORK = 1 << 62 if team == 1 else 0
                    call()
                for _ in range(args.rounds):
                    for team in random.sample([1, 2], 2):
                        cg.PARALLEL_WORK = 1 << 62 if team == 1 else 0
                        pool.reset_backoff()  # the threads' own figure, not the backoff's
                        t = time.perf_counter()
                        call()
                        wall[team].append(time.perf_counter() - t)
                w1, w2 = (statistics.median(wall[k]) * 1e6 for k in (1, 2))
                print(f"{name:9s} {n:8d} 2^{work.bit_length() - 1:<4d}  {w1:9.1f} / {w2:9.1f}"
                      f"   {w1 / w2:6.2f}x")  # fmt: skip
    finally:
        cg.PARALLEL_WORK = kept


if __name__ == "__main__":
    main()
