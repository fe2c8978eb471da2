"""The OpenCL backend: GEMM GFLOP/s against numpy, program build times cold and warm, and a
per-model table (``opencl``, ``opencl,cpu``, ``cpu``, onnxruntime).

Run (numpy with its own OpenBLAS kernel choice)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/opencl.py [--rounds 7]
        [--threads N] [--skip gemm builds models attention copies]

``--cpu-time`` times with the process's CPU time instead of the wall clock: on a machine
shared with other work, with ``--threads 1``, it counts each contender's own work whatever
the scheduler does (with more threads, OpenBLAS's and onnxruntime's spinning threads count
too). ``--threads N`` runs everything with N threads on both sides (``POCL_MAX_PTHREAD_COUNT`` for
PoCL, ``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS`` for numpy, onnxruntime and the CPU
backend): with 1, the kernels are compared without the scheduler of a shared machine in the
figures.

Every figure is a median over rounds in which the contenders run interleaved (one sample of
each per round, after a pause of ``--cooldown`` seconds: OpenBLAS's, onnxruntime's and PoCL's
idle threads spin for a while after a call and would take a core from the next contender), so
load from other processes on a shared machine hits them alike; ratios are the medians'
ratios.

- GEMM: ``opencl`` is ``op_matmul.matmul`` on resident tensors (packing included) plus a queue
  ``finish``; numpy is ``a @ b``.
- Builds: every program family for float32, in a fresh process whose PoCL and pyopencl caches
  point at an empty folder (cold), then again in another process on the same folder (warm).
- Attention: the BERT-like and GPT-like layers on ``opencl`` with the attention fusion (one
  ``FusedAttention`` launch) against the same session loaded with
  ``ANYCHIP_DISABLED_PASSES=fuse_attention`` (the unfused MatMul, Div, Add, Softmax, MatMul),
  interleaved with onnxruntime.
- Copies: whether the device runs a copy beside a kernel (``driver/overlap.py``'s probe, on
  the device's clock), then a 768^3 MatMul on resident tensors followed by the upload of the
  next 16 MB input, with the upload on the compute queue or on the second queue
  (``ClDevice.use_copy_queue``), until both are done.
- Models: ``anychip.load(model, devices=...)`` with the measured cost model (calibration
  cached per machine, then run-time feedback; the feedback's trial runs happen before timing),
  and onnxruntime's CPU provider.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import anychip

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tests.models import transformer_layer

GEMM_SHAPES = [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (64, 768, 3072)]
CONFIGS = [["opencl"], ["opencl", "cpu"], ["cpu"]]

_BUILD_ALL = """
import json, time
from anychip.backends.opencl.driver import get_device
from anychip.backends.opencl.kernels import op_data, op_elementwise, op_matmul
from anychip.backends.opencl.kernels import op_normalization, op_pool, op_reduce
d = get_device(0)
fams = {"unary": op_elementwise._unary_source, "binary": op_elementwise._binary_source,
        "move": op_data._source, "reduce": op_reduce._source, "norm": op_normalization._source,
        "pool": op_pool._source, "gemm": op_matmul.source}
out = {}
for fam, src in fams.items():
    t = time.perf_counter()
    d.programs.program(fam, "uchar" if fam == "move" else "float", src)
    out[fam] = time.perf_counter() - t
