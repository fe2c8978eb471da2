"""Small models (a 5-node MLP, a tiny transformer block), two checkouts of anychip in
alternate processes, each beside onnxruntime in the same process (runs alternated):

    python bench/small_models.py --old CHECKOUT [--new CHECKOUT] [--rounds 3]

Each process loads both models, checks anychip against onnxruntime, times runs 2-10 (their
median), then 3000 runs of each runtime alternated (min and median); the table gives the
medians over the rounds. A checkout is a folder holding anychip's sources (``git archive REV |
tar -x -C DIR``); each process imports it as ``anychip`` through a temporary link.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

__all__ = ["mlp", "block", "main"]

_HERE = os.path.dirname(os.path.abspath(__file__))


def _init(rng: np.random.Generator, name: str, *shape: int) -> onnx.TensorProto:
    return nh.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)


def mlp(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """MatMul, Add, Relu, MatMul, Add, Softmax on one row of 16."""
    nodes = [
        h.make_node("MatMul", ["x", "W1"], ["a"]),
        h.make_node("Add", ["a", "b1"], ["b"]),
        h.make_node("Relu", ["b"], ["c"]),
        h.make_node("MatMul", ["c", "W2"], ["d"]),
        h.make_node("Add", ["d", "b2"], ["e"]),
        h.make_node("Softmax", ["e"], ["y"], axis=-1),
    ]
    inits = [_init(rng, "W1", 16, 32), _init(rng, "b1", 32)]
    inits += [_init(rng, "W2", 32, 4), _init(rng, "b2", 4)]
    g = h.make_graph(
        nodes,
        "mlp",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 16])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4])],
        inits,
    )
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((1, 16)).astype(np.float32)}


def block(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A tiny transformer block on [8, 32]: LayerNorm, one-head attention, residual,
    LayerNorm, a ReLU MLP, residual (17 nodes)."""
    s, d = 8, 32
    nodes = [
        h.make_node("LayerNormalization", ["x", "g1", "be1"], ["ln"], axis=-1),
        h.make_node("MatMul", ["ln", "Wq"], ["q"]),
        h.make_node("MatMul", ["ln", "Wk"], ["k"]),
        h.make_node("MatMul", ["ln", "Wv"], ["v"]),
        h.make_node("Transpose", ["k"], ["kt"], perm=[1, 0]),
        h.make_node("MatMul", ["q", "kt"], ["s"]),
        h.make_node("Mul", ["s", "sc"], ["s2"]),
        h.make_node("Softmax", ["s2"], ["p"], axis=-1),
        h.make_node("MatMul", ["p", "v"], ["o"]),
        h.make_node("MatMul", ["o", "Wo"], ["o2"]),
        h.make_node("Add", ["x", "o2"], ["r"]),
        h.make_node("LayerNormalization", ["r", "g2", "be2"], ["ln2"], axis=-1),
        h.make_node("MatMul", ["ln2", "W1"], ["f"]),
        h.make_node("Add", ["f", "bf"], ["f2"]),
        h.make_node("Relu", ["f2"], ["f3"]),
        h.make_node("MatMul", ["f3", "W2"], ["f4"]),
        h.make_node("Add", ["r", "f4"], ["y"]),
    ]
    inits = [_init(rng, "g1", d), _init(rng, "be1", d), _init(rng, "Wq", d, d)]
    inits += [_init(rng, "Wk", d, d), _init(rng, "Wv", d, d), _init(rng, "Wo", d, d)]
    inits += [nh.from_array(np.array(1 / np.sqrt(d), np.float32), "sc")]
    inits += [_init(rng, "g2", d), _init(rng, "be2", d), _init(rng, "W1", d, 4 * d)]
    inits += [_init(rng, "bf", 4 * d), _init(rng, "W2", 4 * d, d)]
    g = h.make_graph(
        nodes,
        "block",
        [h.make_tensor_value_info("x", T.FLOAT, [s, d])],
        [h.make_tensor_value_info("y", T.FLOAT, [s, d])],
        inits,
    )
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((s, d)).astype(np.float32)}


def _time_here() -> dict[str, dict[str, float]]:
    """The figures of each model for the ``anychip`` this process imports (in microseconds)."""
    import onnxruntime as ort

    import anychip

    out = {}
    rng = np.random.default_rng(0)
    for name, make in (("mlp5", mlp), ("block", block)):
        model, feeds = make(rng)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sess = anychip.load(model, devices=["cpu"])
        ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        got, want = sess.run(None, feeds)[0], ref.run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        early = []
        for _ in range(9):
            t0 = time.perf_counter()
            sess.run(None, feeds)
            early.append(time.perf_counter() - t0)
        for _ in range(20):
            sess.run(None, feeds)
        ta, tb = [], []
        for _ in range(3000):
            t0 = time.perf_counter()
            sess.run(None, feeds)
            t1 = time.perf_counter()
            ref.run(None, feeds)
            t2 = time.perf_counter()
            ta.append(t1 - t0)
            tb.append(t2 - t1)
        out[name] = {
            "run2": early[0] * 1e6,
            "runs2_10": float(np.median(early)) * 1e6,
            "any_min": min(ta) * 1e6,
            "any_med": float(np.median(ta)) * 1e6,
            "ort_min": min(tb) * 1e6,
            "ort_med": float(np.median(tb)) * 1e6,
        }
    return out


def _run(checkout: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(os.path.abspath(checkout), os.path.join(tmp, "anychip"))
        env = dict(os.environ, PYTHONPATH=tmp)
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode:
        raise SystemExit(f"{checkout}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", help="the checkout to compare with")
    ap.add_argument("--new", default=os.path.join(_HERE, ".."), help="default: this checkout")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_time_here()))
        return
    runs = [("new", args.new)] if args.old is None else [("old", args.old), ("new", args.new)]
    res: dict[str, list[dict]] = {key: [] for key, _ in runs}
    for _ in range(args.rounds):
        for key, path in runs:
            res[key].append(_run(path))
    for model in res["new"][0]:
        for key, _ in runs:
            rows = [r[model] for r in res[key]]

            def med(field: str, rows: list[dict] = rows) -> float:
                return statistics.median(x[field] for x in rows)

            print(
                f"{model:6s} {key}: anychip min {med('any_min'):6.1f} us med "
                f"{med('any_med'):6.1f} | onnxruntime min {med('ort_min'):5.1f} med "
                f"{med('ort_med'):5.1f} | ratio min {med('any_min') / med('ort_min'):.2f} "
                f"med {med('any_med') / med('ort_med'):.2f} | run 2 {med('run2'):6.0f} us, "
                f"runs 2-10 {med('runs2_10'):6.0f} us"
            )


if __name__ == "__main__":
    main()
