"""Ray Data with one anychip session per actor against one plain anychip process, interleaved.

    python bench/ray_batch.py [--repeat 3] [--rows-resnet 48] [--rows-transformer 1024]
        [--block-resnet 4] [--block-transformer 64]

Per model (light ResNet-50 with seeded random weights, and a BERT-like encoder layer of
sequence 128, both with a fixed batch of 1, so every row is one run) and per trial, in turn:

- ``plain``: this process, BLAS pool of 2 threads: ``anychip.load`` then one ``Session.run``
  per row;
- ``1-thr``: the same with a BLAS pool of 1 thread: twice its rate is what two actors would
  reach with no cost at all (``ray/2x1thr``);
- ``ray``: ``BatchInference(concurrency=2, threads=1)`` over a data set already in Ray's object
  store (blocks of a few rows so both actors get work), ``materialize()``: actor start, model
  load, the runs, and the results back in the object store.

The figures are rows per second of wall time, ``with load`` including the model's load (the
plain process's ``anychip.load``; the actors' start and load) and ``steady`` from the first
row in to the last row out (the plain loop; the actors' first batch in to their last batch
out). ``ray/plain`` is the target (>= 0.90). Every prediction of the Ray run and of the 1-thread
run is compared with the 2-thread run's (max |difference|; 0 is identical). The local cluster
is started once (``ray.init(num_cpus=2)``), outside the timings. Medians over ``--repeat``
trials: the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import ray
from threadpoolctl import threadpool_limits

import anychip
from anychip.integrations.ray import BatchInference
from anychip.zoo import light_model

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tests.models import transformer_layer


def _models(args: argparse.Namespace) -> dict[str, tuple[bytes, np.ndarray, int]]:
    rng = np.random.default_rng(0)
    resnet = light_model("resnet50").SerializeToString()
    bert = transformer_layer(seq=128, hidden=256, heads=4, ffn=1024).SerializeToString()
    return {
        "resnet50": (
            resnet,
            rng.standard_normal((args.rows_resnet, 3, 224, 224), np.float32),
            args.block_resnet,
        ),
        "transformer": (
            bert,
            rng.standard_normal((args.rows_transformer, 128, 256), np.float32),
            args.block_transformer,
        ),
    }


def _plain(model: bytes, x: np.ndarray, threads: int) -> tuple[float, float, np.ndarray]:
    start = time.perf_counter()
    with threadpool_limits(threads):
        sess = anychip.load(model, ["cpu"])
        name = sess.get_inputs()[0].name
        first = time.perf_counter()
        ys = [sess.run(None, {name: x[i : i + 1]})[0] for i in range(len(x))]
    end = time.perf_counter()
    sess.close()
    return end - start, end - first, np.concatenate(ys)


def _ray(model: bytes, ds: ray.data.Dataset, rows: int) -> tuple[float, float, np.ndarray]:
    job = BatchInference(
        model,
        ["cpu"],
        concurrency=2,
        threads=1,
        batch_size=None,
        validate=None,
        inputs="data",
        keep_columns=["id"],
    )
    start = time.perf_counter()
    out = job.run(ds)
    seconds = time.perf_counter() - start
    batches = out.to_numpy_refs()
    parts = ray.get(batches)
    ids = np.concatenate([p["id"] for p in parts])
    y = np.concatenate([p[next(k for k in p if k != "id")] for p in parts])
    stats = job.stats()
    # first batch in to last batch out, over all actors: the start and the load left out
    worked = [s for s in stats if s.rows]
    steady = max(s.finished for s in worked) - min(s.started for s in worked)
    assert len(ids) == rows
    return seconds, steady, y[np.argsort(ids)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rows-resnet", type=int, default=48)
    ap.add_argument("--rows-transformer", type=int, default=1024)
    ap.add_argument("--block-resnet", type=int, default=4, help="rows per block and batch")
    ap.add_argument("--block-transformer", type=int, default=64, help="rows per block and batch")
    args = ap.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    print(
        f"{'model':<12} {'timing':<9} {'rows':>5} {'plain r/s':>9} {'ray r/s':>8} "
        f"{'ray/plain':>9} {'1-thr r/s':>9} {'ray/2x1thr':>10} {'max|diff|':>9}  "
        f"(medians of {args.repeat}; each trial's ray/plain)"
    )
    for name, (model, x, block) in _models(args).items():
        rows = len(x)
        items = [{"id": i, "data": x[i]} for i in range(rows)]
        ds = ray.data.from_items(items, override_num_blocks=rows // block).materialize()
        total, steady, diffs = [], [], []
        for _ in range(args.repeat):
            t_plain, s_plain, y_plain = _plain(model, x, 2)
            t_ray, s_ray, y_ray = _ray(model, ds, rows)
            t_one, s_one, y_one = _plain(model, x, 1)
            total.append((rows / t_plain, rows / t_ray, rows / t_one))
            steady.append((rows / s_plain, rows / s_ray, rows / s_one))
            diffs += [float(np.abs(y_ray - y_plain).max()), float(np.abs(y_one - y_plain).max())]
        for label, trials in (("with load", total), ("steady", steady)):
            ratios = [r / p for p, r, _ in trials]
            plain, fast, one = (statistics.median(t[i] for t in trials) for i in range(3))
            print(
                f"{name:<12} {label:<9} {rows:>5} {plain:>9.2f} {fast:>8.2f} "
                f"{statistics.median(ratios):>9.2f} {one:>9.2f} "
                f"{statistics.median(r / (2 * o) for _, r, o in trials):>10.2f} "
                f"{max(diffs):>9.2g}  ratios {[round(r, 2) for r in ratios]}"
            )
    ray.shutdown()


if __name__ == "__main__":
    main()
