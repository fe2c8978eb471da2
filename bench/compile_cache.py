"""Cold against warm load of graph-mode partitions: each round a fresh process with an empty
compile cache (it compiles and stores), then fresh processes that find the executables on
disk. Per model on ``npu,cpu`` (graph-mode partitions compiled at load or at the first run of
a signature, ``background_compile=False``): load + first run, the partitions' own compile or
load seconds, CPU seconds, and the NPU's compile and load counts; medians over the rounds.

    python bench/compile_cache.py [--rounds 5] [--warm 2] [--only resnet50,hf_bert]

``resnet50`` is the light ResNet-50 of ``zoo.py`` (seeded weights, 100 MB, all on the NPU),
``hf_bert`` the tiny Hugging Face BERT of tests/data at length 16. The cache folder of a round
keeps the host's C kernels (built once, before the first round): only ``compiled/`` is
emptied, so "cold" is the graph-mode compile alone. (An older anychip, without
``compiler.STATS``, shows ``?`` counts: ``PYTHONPATH=<its copy> python bench/compile_cache.py``
compares revisions.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, sys, time
import numpy as np
t_import = time.perf_counter()
import anychip
import anychip.core.compile.cache as cache
import anychip.core.compile.specialize as specialize
from anychip.backends.npu_stub import compiler

spent = [0.0]


def timed(fn):
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t
    return run


# the partitions' own time: compile (+ store) or load, in either path
import anychip.core.compile.pipeline as pipeline
pipeline.compile_graph_cached = timed(pipeline.compile_graph_cached)
specialize.SpecializedPartition._compile = timed(specialize.SpecializedPartition._compile)
path, feeds = sys.argv[1], np.load(sys.argv[2])
feeds = {k: feeds[k] for k in feeds.files}
t0, c0 = time.perf_counter(), time.process_time()
sess = anychip.load(path, devices=["npu", "cpu"], cost_model=False, background_compile=False)
sess.run(None, feeds)
t1, c1 = time.perf_counter(), time.process_time()
print(json.dumps({"wall": t1 - t0, "cpu": c1 - c0, "partitions": spent[0],
                  "stats": getattr(compiler, "STATS", {"compiles": "?", "loads": "?"}),
                  "placed": sess.placement().by_device()}))
"""


def _models(folder: Path) -> dict[str, tuple[str, str]]:
    """name -> (model path, feeds .npz path)."""
    import numpy as np

    from anychip.zoo import light_model

    resnet = folder / "resnet50.onnx"
    resnet.write_bytes(light_model("resnet50", seed=0).SerializeToString())
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.savez(folder / "resnet50.npz", **{"gpu_0/data_0": x})
    rng = np.random.default_rng(16)
    mask = np.ones((1, 16), np.int64)
    mask[0, -2:] = 0
    ids = rng.integers(0, 128, (1, 16)).astype(np.int64)
    np.savez(folder / "hf_bert.npz", input_ids=ids, attention_mask=mask)
    bert = str(HERE.parent / "tests" / "data" / "hf_bert_tiny.onnx")
    return {
        "resnet50": (str(resnet), str(folder / "resnet50.npz")),
        "hf_bert": (bert, str(folder / "hf_bert.npz")),
    }


def _process(model: str, feeds: str, cache: Path) -> dict:
    env = {**os.environ, "ANYCHIP_CACHE_DIR": str(cache), "ANYCHIP_COMPILE_CACHE": "1"}
    env.setdefault("ANYCHIP_CALIBRATION", "off")
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, model, feeds],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warm", type=int, default=2, help="warm processes per round")
    ap.add_argument("--only", default="", help="comma-separated model names")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    folder = Path(tempfile.mkdtemp(prefix="anychip-bench-cache-"))
    try:
        print(
            f"{'model':<9} {'kind':<5} {'load+run':>9} {'cpu':>7} {'partitions':>10}  "
            "npu compiles/loads per process"
        )
        for name, (model, feeds) in _models(folder).items():
            if only and name not in only:
                continue
            cache = folder / f"cache-{name}"
            _process(model, feeds, cache)  # builds the host's C kernels once
            rows: dict[str, list[dict]] = {"cold": [], "warm": []}
            for _ in range(args.rounds):
                shutil.rmtree(cache / "compiled", ignore_errors=True)
                rows["cold"].append(_process(model, feeds, cache))
                for _ in range(args.warm):
                    rows["warm"].append(_process(model, feeds, cache))
            for kind, rs in rows.items():
                med = {
                    k: statistics.median(r[k] for r in rs) for k in ("wall", "cpu", "partitions")
                }
                counts = sorted({(r["stats"]["compiles"], r["stats"]["loads"]) for r in rs})
                print(
                    f"{name:<9} {kind:<5} {med['wall']:8.3f}s {med['cpu']:6.3f}s "
                    f"{med['partitions']:9.3f}s  {counts}"
                )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
