"""onnxruntime's own test models (``onnxruntime/test/testdata`` of a fetched source tree) run on
anychip and onnxruntime, each in a subprocess with a timeout: a pass-rate table by domain.

    python bench/wild_ortdata.py GIT_DIR [--rev HEAD] [--sample N] [--seed 0] [--timeout 60]
                                 [--jobs 2] [--md FILE] [--json FILE] [--only SUBSTR]
                                 [--class standard|contrib]
    python bench/wild_ortdata.py --rerun ROWS.json [--statuses mismatch,...] [--json FILE]

``GIT_DIR`` is a bare mirror (the ``fetch`` tool's ``.../repo``): the files are read with
``git ls-tree`` / ``git cat-file`` into a scratch folder, nothing of onnxruntime is kept in
this repository. Each model is classed ``standard`` (only the ai.onnx and ai.onnx.ml domains)
or ``contrib`` (com.microsoft or any other domain), fed seeded random inputs made from its
declared inputs (symbolic dimensions -> 2, integers in [0, 4); then 1 and [0, 1) when
onnxruntime refuses those; a model whose inputs cannot be made is skipped with the cause),
run on onnxruntime (graph optimizations off: the model as written) and on
``anychip.load(model, devices=["cpu"])``. Outcomes: ``pass``, ``mismatch``, ``anychip-error``
(the first line of the error), ``crash`` (the subprocess died or hung), ``ort-fails``
(onnxruntime itself refuses: excluded from the rates), ``ort-random`` (two onnxruntime runs
on the same feeds differ: a random op, Dropout in training mode; excluded), ``skipped``
(inputs not made, or the file is absent from the snapshot). Floats are compared at rtol = atol
= 1e-3, or 1e-2 in a model that computes in float16 anywhere (``narrow_floats``); in a
quantized model up to 1% of an output may be one quantization step apart (``_compare``; such
passes are listed with the note).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.wild_corpus import compare

__all__ = ["extract", "classify", "make_feeds", "run_one", "main"]

TESTDATA = "onnxruntime/test/testdata"
STANDARD = {"", "ai.onnx", "ai.onnx.ml"}
SYMBOLIC = 2
MAX_ELEMENTS = 1 << 25  # an input larger than this is not made (skipped)
# (symbolic dimension, integer bound) tried in turn until onnxruntime runs the model
FEED_TRIES = ((SYMBOLIC, 4), (1, 4), (1, 1))


def extract(git_dir: str, rev: str, dest: str) -> list[str]:
    """Write every file under ``TESTDATA`` at ``rev`` into ``dest``; the .onnx paths."""
    listing = subprocess.run(
        ["git", "--git-dir", git_dir, "ls-tree", "-r", rev, TESTDATA],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    blobs = []
    for line in listing:
        meta, path = line.split("\t", 1)
        _, kind, sha = meta.split()
        if kind == "blob":
            blobs.append((sha, path))
    missing = [(s, p) for s, p in blobs if not os.path.exists(os.path.join(dest, p))]
    if missing:
        proc = subprocess.Popen(
            ["git", "--git-dir", git_dir, "cat-file", "--batch"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert proc.stdin is not None and proc.stdout is not None
        for sha, path in missing:
            proc.stdin.write(sha.encode() + b"\n")
            proc.stdin.flush()
            header = proc.stdout.readline().split()
            if len(header) < 3:
                continue
            data = proc.stdout.read(int(header[2]))
            proc.stdout.read(1)
            target = os.path.join(dest, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(data)
        proc.stdin.close()
        proc.wait()
    return sorted(p for _, p in blobs if p.endswith(".onnx"))


def _node_fields(model: Any, field: str) -> set[str]:
    """``field`` (``domain``, ``op_type``) of ``model``'s nodes, subgraphs and local
    functions included."""
    found: set[str] = set()

    def walk(nodes: Any) -> None:
        for node in nodes:
            found.add(getattr(node, field))
            for attr in node.attribute:
                if attr.HasField("g"):
                    walk(attr.g.node)
                for g in attr.graphs:
                    walk(g.node)

    walk(model.graph.node)
    for f in model.functions:
        walk(f.node)
    return found


def _domains(model: Any) -> set[str]:
    return _node_fields(model, "domain")


#: ops whose results onnxruntime draws at random: a model with one is run 6 times before it
#: is called deterministic (a Dropout mask over 2 elements agrees between two runs 1 in 4)
RANDOM_OPS = frozenset(
    {"Dropout", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike"}
    | {"Multinomial", "Bernoulli", "BiasDropout", "BitmaskDropout", "BitmaskBiasDropout"}
)


def _op_types(model: Any) -> set[str]:
    """The op types of ``model``'s nodes, subgraphs and local functions included."""
    return _node_fields(model, "op_type")


