"""A fresh process's first load against onnxruntime's, imports included.

    python bench/cold_start.py [--rounds 5] [--models squeezenet resnet50 hf_bert_tiny tiny]
                               [--tree LABEL=PYTHONPATH ...] [--phases]

Each measurement is a new interpreter that imports numpy, then times ``import anychip`` +
``anychip.load(path, ["cpu"])`` (or ``import onnxruntime`` + an ``InferenceSession``, default
options, one thread each way as the runtimes choose), the first run, and the mean of runs
2-10. The runs alternate: per round, per model, every ``--tree`` (an anychip checkout given as
the folder that holds its ``anychip`` package, so two revisions compare in one sitting) and
onnxruntime, one after the other. Printed: the median over rounds of each phase, and anychip's
ratio to onnxruntime; beside the wall times, the process's CPU time of load + first run (all
its threads: less disturbed by other processes on a shared machine, though not by the cache
and frequency effects they cause). Run it with Python's bytecode cache on
(``PYTHONDONTWRITEBYTECODE`` unset), as an installed package has it, after one warm-up round
(the index of the CPU's kernels, the calibration, the checker's passes and the entry points
are written by the first process: ``--warmup 1``). ``--phases`` times anychip alone, its load +
first run split into ``PHASES`` (onnx's import, the load path's imports, the CPU plugin,
``import_model``, the compile of the imported model, the first run).
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

__all__ = ["main"]

MODELS = ("squeezenet", "resnet50", "hf_bert_tiny", "tiny")
_HERE = os.path.dirname(os.path.abspath(__file__))


def _one(runtime: str, path: str) -> dict[str, float]:
    """In a fresh process: the phases of ``runtime`` on the model at ``path``."""
    import numpy as np

    with np.load(path + ".npz") as z:
        feeds = {k: z[k] for k in z.files}
    c0 = time.process_time()
    t0 = time.perf_counter()
    if runtime == "phases":
        return _phases(path)
    if runtime == "ort":
        import onnxruntime as ort

        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        run = lambda: sess.run(None, feeds)  # noqa: E731
    else:
        import anychip

        asess = anychip.load(path, ["cpu"])
        run = lambda: asess.run(None, feeds)  # noqa: E731
    t1, c1 = time.perf_counter(), time.process_time()
    run()
    t2, c2 = time.perf_counter(), time.process_time()
    for _ in range(9):
        run()
    t3 = time.perf_counter()
    return {
        "load": t1 - t0,
        "first": t2 - t1,
        "2-10": (t3 - t2) / 9,
        "cpu load": c1 - c0,
        "cpu first": c2 - c1,
    }


#: The phases ``--phases`` splits anychip's load + first run into, in order.
PHASES = ("import onnx", "import the load path", "cpu plugin", "import_model", "compile", "first")


def _phases(path: str) -> dict[str, float]:
    """In a fresh process: anychip's load + first run of ``path`` split into ``PHASES``
    (each phase's imports counted where they happen)."""
    import numpy as np

    with np.load(path + ".npz") as z:
        feeds = {k: z[k] for k in z.files}
    marks = [time.perf_counter()]
    import onnx  # noqa: F401

    marks.append(time.perf_counter())
    import anychip.core.api.session
    from anychip.core.plugin.host import get_registry
    from anychip.ir.onnx import import_model

    marks.append(time.perf_counter())
    get_registry(["cpu"])
    marks.append(time.perf_counter())
    model = import_model(path)
    marks.append(time.perf_counter())
    sess = anychip.core.api.session.load(model, ["cpu"])
    marks.append(time.perf_counter())
    sess.run(None, feeds)
    marks.append(time.perf_counter())
    return {p: marks[i + 1] - marks[i] for i, p in enumerate(PHASES)}


def _write_models(folder: str, names: list[str]) -> dict[str, str]:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    paths = {}
    for name in names:
        path = os.path.join(folder, f"{name}.onnx")
        paths[name] = path
        if name == "tiny":
            x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])
            y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])
            nodes = [
                helper.make_node("Add", ["x", "x"], ["s"]),
                helper.make_node("Relu", ["s"], ["y"]),
            ]
            model = helper.make_model(
                helper.make_graph(nodes, "tiny", [x], [y]),
                opset_imports=[helper.make_opsetid("", 17)],
            )
        elif name.startswith("hf_"):
            model = onnx.load(os.path.join(_HERE, "..", "tests", "data", f"{name}.onnx"))
        else:
            from anychip.zoo import light_model

            model = light_model(name, seed=0)
        onnx.save(model, path)
        rng = np.random.default_rng(0)
        inits = {i.name for i in model.graph.initializer}
        feeds = {}
        for inp in model.graph.input:
            if inp.name in inits:
                continue
            t = inp.type.tensor_type
            shape = [d.dim_value if d.dim_value > 0 else 8 for d in t.shape.dim]
            if t.elem_type == TensorProto.FLOAT:
                feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
            else:
                dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
                feeds[inp.name] = rng.integers(0, 2, shape).astype(dtype)
        np.savez(path + ".npz", **feeds)
    return paths


