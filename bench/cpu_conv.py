"""ResNet-50's convolutions on the CPU: anychip's oneDNN kernel against onnxruntime's Conv node
and anychip's numpy im2col kernel, at 1 and 2 threads; then the light ResNet-50 end to end,
anychip with oneDNN and with it hidden (the numpy kernels) against onnxruntime.

    python bench/cpu_conv.py [--rounds 7] [--threads 1 2] [--json out.json] [--light MODEL...]

Every timing is interleaved (one call of each contender per round) and the median is reported.
The conv shapes are the 53 convolutions of onnx's light ResNet-50 at batch 1 (shape inference),
deduplicated; "total" weighs each shape by how often it occurs. "onednn-cl" is the oneDNN
kernel with channels-last input and output, what it runs between two oneDNN nodes;
"onednn-nchw" takes and returns NCHW (reorders at both edges, or NCHW 1x1 GEMM), what it runs
next to numpy kernels. Threads: OpenMP (oneDNN) and BLAS are capped with threadpoolctl,
onnxruntime through ``intra_op_num_threads``. On a machine shared with other jobs, spinning
thread pools collapse at 2 threads: anychip makes libgomp passive (``OMP_WAIT_POLICY``), but
OpenBLAS's threads still spin, so the numpy column suffers there (figures of 2026-11-25 in
docs/perf/cpu-round-01-onednn.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from onnx import helper, numpy_helper, shape_inference
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import anychip
from anychip.backends.cpu.kernels.op_conv import conv as numpy_conv
from anychip.backends.cpu.onednn import _lib
from anychip.backends.cpu.onednn.conv import conv as onednn_conv
from anychip.zoo import light_model

Shape = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def resnet_convs() -> Counter[Shape]:
    """(x shape, w shape, strides, pads) of each Conv of the light ResNet-50, with counts."""
    model = light_model("resnet50", seed=0)
    inferred = shape_inference.infer_shapes(model)
    dims = {
        v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
        for v in list(inferred.graph.value_info) + list(inferred.graph.input)
    }
    inits = {i.name: tuple(i.dims) for i in model.graph.initializer}
    out: Counter[Shape] = Counter()
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        attrs = {a.name: list(a.ints) for a in node.attribute}
        x = dims[node.input[0]]
        out[(x, inits[node.input[1]], tuple(attrs.get("strides", [1, 1])),
             tuple(attrs.get("pads", [0, 0, 0, 0])))] += 1  # fmt: skip
    return out


def interleaved(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds of each function, called in turn once per round (after one warm-up),
    each timed call right after an untimed one of its own, as ``anychip bench`` times: the
    previous contender's threads then slow its own untimed call, not the timed one."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        f()
    for _ in range(rounds):
        for k, f in fns.items():
            f()
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def conv_node_session(x: np.ndarray, w: np.ndarray, attrs: dict, threads: int):
    node = helper.make_node("Conv", ["X", "W"], ["Y"], **attrs)
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("X", 1, list(x.shape))],
        [helper.make_tensor_value_info("Y", 1, None)],
        [numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = _ort_options(threads)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _ort_options(threads: int) -> ort.SessionOptions:
    """onnxruntime at ``threads`` intra-op threads that do not spin after a run: spinning, they
    take the cores from the contender timed next (``anychip bench`` sets the same)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def bench_shape(
    x: np.ndarray, w: np.ndarray, attrs: dict, threads: int, rounds: int
) -> dict[str, float]:
    """Median seconds of one convolution by each contender."""
    x_cl = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    sess = conv_node_session(x, w, attrs, threads)
    fns = {
        "onednn-cl": lambda: onednn_conv(x_cl, w, None, None, None, attrs, True),
        "onednn-nchw": lambda: onednn_conv(x, w, None, None, None, attrs, False),
        "onnxruntime": lambda: sess.run(None, {"X": x}),
    }
    out = interleaved(fns, rounds)
    # numpy's on its own, then a pause: OpenBLAS's threads spin for about 0.1 s after a call
    # (0.105 s of the process's CPU in the idle second after a 512x512 matmul), sharing the
    # cores with whichever contender is timed meanwhile
    out |= interleaved({"numpy": lambda: numpy_conv(x, w, **attrs)}, rounds)
    time.sleep(0.3)  # its spin over before the next shape's contenders
    return out


