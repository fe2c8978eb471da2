"""Where a model's time goes, anychip's CPU beside onnxruntime's: per op type and per node.

anychip's times come from ``Session.profile()``; onnxruntime's from its own profiler
(``SessionOptions.enable_profiling``, the ``*_kernel_time`` events). Node names differ after
each engine's fusions (``n0+fused`` here, ``r1_nchwc`` there), so the op-type totals are the
side-by-side view (anychip's FusedConv against onnxruntime's Conv and FusedConv) and the
slowest nodes are listed for each engine on its own. Medians over the runs, in microseconds.

    python bench/node_gaps.py MODEL [--threads 2] [--runs 30] [--top 15]

``MODEL`` is any name of ``bench/cpu_models.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import defaultdict
from typing import Any

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

__all__ = ["anychip_nodes", "onnxruntime_nodes", "main"]

#: node -> (op type, median seconds per run)
Nodes = dict[str, tuple[str, float]]


def anychip_nodes(path: str, feeds: dict, runs: int) -> Nodes:
    """Per node of anychip's CPU session: its op and mean seconds per run."""
    import anychip

    sess = anychip.load(path, devices=["cpu"])
    for _ in range(3):
        sess.run(None, feeds)
    prof = sess.profile(feeds, runs=runs)
    return {name: (op, t) for name, op, _, t in prof.node_times()}


def onnxruntime_nodes(path: str, feeds: dict, runs: int, threads: int) -> Nodes:
    """Per node of onnxruntime (all graph optimizations), in execution order: its op and
    median seconds per run."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    for _ in range(runs + 3):
        sess.run(None, feeds)
    trace = sess.end_profiling()
    with open(trace, encoding="utf-8") as f:
        events = json.load(f)
    os.remove(trace)
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in sorted(events, key=lambda e: e.get("ts", 0)):  # the nodes in execution order
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            key = (e["name"][: -len("_kernel_time")], e["args"].get("op_name", "?"))
            times[key].append(e["dur"] * 1e-6)
    return {name: (op, float(np.median(ts[3:] or ts))) for (name, op), ts in times.items()}


def _by_op(nodes: Nodes) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for op, t in nodes.values():
        out["Conv" if op == "FusedConv" else op] += t
    return out


def _report(ours: Nodes, theirs: Nodes, top: int) -> str:
    a, b = _by_op(ours), _by_op(theirs)
    lines = [f"{'op (Conv: Conv + FusedConv)':30s} {'anychip us':>11s} {'onnxruntime us':>15s}"]
    for op in sorted(set(a) | set(b), key=lambda k: -(a.get(k, 0) - b.get(k, 0))):
        lines.append(f"{op:30s} {a.get(op, 0) * 1e6:11.0f} {b.get(op, 0) * 1e6:15.0f}")
    lines.append(f"{'total':30s} {sum(a.values()) * 1e6:11.0f} {sum(b.values()) * 1e6:15.0f}")
    for title, nodes in (("anychip", ours), ("onnxruntime", theirs)):
        lines.append(f"\nslowest nodes, {title}:")
        rows = sorted(nodes.items(), key=lambda kv: -kv[1][1])[:top]
        lines += [f"  {t * 1e6:8.0f} us  {op:24s} {name}" for name, (op, t) in rows]
    return "\n".join(lines)


def parse(doc: str, argv: list[str] | None, runs: int, top: int) -> argparse.Namespace:
    """The arguments these per-node benches take: a model of ``cpu_models``, threads, runs,
    how many rows to show."""
    from cpu_models import MODELS

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("model", choices=list(MODELS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=runs)
    ap.add_argument("--top", type=int, default=top)
    return ap.parse_args(argv)


def both(name: str, threads: int, runs: int, theirs_fn: Any = None) -> tuple[Any, Nodes, Any]:
    """Model ``name`` built, profiled by anychip at ``threads`` and by onnxruntime
    (``theirs_fn``, ``onnxruntime_nodes`` by default): (model, ours, theirs)."""
    import onnx
    from cpu_models import build

    from anychip.cli.bench import _thread_limit

    model, feeds = build(name)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{name}.onnx")
        onnx.save(model, path)
        with _thread_limit(threads):
            ours = anychip_nodes(path, feeds, runs)
        theirs = (theirs_fn or onnxruntime_nodes)(path, feeds, runs, threads)
    return model, ours, theirs


def main(argv: list[str] | None = None) -> None:
    args = parse(__doc__, argv, runs=30, top=15)
    _, ours, theirs = both(args.model, args.threads, args.runs)
    print(_report(ours, theirs, args.top))


if __name__ == "__main__":
    main()
