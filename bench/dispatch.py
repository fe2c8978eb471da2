"""Dispatch cost: microseconds per node on a chain of tiny element-wise ops, anychip's CPU
against onnxruntime without graph optimizations (every node run) and with all of them.

The chain is ``nodes`` unary/binary ops (Add, Mul, Relu, Neg, Abs in turn) over a float32 [4]
tensor, so each kernel does almost nothing and the time per node is the runtime's own
overhead. anychip runs it unfused (``optimize=False``: no graph rewriting, one kernel per node)
and, as ``anychip_fused``, with its passes (the element-wise fusion makes the chain generated C
kernels of up to 32 nodes each; the issue's "with fusion, below onnxruntime"). Runs are
interleaved round by round (one run of each engine per round, after warm-ups) and the median
per engine is divided by ``nodes``.

    python bench/dispatch.py [--nodes 1000] [--rounds 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

__all__ = ["chain_model", "measure", "main"]

_OPS = ("Add", "Mul", "Relu", "Neg", "Abs")


def chain_model(nodes: int = 1000, width: int = 4, seed: int = 0) -> onnx.ModelProto:
    """``nodes`` tiny ops in one chain over a float32 [width] tensor (seeded constants)."""
    rng = np.random.default_rng(seed)
    c = numpy_helper.from_array(rng.uniform(0.5, 1.0, width).astype(np.float32), "c")
    graph_nodes, prev = [], "x"
    for i in range(nodes):
        op = _OPS[i % len(_OPS)]
        ins = [prev, "c"] if op in ("Add", "Mul") else [prev]
        out = "y" if i == nodes - 1 else f"t{i}"
        graph_nodes.append(helper.make_node(op, ins, [out], name=f"n{i}"))
        prev = out
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [width])
    g = helper.make_graph(graph_nodes, "chain", [x], [y], [c])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _engines(model: onnx.ModelProto, threads: int) -> dict[str, Callable[[dict], object]]:
    import onnxruntime as ort

    import anychip

    data = model.SerializeToString()
    out: dict[str, Callable[[dict], object]] = {}
    sess = anychip.load(model, devices=["cpu"], optimize=False)
    out["anychip"] = lambda f, s=sess: s.run(None, f)
    fused = anychip.load(model, devices=["cpu"])
    out["anychip_fused"] = lambda f, s=fused: s.run(None, f)
    for label, level in (
        ("ort_no_opt", ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
        ("ort_all_opt", ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
    ):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        r = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        out[label] = lambda f, r=r: r.run(None, f)
    return out


def measure(nodes: int = 1000, rounds: int = 200, warmup: int = 10, threads: int = 1) -> dict:
    """Median µs per node of each engine over ``rounds`` interleaved rounds, and the outputs'
    largest absolute difference from onnxruntime's."""
    model = chain_model(nodes)
    feeds = {"x": np.random.default_rng(1).standard_normal(4).astype(np.float32)}
    engines = _engines(model, threads)
    for _ in range(warmup):
        for fn in engines.values():
            fn(feeds)
    times: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(rounds):
        for k, fn in engines.items():
            t0 = time.perf_counter()
            fn(feeds)
            times[k].append(time.perf_counter() - t0)
    ref = engines["ort_no_opt"](feeds)[0]
    diff = max(
        float(np.max(np.abs(engines[k](feeds)[0] - ref))) for k in ("anychip", "anychip_fused")
    )
    us = {k: statistics.median(v) / nodes * 1e6 for k, v in times.items()}
    return {"nodes": nodes, "rounds": rounds, "us_per_node": us, "max_abs_diff": diff}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    r = measure(args.nodes, args.rounds, threads=args.threads)
    us = r["us_per_node"]
    print(f"{args.nodes}-node chain, median of {args.rounds} interleaved rounds, µs per node:")
    for k, v in us.items():
        print(f"  {k:<12} {v:7.2f}")
    print(f"  anychip / ort_no_opt  {us['anychip'] / us['ort_no_opt']:.2f}")
    print(f"  anychip / ort_all_opt {us['anychip'] / us['ort_all_opt']:.2f}")
    print(f"  anychip_fused / ort_all_opt {us['anychip_fused'] / us['ort_all_opt']:.3f}")
    print(f"  max |diff| {r['max_abs_diff']:.2e}")


if __name__ == "__main__":
    main()
