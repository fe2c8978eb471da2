"""The fixed cost of a request: tiny models where the runtime's own work is the whole time.

Four models, each seeded: a 1-node Identity, a 1-node Add of two inputs, a 3-node
MatMul -> Add -> Relu, and a 10-node MLP (three MatMul/Add/Relu layers and a last MatMul),
batch 1, width 32. anychip's ``cpu`` session (default options) runs against onnxruntime with
one intra-op thread and with its default threads, interleaved round by round after warm-ups;
the best and the median of ``--rounds`` runs per engine, in microseconds, and anychip's median
over each onnxruntime's. The outputs are compared with onnxruntime's first.

    python bench/request_cost.py [--rounds 3000] [--models identity,add,three,mlp]
    python bench/request_cost.py --layers [--models mlp]   # the median time of each layer
    python bench/request_cost.py --profile mlp [--rounds 20000]   # cProfile of anychip's run
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

__all__ = ["MODELS", "build", "measure", "main"]

WIDTH = 32


def _model(nodes: list, inputs: list, inits: list) -> onnx.ModelProto:
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])
    g = helper.make_graph(nodes, "request_cost", inputs, [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8  # what onnxruntime 1.1x reads
    return m


def _x(name: str = "x") -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, WIDTH])


def _layers(n: int, rng: np.random.Generator, relu_last: bool) -> tuple[list, list]:
    nodes, inits, prev = [], [], "x"
    for i in range(n):
        w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        b = rng.standard_normal(WIDTH).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == n - 1
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        out = "y" if last and relu_last is False else f"a{i}"
        nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], [out]))
        if not last or relu_last:
            out2 = "y" if last else f"r{i}"
            nodes.append(helper.make_node("Relu", [out], [out2]))
            prev = out2
    return nodes, inits


def build(name: str, seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model ``name`` (one of ``MODELS``) and seeded feeds for it."""
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal((1, WIDTH)).astype(np.float32)}
    if name == "identity":
        model = _model([helper.make_node("Identity", ["x"], ["y"])], [_x()], [])
    elif name == "add":
        feeds["z"] = rng.standard_normal((1, WIDTH)).astype(np.float32)
        model = _model([helper.make_node("Add", ["x", "z"], ["y"])], [_x(), _x("z")], [])
    elif name == "three":
        nodes, inits = _layers(1, rng, relu_last=True)
        model = _model(nodes, [_x()], inits)
    elif name == "mlp":
        nodes, inits = _layers(3, rng, relu_last=False)
        w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, "wl"))
        nodes[-1].output[0] = "a2"
        nodes += [
            helper.make_node("Relu", ["a2"], ["r2"]),
            helper.make_node("MatMul", ["r2", "wl"], ["y"]),
        ]
        model = _model(nodes, [_x()], inits)
    else:
        raise SystemExit(f"unknown model {name!r}; one of {MODELS}")
    return model, feeds


MODELS = ("identity", "add", "three", "mlp")


def _engines(model: onnx.ModelProto) -> dict[str, Callable[[dict], list]]:
    import onnxruntime as ort

    import anychip

    sess = anychip.load(model, devices=["cpu"])
    out: dict[str, Callable[[dict], list]] = {"anychip": lambda f, s=sess: s.run(None, f)}
    data = model.SerializeToString()
    for label, threads in (("ort_1t", 1), ("ort_default", 0)):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        r = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        out[label] = lambda f, r=r: r.run(None, f)
    return out


def measure(name: str, rounds: int = 3000, warmup: int = 200) -> dict:
    """Best and median microseconds per engine over ``rounds`` interleaved rounds."""
    model, feeds = build(name)
    engines = _engines(model)
    ref = engines["ort_1t"](feeds)[0]
    got = engines["anychip"](feeds)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    for _ in range(warmup):
        for fn in engines.values():
            fn(feeds)
    times: dict[str, list[float]] = {k: [] for k in engines}
    clock = time.perf_counter
    for _ in range(rounds):
        for k, fn in engines.items():
            t0 = clock()
            fn(feeds)
            times[k].append(clock() - t0)
    best = {k: min(v) * 1e6 for k, v in times.items()}
    median = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    return {"model": name, "rounds": rounds, "best_us": best, "median_us": median}