def bench_convs(threads: int, rounds: int) -> dict:
    rng = np.random.default_rng(0)
    rows, flops_total, time_total = [], 0.0, Counter()
    for (xs, ws, strides, pads), count in resnet_convs().items():
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) * 0.05).astype(np.float32)
        attrs = {"strides": list(strides), "pads": list(pads)}
        med = bench_shape(x, w, attrs, threads, rounds)
        oh, ow = ((xs[k + 2] + pads[k] + pads[k + 2] - ws[k + 2]) // strides[k] + 1 for k in (0, 1))
        flops = 2.0 * ws[0] * oh * ow * np.prod(ws[1:])  # (numpy's conv would start OpenBLAS)
        flops_total += flops * count
        for k, v in med.items():
            time_total[k] += v * count
        rows.append({"x": xs, "w": ws, "strides": strides, "count": count,
                     **{k: flops / v / 1e9 for k, v in med.items()}})  # fmt: skip
    total = {k: flops_total / v / 1e9 for k, v in time_total.items()}
    return {"threads": threads, "shapes": rows, "total_gflops": total}


def bench_light(threads: int, rounds: int, model_name: str = "resnet50") -> dict:
    """One light model end to end: anychip with oneDNN, with it hidden, and onnxruntime."""
    model = light_model(model_name, seed=1)
    sess = anychip.load(model, devices=["cpu"])
    name = sess.inputs[0].name  # (old models also list their initializers as inputs)
    inp = next(i for i in model.graph.input if i.name == name)
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    so = _ort_options(threads)
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    want = ref.run(None, {name: x})[0]

    def hidden() -> object:
        os.environ["ANYCHIP_ONEDNN"] = "0"
        _lib.reset()
        try:
            return sess.run(None, {name: x})
        finally:
            del os.environ["ANYCHIP_ONEDNN"]
            _lib.reset()

    got = sess.run(None, {name: x})
    got = np.asarray(list(got.values())[0] if isinstance(got, dict) else got[0])
    med = interleaved(
        {
            "anychip-onednn": lambda: sess.run(None, {name: x}),
            "anychip-numpy": hidden,
            "onnxruntime": lambda: ref.run(None, {name: x}),
        },
        rounds,
    )
    ms = {k: v * 1e3 for k, v in med.items()}
    return {
        "model": model_name,
        "threads": threads,
        "ms": ms,
        "ratio_onednn": ms["anychip-onednn"] / ms["onnxruntime"],
        "ratio_numpy": ms["anychip-numpy"] / ms["onnxruntime"],
        "max_abs_diff": float(np.abs(got - want).max()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument(
        "--light",
        nargs="*",
        default=[],
        help="more light models end to end (e.g. squeezenet inception_v1 densenet121)",
    )
    args = ap.parse_args()
    if not _lib.available():
        sys.exit(f"oneDNN is not available: {_lib.unavailable_reason()}")
    print(f"oneDNN {_lib.get().version} from {_lib.get().path}; load average {os.getloadavg()}")
    results = []
    for t in args.threads:
        with threadpool_limits(t):
            convs = bench_convs(t, args.rounds)
            e2e = bench_light(t, args.rounds)
            others = [bench_light(t, args.rounds, m) for m in args.light]
        results.append({"convs": convs, "resnet50": e2e, "light": others})
        print(f"\n{t} thread(s): ResNet-50 convolutions, GFLOP/s (median of {args.rounds})")
        keys = list(convs["total_gflops"])
        print(f"{'x':<18} {'w':<18} {'s':>2} {'n':>2} " + " ".join(f"{k:>12}" for k in keys))
        for r in convs["shapes"]:
            cells = " ".join(f"{r[k]:>12.1f}" for k in keys)
            print(
                f"{str(r['x']):<18} {str(r['w']):<18} {r['strides'][0]:>2} {r['count']:>2} {cells}"
            )
        cells = " ".join(f"{convs['total_gflops'][k]:>12.1f}" for k in keys)
        print(f"{'total (weighted)':<44} {cells}")
        ms = e2e["ms"]
        print(
            f"light ResNet-50 end to end: anychip+oneDNN {ms['anychip-onednn']:.1f} ms, "
            f"anychip numpy {ms['anychip-numpy']:.1f} ms, onnxruntime {ms['onnxruntime']:.1f} ms; "
            f"ratios {e2e['ratio_onednn']:.2f} / {e2e['ratio_numpy']:.2f}; "
            f"max |diff| {e2e['max_abs_diff']:.2e}"
        )
        for r in others:
            ms = r["ms"]
            print(
                f"light {r['model']}: anychip+oneDNN {ms['anychip-onednn']:.1f} ms, numpy "
                f"{ms['anychip-numpy']:.1f} ms, onnxruntime {ms['onnxruntime']:.1f} ms; ratios "
                f"{r['ratio_onednn']:.2f} / {r['ratio_numpy']:.2f}; max |diff| "
                f"{r['max_abs_diff']:.2e}"
            )
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