def classify(model: Any) -> str:
    """``standard`` when every node (subgraphs included) is in ai.onnx or ai.onnx.ml."""
    local = {f.domain for f in model.functions}
    return "standard" if _domains(model) - local <= STANDARD else "contrib"


def make_feeds(
    model: Any, seed: int = 0, symbolic: int = SYMBOLIC, high: int = 4
) -> dict[str, Any]:
    """Seeded random values for the graph inputs that are not initializers (a symbolic
    dimension is ``symbolic``, integers are drawn from [0, ``high``)); ValueError (with the
    cause) when one cannot be made."""
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer} | {
        i.values.name for i in model.graph.sparse_initializer
    }
    feeds: dict[str, Any] = {}
    for inp in model.graph.input:
        if inp.name not in inits:
            feeds[inp.name] = _value(inp.type, f"input {inp.name!r}", rng, symbolic, high)
    return feeds


def _value(tp: Any, what: str, rng: Any, symbolic: int, high: int) -> Any:
    """A random value of type ``tp``: a tensor, a sequence of two, or an optional's tensor."""
    import onnx

    kind = tp.WhichOneof("value")
    if kind == "sequence_type":
        return [_value(tp.sequence_type.elem_type, what, rng, symbolic, high) for _ in range(2)]
    if kind == "optional_type":
        return _value(tp.optional_type.elem_type, what, rng, symbolic, high)
    if kind != "tensor_type":
        raise ValueError(f"{what}: a {kind} input")
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        raise ValueError(f"{what}: unknown rank")
    shape = [
        d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else symbolic
        for d in tt.shape.dim
    ]
    if int(np.prod(shape, dtype=np.int64)) > MAX_ELEMENTS:
        raise ValueError(f"{what}: {shape} is over {MAX_ELEMENTS} elements")
    if tt.elem_type == onnx.TensorProto.STRING:
        return rng.choice(np.array(["a", "b", "c"], dtype=object), size=shape)
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
    except Exception:
        raise ValueError(f"{what}: element type {tt.elem_type}") from None
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(0, high, shape).astype(dtype)
    raise ValueError(f"{what}: numpy type {dtype}")


def _dense(value: Any) -> Any:
    """onnxruntime's COO ``SparseTensor`` output as the dense array anychip returns."""
    if not hasattr(value, "get_coo_data"):
        return value
    shape = list(value.dense_shape())
    dense = np.zeros(shape, dtype=value.values().dtype)
    idx = np.asarray(value.get_coo_data().indices())
    flat = idx if idx.ndim == 1 else np.ravel_multi_index(tuple(idx.T), shape)
    dense.reshape(-1)[flat] = value.values()
    return dense


_HALF = (10, 16)  # TensorProto FLOAT16, BFLOAT16