def _layers_of(sess: object, feeds: dict) -> dict[str, Callable[[], object]]:
    """Each layer of ``sess``'s request called on its own, outermost first (one-step,
    one-partition sessions): the difference of two neighbours is the cost of a layer."""
    from anychip.core.run.failover import run_request

    arrays = sess._feeds.check(feeds)  # type: ignore[attr-defined]
    steps = sess.compiled.steps  # type: ignore[attr-defined]
    layers: dict[str, Callable[[], object]] = {
        "session.run": lambda: sess.run(None, feeds),  # type: ignore[attr-defined]
        "run_request": lambda: run_request(sess, arrays),
        "steps.run": lambda: steps.run(arrays),
    }
    fn, depth = steps.steps[0].fn, 0
    while fn is not None:
        label = getattr(fn, "__qualname__", type(fn).__name__).replace(".<locals>", "")
        layers[f"{depth}:{label}"] = lambda fn=fn: fn(arrays)
        fn, depth = getattr(fn, "wrapped", None), depth + 1
    program = getattr(getattr(steps.steps[0].fn, "wrapped", None), "wrapped", None)
    program = getattr(program, "__self__", program)  # Program.run or PartitionMemory.run
    program = getattr(program, "program", program)
    layers["Program.run"] = lambda: program.run(arrays)
    calls: list[tuple] = []
    program.run(arrays, hook=lambda ins, args, out, res, slots: calls.append((ins, args)))

    def kernels() -> None:
        for ins, args in calls:
            ins.fn(*args, **ins.attrs)

    layers["kernels"] = kernels
    return layers


def layers(name: str, rounds: int) -> None:
    """Median ns of each layer of anychip's request on ``name`` (and onnxruntime's run),
    interleaved round by round."""
    import anychip

    model, feeds = build(name)
    sess = anychip.load(model, devices=["cpu"])
    for _ in range(300):
        sess.run(None, feeds)
    fns = _layers_of(sess, feeds)
    for label, fn in _engines(model).items():
        if label != "anychip":
            fns[label] = lambda fn=fn: fn(feeds)
    clock = time.perf_counter_ns
    times: dict[str, list[int]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = clock()
            fn()
            times[k].append(clock() - t0)
    print(f"{name}: median us over {rounds} interleaved rounds (each layer includes those below)")
    for k, v in times.items():
        print(f"  {k:<40} {statistics.median(v) / 1e3:7.2f}")


def profile(name: str, rounds: int) -> None:
    """cProfile of ``rounds`` anychip runs of ``name``, the 25 costliest functions."""
    import cProfile
    import pstats

    import anychip

    model, feeds = build(name)
    sess = anychip.load(model, devices=["cpu"])
    for _ in range(200):
        sess.run(None, feeds)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(rounds):
        sess.run(None, feeds)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--profile", metavar="MODEL", help="cProfile anychip's runs of MODEL")
    ap.add_argument("--layers", action="store_true", help="time each layer of a request")
    args = ap.parse_args(argv)
    if args.layers:
        for name in args.models.split(","):
            layers(name, args.rounds)
        return
    if args.profile:
        profile(args.profile, args.rounds)
        return
    print(f"median (best) us over {args.rounds} interleaved rounds; ratio = anychip median / ort")
    print(f"{'model':<9} {'anychip':>14} {'ort_1t':>14} {'ort_default':>14}  /1t  /default")
    for name in args.models.split(","):
        r = measure(name, args.rounds)
        med, best = r["median_us"], r["best_us"]
        cells = " ".join(f"{med[k]:6.1f} ({best[k]:5.1f})" for k in med)
        a = med["anychip"]
        print(f"{name:<9} {cells}  {a / med['ort_1t']:.2f}  {a / med['ort_default']:.2f}")


if __name__ == "__main__":
    main()
