"""Models from the wild, made at run time from packages (no downloads), run on anychip and
onnxruntime: a table by source with counts (pass / refused with reason / fail) and time ratios.

    python bench/wild_corpus.py [--full] [--repeat 20] [--source scikit-learn] [--verbose]

Sources: ``quantized`` (onnxruntime.quantization: quantize_static QDQ and QOperator, u8s8 and
s8s8, per tensor and per channel, and quantize_dynamic), ``scikit-learn`` (skl2onnx
conversions of the common estimators), ``contrib-transformer`` (onnxruntime's transformer
optimizer fusing BERT encoders into com.microsoft ops), ``old-exporter`` (the structural
problems onnxruntime tolerates). Correctness is checked against onnxruntime with its graph
optimizations off (the model as written; its optimized integer kernels may land one
quantization step apart); time ratios are anychip / onnxruntime with its default
optimizations (below 1: anychip is faster), by phase: the load, the first run, the median of
runs 2-10 and the steady time (interleaved, best of ``--repeat``).
``--full`` adds bigger variants (more trees, rows and layers).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import anychip
from anychip.cli.bench import geomean
from bench._wild_cases import old_exporter_cases, quantized_cases, transformer_cases
from bench._wild_sklearn import sklearn_cases

__all__ = ["Case", "Result", "PHASES", "all_cases", "compare", "phase_ratios", "run_case", "main"]


@dataclass
class Case:
    """One model of the corpus: ``build()`` gives the model and its feeds."""

    source: str
    name: str
    build: Callable[[], tuple[onnx.ModelProto, dict[str, Any]]]
    rtol: float = 1e-4
    atol: float = 1e-4


@dataclass
class Result:
    case: Case
    status: str  # pass, fail, refused (by anychip), skipped (not made, or onnxruntime refuses)
    reason: str = ""
    ratio: float | None = None
    ort_optimized_diff: float | None = None
    extra: dict = field(default_factory=dict)


def all_cases(full: bool = False) -> Iterator[Case]:
    for source, gen in (
        ("quantized", quantized_cases),
        ("scikit-learn", sklearn_cases),
        ("contrib-transformer", transformer_cases),
        ("old-exporter", old_exporter_cases),
    ):
        for name, build, tol in gen(full):
            yield Case(source, name, build, *tol)


def _ort(model: onnx.ModelProto, optimized: bool) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if not optimized:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _max_diff(got: list[Any], want: list[Any]) -> float:
    worst = 0.0
    for g, w in zip(got, want):
        if isinstance(w, list):
            g = [list(m.values()) for m in g]
            w = [list(m.values()) for m in w]
        g, w = np.asarray(g), np.asarray(w)
        if w.dtype.kind in "fc" and g.shape == w.shape and w.size:
            worst = max(worst, float(np.nanmax(np.abs(g.astype(np.float64) - w))))
    return worst


def compare(
    got: list[Any],
    want: list[Any],
    rtol: float,
    atol: float,
    *,
    narrow: float | None = None,
    step: float | None = None,
    notes: list[str] | None = None,
    ties: bool = True,
) -> str:
    """'' when ``got`` matches ``want`` within tolerance, else what differs.

    ``narrow``: the rtol = atol of outputs in a 16-bit float (else ``rtol``, ``atol``).
    ``step``: the model's largest quantization scale; then up to 1% of an output's elements
    may be one step apart (1 in an integer output), each such output noted in ``notes``.
    ``ties``: a label that differs where onnxruntime's two best class scores (a later
    output) are within ``atol`` is a tie float rounding decides, not a difference.
    """
    if len(got) != len(want):
        return f"{len(got)} outputs, onnxruntime {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if isinstance(w, list):
            if not isinstance(g, list) or len(g) != len(w):
                return f"output {i}: a sequence of {len(w)} expected"
            if w and isinstance(w[0], dict):
                if any(list(a) != list(b) for a, b in zip(g, w)):
                    return f"output {i}: map keys differ"
                g = [list(m.values()) for m in g]
                w = [list(m.values()) for m in w]
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            return f"output {i}: shape {g.shape}, onnxruntime {w.shape}"
        if w.dtype.kind in "OUSb" or (w.dtype.kind in "iu" and step is None):
            differ = np.asarray(g != w).reshape(len(w) if w.ndim else 1, -1)
            rows = np.nonzero(differ.any(axis=1))[0]
            if rows.size and not (ties and _ties(rows, want, atol)):
                return f"output {i}: {int(differ.sum())} of {w.size} values differ"
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        if w.dtype.kind in "iu":
            off, one_step = g64 != w64, 1.0
        else:
            r, a = (
                (narrow, narrow) if narrow is not None and w.dtype.itemsize <= 2 else (rtol, atol)
            )
            off = ~np.isclose(g64, w64, rtol=r, atol=a, equal_nan=True)
            one_step = (step or 0.0) * 1.01 + a
        diff = np.where(off, np.abs(g64 - w64), 0.0)
        n_off = int(np.count_nonzero(off))
        if not n_off:
            continue
        if step is not None and n_off <= 0.01 * w.size and diff.max() <= one_step:
            if notes is not None:
                notes.append(f"output {i}: {n_off} of {w.size} one quantization step apart")
            continue
        return f"output {i}: {n_off} of {w.size} differ, max |diff| {np.nanmax(diff):.3g}"
    return ""


def _ties(rows: np.ndarray, want: list[Any], atol: float) -> bool:
    """Whether every row where a label differs has its two best class scores (onnxruntime's,
    in a later output) within ``atol``: a tie that float rounding decides (onnxruntime sums
    a forest's trees in an order that depends on its thread count)."""
    for w in want[1:]:
        scores = [list(m.values()) for m in w] if isinstance(w, list) else w
        scores = np.asarray(scores, dtype=np.float64)
        if scores.ndim != 2 or scores.shape[1] < 2 or len(scores) <= rows.max():
            continue
        top = np.sort(scores[rows], axis=1)[:, -2:]
        return bool(np.all(top[:, 1] - top[:, 0] <= atol))
    return False


def run_case(case: Case, repeat: int = 0) -> Result:
    """Run ``case`` on onnxruntime and anychip; time both (interleaved) when ``repeat``."""
    try:
        model, feeds = case.build()
    except Exception as e:
        return Result(case, "skipped", f"not made: {type(e).__name__}: {str(e)[:70]}")
    try:
        ref = _ort(model, optimized=False)
        want = ref.run(None, feeds)
    except Exception as e:
        return Result(case, "skipped", f"onnxruntime: {str(e).splitlines()[0][:80]}")
    try:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sess = anychip.load(model, devices=["cpu"])
        t1 = time.perf_counter()
        got = sess.run(None, feeds)
        t2 = time.perf_counter()
    except anychip.AnychipError as e:
        return Result(case, "refused", f"{type(e).__name__}: {str(e).splitlines()[0][:90]}")
    except Exception as e:
        return Result(case, "fail", f"raw {type(e).__name__}: {str(e)[:90]}")
    why = compare(got, want, case.rtol, case.atol)
    if why:
        return Result(case, "fail", why)
    result = Result(case, "pass")
    t3 = time.perf_counter()
    opt = _ort(model, optimized=True)
    t4 = time.perf_counter()
    ort_got = opt.run(None, feeds)
    t5 = time.perf_counter()
    result.ort_optimized_diff = _max_diff(got, ort_got)
    if repeat:
        ours, theirs = (lambda: sess.run(None, feeds)), (lambda: opt.run(None, feeds))
        phases = {"load": (t1 - t0, t4 - t3), "first": (t2 - t1, t5 - t4)}
        phases["2-10"] = _early_runs(ours, theirs, 9)
        phases["steady"] = _interleaved(ours, theirs, repeat)
        result.extra["phases"] = phases
        result.ratio = phases["steady"][0] / phases["steady"][1]
    return result


def _early_runs(a: Callable[[], Any], b: Callable[[], Any], n: int) -> tuple[float, float]:
    """The median of runs 2 to ``n + 1`` of ``a`` and of ``b`` (alternated): the time a new
    user sees before any warm-up."""
    ta, tb = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        a()
        t1 = time.perf_counter()
        b()
        t2 = time.perf_counter()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
    return float(np.median(ta)), float(np.median(tb))


def _interleaved(a: Callable[[], Any], b: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """Best-of-``repeat`` times of ``a`` and ``b``, the two alternating after a warm-up."""
    a(), b()
    ta, tb = math.inf, math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        a()
        t1 = time.perf_counter()
        b()
        t2 = time.perf_counter()
        ta, tb = min(ta, t1 - t0), min(tb, t2 - t1)
    return ta, tb


#: the timed phases, each a geomean of anychip / onnxruntime over a source's passing models
PHASES = ("load", "first", "2-10", "steady")


def phase_ratios(results: list[Result], phase: str) -> list[float]:
    """anychip / onnxruntime in ``phase`` for each result timed."""
    out = []
    for r in results:
        times = r.extra.get("phases", {}).get(phase)
        if times is not None and times[1] > 0:
            out.append(times[0] / times[1])
    return out


def table(results: list[Result]) -> str:
    """Counts and time ratios by source (load, first run, the median of runs 2-10 and the
    steady best-of-``repeat``, each a geomean of anychip / onnxruntime), then every result
    that did not pass."""
    by_source: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        by_source[r.case.source].append(r)
    lines = [
        f"{'source':<20} {'models':>6} {'pass':>5} {'refused':>7} {'fail':>5} {'skipped':>7}"
        + "".join(f" {p:>7}" for p in PHASES)
        + f" {'max':>7}  slowest"
    ]
    for source, rs in by_source.items():
        count = defaultdict(int)
        for r in rs:
            count[r.status] += 1
        timed = [r for r in rs if r.ratio is not None]
        ratios = [r.ratio for r in timed]
        slowest = max(timed, key=lambda r: r.ratio).case.name if timed else ""
        lines.append(
            f"{source:<20} {len(rs):>6} {count['pass']:>5} {count['refused']:>7} "
            f"{count['fail']:>5} {count['skipped']:>7}"
            + "".join(f" {geomean(phase_ratios(timed, p)):>6.2f}x" for p in PHASES)
            + f" {max(ratios, default=float('nan')):>6.2f}x  {slowest}"
        )
    for r in results:
        if r.status != "pass":
            lines.append(f"  {r.status:<8} {r.case.source}/{r.case.name}: {r.reason}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="add the bigger variants")
    ap.add_argument("--repeat", type=int, default=20, help="timed runs per runtime (0: none)")
    ap.add_argument("--source", default="", help="only this source")
    ap.add_argument("--verbose", action="store_true", help="one line per model")
    args = ap.parse_args(argv)
    results = []
    for case in all_cases(args.full):
        if args.source and case.source != args.source:
            continue
        r = run_case(case, args.repeat)
        results.append(r)
        if args.verbose:
            ratio = (
                " ".join(f"{x:.2f}x" for x in (phase_ratios([r], p)[0] for p in PHASES))
                if r.ratio is not None
                else ""
            )
            opt = f"{r.ort_optimized_diff:.2g}" if r.ort_optimized_diff is not None else ""
            print(f"{case.source:<20} {case.name:<36} {r.status:<8} {ratio:>7} {opt:>8} {r.reason}")
    print(table(results))


if __name__ == "__main__":
    main()
