"""The CPU's fusions: element-wise chains (generated C vs numpy vs onnxruntime) and the light
models with fusion on and off, against onnxruntime.

Run::

    python bench/fusion.py [--rounds 7] [--elements 4000000] [--threads 1]
        [--models squeezenet resnet50 ...] [--skip chains models] [--json out.json]

Every figure is a median over rounds in which the contenders run interleaved (one sample of
each per round), so load from other processes hits them alike; ratios are the medians'
ratios. ``--cpu-time`` times with the process's CPU time instead of the wall clock: with one
thread on every side it counts each contender's own work whatever the scheduler of a shared
machine does. ``--threads`` sets ``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS`` (numpy's BLAS and
onnxruntime's intra-op pool; the generated C is single-threaded) before anything loads.

- Chains, one kernel: ``FusedElementwise``'s generated C against the numpy fallback
  (``op_fused_elementwise.evaluate``, the same formulas as the unfused kernels).
- Chains, as models: ``anychip.load`` of the chain with fusion on (one generated kernel) and
  off (one numpy kernel per node), and onnxruntime (all graph optimizations).
- Models: ``anychip.zoo.light_model`` (seeded random weights) and the BERT-like and GPT-like
  layers of ``bench/models.py``, fusion on and off, onnxruntime.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

CHAINS = {
    # name: (ONNX nodes over x and b, opset)
    "silu+bias": (
        [("Add", ["x", "b"], "a"), ("Sigmoid", ["a"], "s"), ("Mul", ["a", "s"], "y")],
        17,
    ),
    "gelu(erf)": ([("Gelu", ["x"], "g"), ("Add", ["g", "b"], "y")], 20),
    "bias+relu": ([("Add", ["x", "b"], "a"), ("Relu", ["a"], "y")], 17),
    "hardswish*tanh": (
        [("HardSwish", ["x"], "h"), ("Tanh", ["x"], "t"), ("Mul", ["h", "t"], "y")],
        17,
    ),
}


def _chain_model(name: str, n: int) -> object:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, opset = CHAINS[name]
    shape = [n // 256, 256]
    graph = helper.make_graph(
        [helper.make_node(op, ins, [out]) for op, ins, out in nodes],
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(np.random.default_rng(0).standard_normal(256).astype("f"), "b")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


CLOCK = time.perf_counter


def _interleaved(contenders: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds per contender over ``rounds`` interleaved rounds (one warm-up each), on
    ``CLOCK`` (wall, or the process's CPU time with ``--cpu-time``)."""
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for fn in contenders.values():
        fn()
    for _ in range(rounds):
        for k, fn in contenders.items():
            t0 = CLOCK()
            fn()
            times[k].append(CLOCK() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _sessions(data: bytes, feeds: dict) -> dict[str, Callable[[], object]]:
    import onnxruntime as ort

    import anychip

    fused = anychip.load(data, "cpu")
    plain = anychip.load(data, "cpu", device_options={"cpu": {"fusion": False}})
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    peer = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    return {
        "fused": lambda: fused.run(None, feeds),
        "unfused": lambda: plain.run(None, feeds),
        "onnxruntime": lambda: peer.run(None, feeds),
    }


def bench_chains(n: int, rounds: int) -> list[dict]:
    import numpy as np

    from anychip.backends.cpu.kernels.op_fused_elementwise import evaluate, fused_elementwise
    from anychip.codegen import parse

    rows = []
    x = np.random.default_rng(1).standard_normal((n // 256, 256)).astype(np.float32)
    for name in CHAINS:
        data = _chain_model(name, n).SerializeToString()
        feeds = {"x": x}
        import anychip

        s = anychip.load(data, "cpu")
        node = s.partitions[0].graph.nodes[0]
        expr = node.attr("expr")
        args = [x] + [v.const for v in node.inputs[1:]]
        e = parse(expr)
        t = _interleaved(
            {
                "c": lambda args=args, expr=expr: fused_elementwise(*args, expr=expr),
                "numpy": lambda args=args, e=e: evaluate(e, args, np.dtype(np.float32)),
                **_sessions(data, feeds),
            },
            rounds,
        )
        row = {"chain": name, "expr": expr, **{k: v * 1e3 for k, v in t.items()}}
        row["numpy/c"] = t["numpy"] / t["c"]
        row["unfused/fused"] = t["unfused"] / t["fused"]
        row["fused/onnxruntime"] = t["fused"] / t["onnxruntime"]
        rows.append(row)
        print(
            f"{name:16s} C {row['c']:7.2f} ms  numpy {row['numpy']:7.2f} ms  "
            f"(numpy/C {row['numpy/c']:.2f}) | model fused {row['fused']:7.2f} unfused "
            f"{row['unfused']:7.2f} ort {row['onnxruntime']:7.2f} ms  fused/ort "
            f"{row['fused/onnxruntime']:.2f}",
            flush=True,
        )
    return rows


def bench_models(names: list[str], rounds: int) -> list[dict]:
    import numpy as np

    import anychip
    from anychip.zoo import light_model

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench.models import HELD_OUT

    rows = []
    for name in names:
        data = HELD_OUT[name][0]() if name in HELD_OUT else light_model(name).SerializeToString()
        s = anychip.load(data, "cpu")
        rng = np.random.default_rng(1)
        feeds = {
            i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(
                np.float32
            )
            for i in s.inputs
        }
        t = _interleaved(_sessions(data, feeds), rounds)
        row = {"model": name, **{k: v * 1e3 for k, v in t.items()}}
        row["fusions"] = s.partitions[0].info.get("fusions", {})
        row["unfused/fused"] = t["unfused"] / t["fused"]
        row["fused/onnxruntime"] = t["fused"] / t["onnxruntime"]
        row["unfused/onnxruntime"] = t["unfused"] / t["onnxruntime"]
        rows.append(row)
        print(
            f"{name:14s} fused {row['fused']:8.2f} ms  unfused {row['unfused']:8.2f} ms  ort "
            f"{row['onnxruntime']:8.2f} ms  unfused/fused {row['unfused/fused']:.2f}  "
            f"fused/ort {row['fused/onnxruntime']:.2f}  unfused/ort "
            f"{row['unfused/onnxruntime']:.2f}  {row['fusions']}",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--elements", type=int, default=4_000_000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--models",
        nargs="*",
        default=[
            "squeezenet",
            "resnet50",
            "shufflenet",
            "inception_v1",
            "inception_v2",
            "densenet121",
            "bert_like",
            "gpt_like",
        ],
    )
    ap.add_argument("--skip", nargs="*", default=[], choices=["chains", "models"])
    ap.add_argument("--json", default="")
    ap.add_argument("--cpu-time", action="store_true", help="time with the process's CPU time")
    args = ap.parse_args(argv)
    global CLOCK
    if args.cpu_time:
        CLOCK = time.process_time
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    out: dict = {"threads": args.threads, "rounds": args.rounds, "load": os.getloadavg()}
    clock = "process CPU time" if args.cpu_time else "wall clock"
    print(f"threads {args.threads}, rounds {args.rounds}, {clock}, load average {out['load']}")
    if "chains" not in args.skip:
        out["chains"] = bench_chains(args.elements, args.rounds)
    if "models" not in args.skip:
        out["models"] = bench_models(args.models, args.rounds)
    out["load_after"] = os.getloadavg()
    print(f"load average after: {out['load_after']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
