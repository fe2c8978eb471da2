"""``anychip bench MODEL... --against onnxruntime [openvino]``: anychip beside its peers.

Each MODEL (an ``.onnx`` path, or a name: one of onnx's light models, or with the repository's
``bench/`` folder at hand one of ``bench/cpu_models.py``) is loaded by every engine; after
``--warmup`` runs each (``WARMUP`` by default: past anychip's thread choice, below),
``--runs`` rounds run every engine in turn, in a new seeded order each round, and each
engine's timed run comes right after an untimed one of its own (a rotating order kept each
engine's predecessor every round, and threads a peer leaves spinning after its run slowed
whichever engine ran next), and the median of each engine's times is reported with the ratio
anychip/peer (below 1: anychip is faster) and the largest absolute difference of anychip's
outputs from the peer's. ``--threads N`` gives every engine N threads: onnxruntime's
intra-op pool, OpenVINO's ``INFERENCE_NUM_THREADS``, and anychip's BLAS and OpenMP pools
through threadpoolctl (the ``bench`` extra). ``--cpu-time`` times each run by the process's
CPU time (every thread's) instead of the wall clock: on a shared, loaded machine the waits
for a core are then not counted. The peers run with all their graph optimizations
(onnxruntime ``ORT_ENABLE_ALL``; OpenVINO CPU in f32 precision). Each engine's load of the
model and its first run are timed too, once each, on the wall clock (``load_ms``,
``first_run_ms``; a line under the table gives their sum's geomean ratio): what a process
that runs a model a few times pays, and where anychip's lazy work shows (its primitives and
generated code are made on the first run; its calibration and compiled code are cached on
disk, so a second process loads faster than the first).

At two or more threads an anychip session runs its runs 21 to 23 on one thread and measures
one thread against the threads given in its runs 24 to 31 (and 32 to 39 when one thread won
the first probe; ``backends/cpu/thread_choice.py``); the first three on one thread are its
slowest (they build one thread's primitives and record its replay). A warm-up of 2 left
them in the timed rounds: the bench's LSTM at two threads read 1.74 and 1.81 against
onnxruntime in two runs of 40 rounds (0.59-0.61 ms against 0.34) where every run after the
probe took 0.35-0.39 ms; with this warm-up, 0.76-1.16 in four whole tables. Every engine gets
the same warm-up; the choice each model's session made is in its row (``anychip_threads``),
and under the table where it chose one thread.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from anychip.cli.concurrency import percentiles
from anychip.errors import AnychipError, ModelError

__all__ = ["add_parser", "command", "bench_models", "resolve_model", "PEERS", "WARMUP", "geomean"]

PEERS = ("onnxruntime", "openvino")
#: Untimed runs of every engine before the timed rounds: past anychip's thread choice, which
#: runs ``START`` warm runs, ``ONE_WARM`` on one thread and two probes of ``PROBE`` runs a side
#: at most before it settles (``tests/test_bench_cli.py`` checks the sum: 20 + 7 + 16 = 43).
WARMUP = 45
Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


def add_parser(sub: Any) -> None:
    """Add the ``bench`` subcommand to the ``anychip`` parser's subparsers."""
    p = sub.add_parser("bench", help="time models on anychip beside onnxruntime / OpenVINO")
    p.add_argument("models", nargs="+", metavar="MODEL", help="an .onnx path or a model name")
    p.add_argument("--against", nargs="+", choices=PEERS, default=["onnxruntime"])
    p.add_argument("--devices", default="cpu", help="anychip's devices, e.g. cpu or npu,cpu")
    p.add_argument("--threads", type=int, default=None, help="threads of every engine")
    p.add_argument("--runs", type=int, default=10, help="interleaved rounds (medians)")
    p.add_argument("--warmup", type=int, default=WARMUP, help="untimed runs of each engine first")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="anychip's precision policy; with bf16, OpenVINO runs at its bf16 hint too "
        "(onnxruntime stays f32: the differences are then each output's error against f32)",
    )
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="time each run by the process's CPU time (every thread's), not the wall clock",
    )
    p.add_argument(
        "--json",
        dest="json_out",
        nargs="?",
        const="-",
        metavar="FILE",
        help="the results as JSON: on stdout instead of the table, or written to FILE",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress")


def command(args: argparse.Namespace) -> int:
    """Run the benchmark; print the table; 0 when every model ran."""
    if args.runs < 1 or args.warmup < 0:
        raise AnychipError("--runs must be >= 1 and --warmup >= 0")
    if args.threads is not None and args.threads < 1:
        raise AnychipError(f"--threads must be >= 1, got {args.threads}")
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    result = bench_models(
        args.models,
        peers=list(dict.fromkeys(args.against)),
        devices=devices,
        threads=args.threads,
        runs=args.runs,
        warmup=args.warmup,
        seed=args.seed,
        log=None if args.quiet else _stderr_line,
        cpu_time=args.cpu_time,
        precision=args.precision,
    )
    if args.json_out == "-":
        print(json.dumps(result, indent=1))
        return 0
    print(format_table(result))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


def _stderr_line(text: str) -> None:
    if not sys.stderr.isatty():  # a terminal shows rich's bars instead
        print(text, file=sys.stderr, flush=True)


# -- models -------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _model_set() -> Any | None:
    """``bench/cpu_models.py`` of the repository anychip runs from, or None (a wheel)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # cli/ -> the package
    here = os.path.join(root, "bench", "cpu_models.py")
    if not os.path.exists(here):
        return None
    spec = importlib.util.spec_from_file_location("anychip_bench_cpu_models", here)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def resolve_model(model: str, seed: int = 0) -> tuple[bytes, dict[str, np.ndarray] | None]:
    """The serialized model ``model`` names and its inputs (None: random ones are made)."""
    from anychip.zoo import LIGHT_MODELS, light_model

    if model.endswith(".onnx") or os.path.sep in model:
        if not os.path.isfile(model):
            raise ModelError(f"no model file {model!r}")
        with open(model, "rb") as f:
            return f.read(), None
    models = _model_set()
    if models is not None and model in models.MODELS:
        proto, feeds = models.build(model)
        return proto.SerializeToString(), feeds
    if model in LIGHT_MODELS:
        return light_model(model, seed).SerializeToString(), None  # type: ignore[attr-defined]
    names = sorted(models.MODELS) if models is not None else list(LIGHT_MODELS)
    raise ModelError(f"unknown model {model!r}: give an .onnx path or one of {', '.join(names)}")


# -- engines ------------------------------------------------------------------------------------
def _anychip(path: str, devices: list[str], precision: str = "fp32") -> tuple[Runner, Any]:
    import anychip

    sess = anychip.load(path, devices=devices, precision=precision)
    return (lambda feeds: sess.run(None, feeds)), sess


def _onnxruntime(path: str, threads: int | None) -> Runner:
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise AnychipError(
            "--against onnxruntime needs onnxruntime: pip install onnxruntime"
        ) from e
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    # Its pool's threads would spin after each run and take the cores from the next engine.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads is not None:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, feeds)


def _openvino(path: str, threads: int | None, precision: str = "fp32") -> Runner:
    try:
        import openvino as ov
    except ImportError as e:
        raise AnychipError(
            "--against openvino needs OpenVINO: pip install 'anychip[bench]' (or openvino)"
        ) from e
    hint = "bf16" if precision == "bf16" else "f32"
    config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY"}
    if threads is not None:
        config["INFERENCE_NUM_THREADS"] = threads
    compiled = ov.Core().compile_model(path, "CPU", config)
    request = compiled.create_infer_request()
    count = len(compiled.outputs)

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        request.infer(feeds)
        return [request.get_output_tensor(i).data.copy() for i in range(count)]

    return run


@contextlib.contextmanager
def _thread_limit(threads: int | None) -> Iterator[None]:
    """anychip's threads: BLAS and OpenMP pools limited to ``threads`` inside the block."""
    if threads is None:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError as e:
        raise AnychipError("--threads needs threadpoolctl: pip install 'anychip[bench]'") from e
    # threadpoolctl limits the pools of libraries already loaded: load oneDNN (and with it the
    # OpenMP runtime its kernels use) first, or its team keeps every core.
    from anychip.backends.cpu.onednn import _lib

    _lib.available()
    with threadpool_limits(limits=threads):
        yield


# -- the measurement ----------------------------------------------------------------------------
def _max_diff(ours: Sequence[Any], theirs: Sequence[Any]) -> float:
    """The largest absolute difference over the outputs (NaN where shapes differ)."""
    worst = 0.0
    for a, b in zip(ours, theirs):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return math.nan
        if a.size == 0:
            continue
        if a.dtype.kind in "fciub" and b.dtype.kind in "fciub":
            d = np.abs(a.astype(np.float64) - b.astype(np.float64))
            both_nan = np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64))
            worst = max(worst, float(np.max(np.where(both_nan, 0.0, d))))
        elif not np.array_equal(a, b):
            return math.inf
    return worst


