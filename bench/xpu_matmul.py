"""GFLOP/s of the XPU's float32 MatMul against numpy (OpenBLAS) and onnxruntime.

Run: ``python bench/xpu_matmul.py`` (for numpy's own OpenBLAS kernel choice, unset the
OpenBLAS overrides: ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/xpu_matmul.py``).

Per shape, four timings are interleaved round by round (so load from elsewhere hits them all
alike) and the medians reported. One sample is a burst of calls (about 4e8 flops, at most 512
calls) divided by its count; a pause (``--cooldown``) separates the samples, because
OpenBLAS's and onnxruntime's idle worker threads busy-wait for a while after a call and would
otherwise take a core from whatever runs next (on 2 cores that halves the next one's speed).

- ``xpu kernel``: the device time of one MatMul: the burst of launches on resident tensors is
  queued and only the ``synchronize`` that runs them is timed;
- ``xpu call``: ``launch.xpu_matmul`` + ``synchronize`` + freeing the output, from Python
  (inputs resident on the device, as in a placed graph);
- ``numpy``: ``np.matmul(a, b)``;
- ``ort``: ``InferenceSession.run`` of a one-node MatMul model, 2 intra-op threads.

Ratios > 1 mean the XPU is faster.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from anychip.backends.xpu_stub.driver import XpuDriver, num_threads, set_num_threads
from anychip.backends.xpu_stub.driver import launch as K

SHAPES = [
    (64, 64, 64),
    (256, 256, 256),
    (512, 512, 512),
    (1024, 1024, 1024),
    (1, 512, 512),
    (64, 768, 3072),
    (512, 512, 32),  # attention's probabilities @ V (one head): A read in place, not packed
    (512, 32, 512),  # attention's Q @ Kt (one head)
]
"""(M, K, N): (M x K) @ (K x N)."""


def _ort_session(k: int, n: int, threads: int):

    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["Y"])],
        "matmul",
        [
            helper.make_tensor_value_info("A", TensorProto.FLOAT, ["m", k]),
            helper.make_tensor_value_info("B", TensorProto.FLOAT, [k, n]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["m", n])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(
        model.SerializeToString(),
        options,
        providers=["CPUExecutionProvider"],
    )


def _timers(drv: XpuDriver, m: int, k: int, n: int, burst: int, threads: int) -> dict:
    """Per timer, a function that runs one burst of ``burst`` calls and returns its seconds."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    ta, tb = drv.upload(a), drv.upload(b)
    out = K.xpu_matmul(ta, tb)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-3, atol=1e-3 * np.sqrt(k))
    session = _ort_session(k, n, threads)
    feeds = {"A": a, "B": b}
    handles = [ta.handle, tb.handle, out.handle]
    iargs = [1, 0, m, k, n]

    def kernel() -> float:
        for _ in range(burst):
            drv.launch("MatMul", handles, iargs)
        t0 = time.perf_counter()
        drv.synchronize()
        return time.perf_counter() - t0

    def call() -> None:
        y = K.xpu_matmul(ta, tb)
        drv.synchronize()
        y.free()

    def timed(fn) -> float:
        t0 = time.perf_counter()
        for _ in range(burst):
            fn()
        return time.perf_counter() - t0

    return {
        "xpu kernel": kernel,
        "xpu call": lambda: timed(call),
        "numpy": lambda: timed(lambda: np.matmul(a, b)),
        "ort": lambda: timed(lambda: session.run(None, feeds)),
    }


def _measure(timers: dict, rounds: int, burst: int, cooldown: float) -> dict[str, float]:
    """Median seconds per call of each timer, the timers interleaved round by round."""
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for r in range(rounds + 1):  # one warm-up round
        for name, burst_seconds in timers.items():
            time.sleep(cooldown)
            dt = burst_seconds()
            if r >= 1:
                samples[name].append(dt / burst)
    return {name: statistics.median(v) for name, v in samples.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds per shape")
    parser.add_argument("--cooldown", type=float, default=0.15, help="seconds between samples")
    parser.add_argument("--threads", type=int, default=0, help="XPU threads (0: default)")
    parser.add_argument("--shapes", default=None, help="M,K,N;M,K,N... (default: all)")
    args = parser.parse_args(argv)
    set_num_threads(args.threads)
    drv = XpuDriver(heap_bytes=512 << 20, name="xpu-bench")
    print(
        f"XPU threads: {num_threads()}; onnxruntime: 2 intra-op threads; medians of "
        f"{args.rounds} interleaved rounds, {args.cooldown} s apart; GFLOP/s (ratio = XPU / other)"
    )
    header = (
        f"{'shape (MxK @ KxN)':<24}{'xpu kernel':>11}{'xpu call':>10}{'numpy':>9}{'ort':>9}"
        f"{'kern/np':>9}{'kern/ort':>9}{'call/np':>9}{'call/ort':>9}"
    )
    print(header)
    print("-" * len(header))
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in x.split(",")) for x in args.shapes.split(";")]
    for m, k, n in shapes:
        burst = max(1, min(512, int(4e8 / (2.0 * m * n * k))))
        secs = _measure(_timers(drv, m, k, n, burst, 2), args.rounds, burst, args.cooldown)
        gf = {name: 2.0 * m * n * k / s / 1e9 for name, s in secs.items()}
        print(
            f"{f'{m}x{k} @ {k}x{n}':<24}{gf['xpu kernel']:>11.1f}{gf['xpu call']:>10.1f}"
            f"{gf['numpy']:>9.1f}{gf['ort']:>9.1f}"
            f"{gf['xpu kernel'] / gf['numpy']:>9.2f}{gf['xpu kernel'] / gf['ort']:>9.2f}"
            f"{gf['xpu call'] / gf['numpy']:>9.2f}{gf['xpu call'] / gf['ort']:>9.2f}"
        )
    drv.close()


if __name__ == "__main__":
    main()