print(json.dumps(out))
"""


#: the clock of every timing (``--cpu-time``: the process's CPU time)
CLOCK = time.perf_counter
#: seconds of pause before each sample (``--cooldown``)
COOLDOWN = 0.05


def _median_rounds(fns: dict, rounds: int) -> dict[str, float]:
    """Median seconds per contender, interleaved round by round (after one warm-up each)."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    order = random.Random(0)
    for _ in range(rounds):
        # A new order each round (seeded): PoCL's worker threads spin on for a while after a
        # launch and slow whichever contender runs next (oneDNN's two-thread team most), so no
        # contender may always follow the same one.
        order.shuffle(names)
        for name in names:
            fn = fns[name]
            time.sleep(COOLDOWN)  # idle worker threads of the one before spin for a while
            t0 = CLOCK()
            fn()
            samples[name].append(CLOCK() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def bench_gemm(rounds: int) -> None:
    from anychip.backends.opencl.driver import get_device
    from anychip.backends.opencl.kernels.op_matmul import matmul

    d = get_device(get_registry_index())
    print(f"GEMM float32 on {d.info.name} ({d.info.vendor}); medians of {rounds} rounds")
    print(f"{'M x K x N':<18} {'opencl GF/s':>11} {'numpy GF/s':>11} {'opencl/numpy':>13}")
    rng = np.random.default_rng(0)
    for m, k, n in GEMM_SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        ta, tb = d.upload(a), d.upload(b)

        def cl_run(ta=ta, tb=tb) -> None:
            y = matmul(ta, tb)
            d.finish()
            y.release()

        t = _median_rounds({"opencl": cl_run, "numpy": lambda a=a, b=b: a @ b}, rounds)
        flops = 2.0 * m * k * n
        g_cl, g_np = flops / t["opencl"] / 1e9, flops / t["numpy"] / 1e9
        print(f"{f'{m}x{k}x{n}':<18} {g_cl:>11.1f} {g_np:>11.1f} {g_cl / g_np:>13.2f}")
        ta.release()
        tb.release()


def get_registry_index() -> int:
    from anychip.core.plugin.host import get_registry

    return get_registry().backends["opencl"].index


def bench_builds() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, POCL_CACHE_DIR=os.path.join(tmp, "pocl"))
        env["ANYCHIP_OPENCL_CACHE_DIR"] = tmp
        os.makedirs(env["POCL_CACHE_DIR"])
        runs = []
        for _ in ("cold", "warm"):
            out = subprocess.run(
                [sys.executable, "-c", _BUILD_ALL], env=env, capture_output=True, text=True
            )
            if out.returncode:
                print("build benchmark failed:", out.stderr[-800:])
                return
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print("\nprogram builds, float32 (s): family, cold (empty caches), warm (disk caches)")
    for fam in runs[0]:
        print(f"  {fam:<8} {runs[0][fam]:>7.3f} {runs[1][fam]:>7.3f}")
    print(f"  {'total':<8} {sum(runs[0].values()):>7.3f} {sum(runs[1].values()):>7.3f}")


def _models() -> dict:
    from anychip.zoo import light_model

    rng = np.random.default_rng(0)
    resnet = light_model("resnet50")
    shape = [d.dim_value for d in resnet.graph.input[0].type.tensor_type.shape.dim]
    x_img = rng.standard_normal(shape).astype(np.float32)
    x_seq = rng.standard_normal((1, 64, 256)).astype(np.float32)
    return {
        "resnet50-light": (resnet, {resnet.graph.input[0].name: x_img}),
        "bert-layer": (transformer_layer(), {"x": x_seq}),
        "gpt-layer": (transformer_layer(causal=True), {"x": x_seq}),
    }


def _session_runner(model, feeds: dict, cfg: list[str]):
    # strict proves a single device runs everything; a device set is loaded as a user would
    # (strict turns off the feedback's trial placements, which correct the cost model)
    sess = anychip.load(model, devices=cfg, strict=len(cfg) == 1)
    for _ in range(60):  # the feedback's runs and trials first: then the placement holds
        sess.run(None, feeds)
        if sess.feedback is None or sess.feedback.done:
            break
    return sess, (lambda: sess.run(None, feeds))


def bench_models(rounds: int) -> None:
    import onnxruntime as ort

    print(f"\nmodels: median ms of {rounds} interleaved rounds; ratio = time / cpu's time")
    print(f"{'model':<16} {'config':<12} {'ms':>9} {'vs cpu':>7} {'max|diff|':>10}  placement")
    for name, (model, feeds) in _models().items():
        runners, sessions = {}, {}
        for cfg in CONFIGS:
            sessions[",".join(cfg)], runners[",".join(cfg)] = _session_runner(model, feeds, cfg)
        so = ort.SessionOptions()
        threads = os.environ.get("_ANYCHIP_BENCH_THREADS")
        so.intra_op_num_threads = int(threads) if threads else (os.cpu_count() or 1)
        ort_sess = ort.InferenceSession(model.SerializeToString(), so)
        runners["onnxruntime"] = lambda s=ort_sess, f=feeds: s.run(None, f)
        t = _median_rounds(runners, rounds)
        ref = ort_sess.run(None, feeds)[0]
        for key, sec in t.items():
            diff, where = "", ""
            if key in sessions:
                y = sessions[key].run(None, feeds)[0]
                diff = f"{float(np.abs(y - ref).max()):.2e}"
                where = ", ".join(
                    f"{d} {n}" for d, n in sessions[key].placement().by_device().items()
                )
            print(
                f"{name:<16} {key:<12} {sec * 1e3:>9.1f} {sec / t['cpu']:>7.2f} {diff:>10}  {where}"
            )
        for key, sess in sessions.items():
            if len(key.split(",")) > 1 and sess.feedback is not None:
                print(f"{'':<16} {key}: {sess.feedback.decision}")


