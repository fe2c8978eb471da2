"""Load time against graph size: a chain of N element-wise nodes loaded by anychip and by
onnxruntime (all graph optimizations, its default), interleaved, best of ``--repeat``.

The chain alternates Add (a constant), Relu and Mul (a constant) on a (1, 64) float32 tensor,
so every node is a step of the plan and none folds away. Each load is timed from the
serialized model to a session ready to run; one run follows to check the outputs agree. The
target (issue 18): 20,000 nodes within 5x onnxruntime's time, 100,000 in under 30 s.

    python bench/load_scale.py [--sizes 4000,20000,100000] [--devices cpu] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench._timing import bars, progress


def chain(n: int, seed: int = 0) -> bytes:
    """A chain of ``n`` nodes (Add, Relu, Mul in turn) with seeded random constants."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i in range(n):
        out = f"t{i}" if i < n - 1 else "y"
        kind = ("Add", "Relu", "Mul")[i % 3]
        if kind == "Relu":
            nodes.append(helper.make_node("Relu", [prev], [out], name=f"n{i}"))
        else:
            c = rng.uniform(0.9, 1.1, (1, 64)).astype(np.float32)
            inits.append(numpy_helper.from_array(c, f"c{i}"))
            nodes.append(helper.make_node(kind, [prev, f"c{i}"], [out], name=f"n{i}"))
        prev = out
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


CPU = ["CPUExecutionProvider"]


def _time(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4000,20000,100000")
    ap.add_argument("--devices", default="cpu")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import onnxruntime as ort

    import anychip

    devices = args.devices.split(",")
    x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    head = f"{'nodes':>8} {'anychip ' + args.devices:>16} {'onnxruntime':>12} {'ratio':>7}"
    print(head + "  max|diff|")
    for n in (int(s) for s in args.sizes.split(",")):
        data = chain(n)
        ours, theirs = [], []
        for _ in progress(
            range(args.repeat), f"{n} nodes"
        ):  # interleaved: anychip, onnxruntime, anychip, ...
            t, sess = _time(lambda d=data: anychip.load(d, devices=devices))
            ours.append(t)
            t, ref = _time(lambda d=data: ort.InferenceSession(d, providers=CPU))
            theirs.append(t)
        (got,) = sess.run(None, {"x": x})
        (want,) = ref.run(None, {"x": x})
        a, b = min(ours), min(theirs)
        diff = float(np.max(np.abs(got - want)))
        print(f"{n:>8} {a:>14.2f} s {b:>10.2f} s {a / b:>6.2f}x  {diff:.1e}")
        sess.close()


if __name__ == "__main__":
    with bars():
        main()