def narrow_floats(model: Any) -> bool:
    """Whether ``model`` computes in a 16-bit float anywhere (an input, output, value_info,
    initializer or Cast target): then its float results are compared at float16's precision
    (onnxruntime's CPU runs most float16 ops in float32 and drops the round trips between
    them, so it is one float16 step away from the op-by-op result)."""
    graphs = [model.graph]
    seen = False
    while graphs and not seen:
        g = graphs.pop()
        vis = (*g.input, *g.output, *g.value_info)
        seen = any(v.type.tensor_type.elem_type in _HALF for v in vis)
        seen = seen or any(t.data_type in _HALF for t in g.initializer)
        for node in g.node:
            for a in node.attribute:
                seen = seen or (a.name == "to" and node.op_type == "Cast" and a.i in _HALF)
                if a.HasField("g"):
                    graphs.append(a.g)
                graphs.extend(a.graphs)
    return seen


_QDQ = ("QuantizeLinear", "DequantizeLinear")


def quant_step(model: Any) -> float | None:
    """The largest scale of ``model``'s QuantizeLinear/DequantizeLinear initializers (one
    quantization step of its coarsest tensor), or None for a model that quantizes nothing."""
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    steps = [0.0]
    quantized = False
    for node in model.graph.node:
        if node.op_type in _QDQ or node.op_type.startswith("QLinear"):
            quantized = True
        if node.op_type in _QDQ and len(node.input) > 1 and node.input[1] in inits:
            scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
            steps.append(float(np.max(np.abs(scale), initial=0.0)))
    return max(steps) if quantized else None


def _compare(
    got: list[Any],
    want: list[Any],
    half: bool = False,
    step: float | None = None,
    notes: list[str] | None = None,
) -> str:
    """This corpus' rule on ``wild_corpus.compare``: rtol = atol = 1e-3 (1e-2 in a model that
    computes in float16 anywhere, ``half``, and in any 16-bit output), the quantization-step
    allowance of a quantized model (``step``), labels compared exactly."""
    tol = 1e-2 if half else 1e-3
    return compare(got, want, tol, tol, narrow=1e-2, step=step, notes=notes, ties=False)


def run_one(path: str, seed: int = 0) -> dict[str, Any]:
    """One model, in this process: its domain class and outcome."""
    import onnx
    import onnxruntime as ort

    if not os.path.exists(path):
        return {"status": "skipped", "reason": "absent from the snapshot (a large blob)"}
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as e:
        return {"status": "skipped", "reason": f"onnx.load: {str(e).splitlines()[0][:90]}"}
    cls = classify(model)
    out: dict[str, Any] = {"class": cls}
    if not model.graph.output:
        return {**out, "status": "skipped", "reason": "the graph has no outputs"}
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    failed = ""
    for symbolic, high in FEED_TRIES:  # inputs onnxruntime accepts, if any of these
        try:
            feeds = make_feeds(model, seed, symbolic, high)
        except ValueError as e:
            return {**out, "status": "skipped", "reason": str(e)[:100]}
        try:
            ref = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
            want = [_dense(w) for w in ref.run(None, feeds)]
            tries = 5 if _op_types(model) & RANDOM_OPS else 1  # two runs may agree by luck
            agains = [[_dense(w) for w in ref.run(None, feeds)] for _ in range(tries)]
            failed = ""
            break
        except Exception as e:
            failed = failed or str(e).strip().splitlines()[0][:100]
            if "Load model" in failed or "INVALID_GRAPH" in failed:
                break  # the model itself, not the inputs
    if failed:
        return {**out, "status": "ort-fails", "reason": failed}
    if any(_compare(again, want) for again in agains):
        return {**out, "status": "ort-random", "reason": "two onnxruntime runs differ"}
    import anychip

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sess = anychip.load(path, devices=["cpu"])
            got = sess.run(None, feeds)
    except anychip.AnychipError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return {**out, "status": "anychip-error", "reason": f"{type(e).__name__}: {first[:110]}"}
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return {
            **out,
            "status": "anychip-error",
            "reason": f"raw {type(e).__name__}: {first[:100]}",
        }
    notes: list[str] = []
    why = _compare(list(got), list(want), narrow_floats(model), quant_step(model), notes)
    status = "mismatch" if why else "pass"
    return {**out, "status": status, "reason": why or "; ".join(notes)[:150]}