def _time_model(
    engines: dict[str, Runner], feeds: dict, runs: int, warmup: int, cpu_time: bool = False
) -> dict:
    """Medians (ms) of interleaved runs of every engine, and outputs' differences.
    ``cpu_time``: the process's CPU time per run (all its threads: a loaded machine's waits
    are not counted, a spinning pool's threads are), else the wall clock."""
    clock = time.process_time if cpu_time else time.perf_counter
    from anychip.core.progress import task

    names = list(engines)
    outputs, first = {}, {}
    for k in names:  # the first run: also the compared outputs
        t0 = time.perf_counter()
        outputs[k] = engines[k](feeds)
        first[k] = (time.perf_counter() - t0) * 1e3
    for _ in range(warmup):
        for k in names:
            engines[k](feeds)
    times: dict[str, list[float]] = {k: [] for k in names}
    with task(f"{runs} rounds", total=runs) as advance:
        for r in range(runs):
            for k in random.Random(r).sample(names, len(names)):
                engines[k](feeds)  # untimed: what the engine before left running settles here
                t0 = clock()
                engines[k](feeds)
                times[k].append(clock() - t0)
            advance(1)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    peers = [k for k in names if k != "anychip"]
    tail = {k: percentiles(v) for k, v in times.items()}  # p50/p90/p99 of the rounds
    return {
        "ms": ms,
        "p90_ms": {k: t["p90_ms"] for k, t in tail.items()},
        "p99_ms": {k: t["p99_ms"] for k, t in tail.items()},
        "first_run_ms": first,
        "ratio": {p: ms["anychip"] / ms[p] for p in peers},
        "max_abs_diff": {p: _max_diff(outputs["anychip"], outputs[p]) for p in peers},
    }