def _spawn(runtime: str, path: str, pythonpath: str) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, os.path.abspath(__file__), "--one", runtime, path]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise RuntimeError(f"{runtime} {path}: {out.stderr.strip()[-400:]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--tree", action="append", default=[], help="LABEL=PYTHONPATH")
    ap.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "anychip-cold"))
    ap.add_argument("--phases", action="store_true", help="split anychip's load into PHASES")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(_one(*args.one)))
        return 0
    trees = [t.split("=", 1) for t in args.tree] or [["anychip", os.environ.get("PYTHONPATH", "")]]
    os.makedirs(args.folder, exist_ok=True)
    paths = _write_models(args.folder, args.models)
    if args.phases:
        return _print_phases(args, trees, paths)
    runners = [(label, label, pp) for label, pp in trees] + [("ort", "ort", "")]
    got: dict[tuple[str, str], list[dict[str, float]]] = {}
    for r in range(args.warmup + args.rounds):
        for name, path in paths.items():
            for label, runtime, pp in runners:
                phases = _spawn("ort" if runtime == "ort" else "anychip", path, pp)
                if r >= args.warmup:
                    got.setdefault((name, label), []).append(phases)
    print(
        "| model | runtime | load+import ms | first ms | runs 2-10 ms | load+first vs ort "
        "| CPU load+first ms | CPU vs ort |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in paths:
        med = {}
        for label, _, _ in runners:
            rows = got[(name, label)]
            med[label] = {p: statistics.median(x[p] for x in rows) for p in rows[0]}
        ort_lf = med["ort"]["load"] + med["ort"]["first"]
        for label, _, _ in runners:
            m = med[label]
            ratio = (m["load"] + m["first"]) / ort_lf
            cpu = m["cpu load"] + m["cpu first"]
            cpu_ratio = cpu / (med["ort"]["cpu load"] + med["ort"]["cpu first"])
            print(
                f"| {name} | {label} | {1e3 * m['load']:.1f} | {1e3 * m['first']:.2f} | "
                f"{1e3 * m['2-10']:.3f} | {ratio:.2f}x | {1e3 * cpu:.1f} | {cpu_ratio:.2f}x |"
            )
    return 0


def _print_phases(args: argparse.Namespace, trees: list[list[str]], paths: dict[str, str]) -> int:
    """``--phases``: per model and tree, the median of each phase over the rounds (fresh
    processes, trees interleaved)."""
    got: dict[tuple[str, str], list[dict[str, float]]] = {}
    for r in range(args.warmup + args.rounds):
        for name, path in paths.items():
            for label, pp in trees:
                phases = _spawn("phases", path, pp)
                if r >= args.warmup:
                    got.setdefault((name, label), []).append(phases)
    print("| model | tree | " + " | ".join(f"{p} ms" for p in PHASES) + " | sum ms |")
    print("|---|---|" + "---|" * (len(PHASES) + 1))
    for name in paths:
        for label, _ in trees:
            rows = got[(name, label)]
            med = [statistics.median(x[p] for x in rows) for p in PHASES]
            cells = " | ".join(f"{1e3 * m:.1f}" for m in med)
            print(f"| {name} | {label} | {cells} | {1e3 * sum(med):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