def _in_subprocess(path: str, seed: int, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", path, "--seed", str(seed)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "crash", "reason": f"timeout after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"status": "crash", "reason": f"exit {proc.returncode}: {tail[:100]}"}


def _class_of(path: str) -> str | None:
    """The domain class of the model at ``path``; None when it is absent or unreadable."""
    import onnx

    try:
        return classify(onnx.load(path, load_external_data=False))
    except Exception:
        return None


def _rates(rows: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    rates = {}
    for cls in ("standard", "contrib"):
        scored = [r for r in rows if r.get("class") == cls and r["status"] in SCORED]
        rates[cls] = (sum(r["status"] == "pass" for r in scored), len(scored))
    return rates


SCORED = ("pass", "mismatch", "anychip-error", "crash")


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown summary: rates by class, then every non-pass row by status."""
    lines = ["| class | pass | scored | rate |", "|---|---|---|---|"]
    for cls, (ok, n) in _rates(rows).items():
        lines.append(f"| {cls} | {ok} | {n} | {100 * ok / max(n, 1):.1f}% |")
    counts = Counter(r["status"] for r in rows)
    lines.append("")
    lines.append("Outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    lines.append("")
    lines.append("| model | class | status | cause |")
    lines.append("|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["status"], r.get("class", ""), r["model"])):
        if r["status"] != "pass" or r.get("reason"):
            cause = r.get("reason", "").replace("|", "/")
            lines.append(f"| {r['model']} | {r.get('class', '?')} | {r['status']} | {cause} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("git_dir", nargs="?")
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--sample", type=int, default=0, help="a seeded random sample of N models")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--jobs", type=int, default=1, help="models run at once")
    ap.add_argument("--only", default="", help="models whose path contains this")
    ap.add_argument(
        "--class",
        dest="cls",
        choices=("standard", "contrib"),
        help="only the models of this domain class (read in this process first)",
    )
    ap.add_argument("--scratch", default=os.path.join(tempfile.gettempdir(), "wild-ortdata"))
    ap.add_argument("--md", help="write the table here")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--rerun", help="rows of an earlier --json: run again those of --statuses")
    ap.add_argument("--statuses", default="mismatch,anychip-error,crash,ort-fails")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, args.seed)))
        return 0
    kept: list[dict[str, Any]] = []
    if args.rerun:
        with open(args.rerun) as f:
            earlier = json.load(f)
        again = set(args.statuses.split(","))
        redo = [r["status"] in again and args.only in r["model"] for r in earlier]
        kept = [r for r, x in zip(earlier, redo) if not x]
        paths = [f"{TESTDATA}/{r['model']}" for r, x in zip(earlier, redo) if x]
    elif not args.git_dir:
        ap.error("GIT_DIR is required")
    else:
        paths = extract(args.git_dir, args.rev, args.scratch)
    paths = [p for p in paths if args.only in p]
    if args.cls:
        paths = [p for p in paths if _class_of(os.path.join(args.scratch, p)) == args.cls]
    if args.sample:
        paths = sorted(random.Random(args.seed).sample(paths, min(args.sample, len(paths))))
    rows = list(kept)

    def one(rel: str) -> dict[str, Any]:
        path = os.path.join(args.scratch, rel)
        row = _in_subprocess(path, args.seed, args.timeout)
        row["model"] = rel[len(TESTDATA) + 1 :]
        if "class" not in row and os.path.exists(path):  # a crash: classed here, scored
            import onnx

            try:
                row["class"] = classify(onnx.load(path, load_external_data=False))
            except Exception:
                pass
        return row

    with ThreadPoolExecutor(args.jobs) as pool:
        for i, row in enumerate(pool.map(one, paths)):
            rows.append(row)
            print(
                f"[{i + 1}/{len(paths)}] {row['status']:13} {row['model']} {row.get('reason', '')}"
            )
            sys.stdout.flush()
    text = table(rows)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