def bench_models(
    models: Sequence[str],
    peers: Sequence[str] = ("onnxruntime",),
    devices: Sequence[str] = ("cpu",),
    threads: int | None = None,
    runs: int = 10,
    warmup: int = WARMUP,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
    cpu_time: bool = False,
    precision: str = "fp32",
) -> dict:
    """Time every model on anychip and ``peers``; the results as a JSON-ready dict.
    ``precision``: anychip's policy, and OpenVINO's hint (onnxruntime runs float32)."""
    from anychip.core.api.feeds import random_feeds
    from anychip.core.progress import task

    makers = {"onnxruntime": _onnxruntime, "openvino": _openvino}
    rows = []
    with (
        _thread_limit(threads),
        tempfile.TemporaryDirectory() as tmp,
        task("models", total=len(models)) as advance,
    ):
        for i, name in enumerate(models):
            data, feeds = resolve_model(name, seed)
            path = os.path.join(tmp, f"model{i}.onnx")
            with open(path, "wb") as f:
                f.write(data)
            load = {}
            t0 = time.perf_counter()
            ours, sess = _anychip(path, list(devices), precision)
            load["anychip"] = (time.perf_counter() - t0) * 1e3
            engines = {"anychip": ours}
            for p in peers:
                t0 = time.perf_counter()
                engines[p] = (
                    _openvino(path, threads, precision)
                    if p == "openvino"
                    else makers[p](path, threads)
                )
                load[p] = (time.perf_counter() - t0) * 1e3
            if feeds is None:
                feeds = random_feeds(sess, seed)
            row = {"model": os.path.basename(name)}
            row.update(_time_model(engines, feeds, runs, warmup, cpu_time))
            row["load_ms"] = load
            row["anychip_threads"] = _thread_notes(sess)
            rows.append(row)
            advance(1)
            if log is not None:
                log(f"[{i + 1}/{len(models)}] {row['model']}: {_ratios_text(row)}")
    geo = {p: geomean([r["ratio"][p] for r in rows]) for p in peers}
    cold = {p: geomean([_cold(r, "anychip") / _cold(r, p) for r in rows]) for p in peers}
    return {
        "devices": list(devices),
        "threads": threads,
        "runs": runs,
        "warmup": warmup,
        "clock": "process CPU time" if cpu_time else "wall",
        "precision": precision,
        "peers": list(peers),
        "models": rows,
        "geomean_ratio": geo,
        "cold_geomean_ratio": cold,
    }