def bench_attention(rounds: int) -> None:
    import onnxruntime as ort

    print(f"\nattention on opencl: median ms of {rounds} interleaved rounds")
    print(f"{'model':<12} {'fused':>8} {'unfused':>8} {'onnxruntime':>12} {'fused/unfused':>14}")
    x = np.random.default_rng(0).standard_normal((1, 64, 256)).astype(np.float32)
    for name, model in (
        ("bert-layer", transformer_layer()),
        ("gpt-layer", transformer_layer(causal=True)),
    ):
        fused = anychip.load(model, devices=["opencl"], strict=True)
        os.environ["ANYCHIP_DISABLED_PASSES"] = "fuse_attention"
        try:
            plain = anychip.load(model, devices=["opencl"], strict=True)
        finally:
            del os.environ["ANYCHIP_DISABLED_PASSES"]
        so = ort.SessionOptions()
        threads = os.environ.get("_ANYCHIP_BENCH_THREADS")
        so.intra_op_num_threads = int(threads) if threads else (os.cpu_count() or 1)
        ref = ort.InferenceSession(model.SerializeToString(), so)
        feeds = {"x": x}
        t = _median_rounds(
            {
                "fused": lambda s=fused, f=feeds: s.run(None, f),
                "unfused": lambda s=plain, f=feeds: s.run(None, f),
                "ort": lambda s=ref, f=feeds: s.run(None, f),
            },
            rounds,
        )
        ms = {k: v * 1e3 for k, v in t.items()}
        print(
            f"{name:<12} {ms['fused']:>8.2f} {ms['unfused']:>8.2f} {ms['ort']:>12.2f} "
            f"{t['fused'] / t['unfused']:>14.2f}"
        )


def bench_copies(rounds: int) -> None:
    import pyopencl as cl

    from anychip.backends.opencl.driver import get_device
    from anychip.backends.opencl.driver.overlap import copy_overlap
    from anychip.backends.opencl.kernels.op_matmul import matmul

    d = get_device(get_registry_index())
    probe = copy_overlap(d)
    print(
        f"\ncopies: the device overlaps a copy with a kernel: {probe['overlap']} (kernel "
        f"{probe['kernel_ms']:.1f} ms, 8 MB copy {probe['copy_ms']:.2f} ms, both at once "
        f"{probe['shared_ms']:.2f} ms)"
    )
    rng = np.random.default_rng(0)
    a = rng.standard_normal((768, 768)).astype(np.float32)
    nxt = rng.standard_normal(4 << 20).astype(np.float32)
    ta, tb = d.upload(a), d.upload(a)
    second = cl.CommandQueue(d.context, d.info.device)

    def step(queue) -> None:
        d.copy_queue = queue
        y = matmul(ta, tb)
        d.queue.flush()
        t = d.upload(nxt)
        d.finish()
        y.release()
        t.release()

    t = _median_rounds({"one": lambda: step(None), "two": lambda: step(second)}, rounds)
    d.copy_queue = None
    print(
        f"  MatMul 768^3 + upload of 16 MB: one queue {t['one'] * 1e3:.2f} ms, two queues "
        f"{t['two'] * 1e3:.2f} ms, two/one {t['two'] / t['one']:.2f}"
    )
    ta.release()
    tb.release()


def _with_threads(n: int) -> None:
    """Run this script again with ``n`` threads everywhere (set before any library starts)."""
    env = dict(os.environ, POCL_MAX_PTHREAD_COUNT=str(n), OPENBLAS_NUM_THREADS=str(n))
    env.update(OMP_NUM_THREADS=str(n), _ANYCHIP_BENCH_THREADS=str(n))
    argv = [a for a in sys.argv if a != "--threads" and a != str(n)]
    raise SystemExit(subprocess.call([sys.executable, *argv], env=env))


def main() -> None:
    global CLOCK, COOLDOWN
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--cpu-time", action="store_true")
    ap.add_argument("--cooldown", type=float, default=0.05)
    ap.add_argument(
        "--skip", nargs="*", default=[], choices=["gemm", "builds", "models", "attention", "copies"]
    )
    args = ap.parse_args()
    if args.threads and os.environ.get("_ANYCHIP_BENCH_THREADS") != str(args.threads):
        _with_threads(args.threads)
    COOLDOWN = args.cooldown
    if args.cpu_time:
        CLOCK = time.process_time
        print("clock: process CPU time")
    if os.environ.get("_ANYCHIP_BENCH_THREADS"):
        print(f"threads: {os.environ['_ANYCHIP_BENCH_THREADS']} (PoCL, OpenBLAS, OpenMP)")
    if "gemm" not in args.skip:
        bench_gemm(args.rounds * 2)
    if "builds" not in args.skip:
        bench_builds()
    if "copies" not in args.skip:
        bench_copies(args.rounds * 2)
    if "attention" not in args.skip:
        bench_attention(args.rounds * 2)
    if "models" not in args.skip:
        bench_models(args.rounds)


if __name__ == "__main__":
    main()