def _cold(row: dict, engine: str) -> float:
    """An engine's load and first run of the model in ``row`` (ms)."""
    return row["load_ms"][engine] + row["first_run_ms"][engine]


def geomean(values: Sequence[float]) -> float:
    """The geometric mean of ``values`` (NaN for none)."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def _thread_notes(sess: Any) -> list[str]:
    """What each CPU partition's thread choice measured and chose (empty while it has not
    decided, or at one thread)."""
    return [p.info["threads"] for p in sess.placement().partitions if "threads" in p.info]


def _ratios_text(row: dict) -> str:
    return ", ".join(f"anychip/{p} {r:.2f}" for p, r in row["ratio"].items())


def format_table(result: dict) -> str:
    """The results as a text table: ms per engine, ratios anychip/peer, max |diff|."""
    peers = result["peers"]
    head = ["model"] + [f"{p} ms" for p in peers] + ["anychip ms"]
    head += [f"/{p}" for p in peers] + [f"diff {p}" for p in peers]
    body = []
    for r in result["models"]:
        cells = [r["model"]] + [f"{r['ms'][p]:.2f}" for p in peers]
        cells += [f"{r['ms']['anychip']:.2f}"] + [f"{r['ratio'][p]:.2f}" for p in peers]
        body.append(cells + [f"{r['max_abs_diff'][p]:.1e}" for p in peers])
    geo = ["geomean"] + [""] * (len(peers) + 1)
    body.append(geo + [f"{result['geomean_ratio'][p]:.2f}" for p in peers] + [""] * len(peers))
    widths = [max(len(c[i]) for c in [head] + body) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(
        zip(cells, widths))) for cells in [head] + body]  # fmt: skip
    threads = result["threads"] if result["threads"] is not None else "default"
    lines.append(
        f"ratios anychip/peer (below 1: anychip faster); medians of {result['runs']} interleaved "
        f"rounds ({result.get('clock', 'wall')} clock); threads: {threads}; anychip devices: "
        f"{','.join(result['devices'])}; warm-up: {result['warmup']} runs each; precision: "
        f"{result.get('precision', 'fp32')}"
    )
    cold = result.get("cold_geomean_ratio")
    if cold:
        ratios = ", ".join(f"anychip/{p} {v:.2f}" for p, v in cold.items())
        lines.append(f"load + first run (one each, wall clock), geomean: {ratios}")
    for r in result["models"]:
        if "p99_ms" in r:
            tails = ", ".join(
                f"{k} {r['p90_ms'][k]:.2f}/{r['p99_ms'][k]:.2f}" for k in [*peers, "anychip"]
            )
            lines.append(f"  {r['model']}: p90/p99 ms {tails}")
    for r in result["models"]:
        notes = [n for n in r.get("anychip_threads", []) if n.startswith("1 of ")]
        lines += [f"  {r['model']}: anychip's threads {note}" for note in notes]
    return "\n".join(lines)
