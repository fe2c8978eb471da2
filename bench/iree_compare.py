"""IREE's CPU target against anychip's CPU and onnxruntime, interleaved in one process.

    python bench/iree_compare.py tests/data/hf_bert_tiny.onnx --runs 30

Engines: anychip on ``cpu``, on ``iree-cpu,cpu`` with the cost model choosing, on
``iree-cpu,cpu`` with the cost model off (every node IREE takes on it), and onnxruntime's CPU
provider; each round runs every engine once in
turn, and the medians are printed with the placement's share on iree-cpu. Inputs: seeded
random floats, integer inputs in [0, 100), symbolic dimensions at ``--dim``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--dim", type=int, default=16)
    args = p.parse_args()

    import onnxruntime as ort

    import anychip

    rng = np.random.default_rng(0)
    ref = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
    feeds = {}
    for i in ref.get_inputs():
        shape = [
            d if isinstance(d, int) else (1 if n == 0 else args.dim) for n, d in enumerate(i.shape)
        ]
        if "int" in i.type:
            feeds[i.name] = rng.integers(0, 100, shape).astype(np.int64)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    engines = {"onnxruntime": lambda: ref.run(None, feeds)}
    shares = {}
    for devices in (["cpu"], ["iree-cpu", "cpu"], ["iree-cpu"]):
        # ["iree-cpu"]: every node IREE takes on it (the CPU only for what it refuses)
        name = "iree-cpu,cpu (cost model off)" if devices == ["iree-cpu"] else ",".join(devices)
        kw = {"cost_model": False} if devices == ["iree-cpu"] else {}
        sess = anychip.load(args.model, devices=sorted(set(devices) | {"cpu"}, reverse=True), **kw)
        by = sess.placement().by_device()
        shares[name] = f"{by.get('iree-cpu', 0)}/{sum(by.values())} nodes on iree-cpu"
        engines[name] = lambda s=sess: s.run(None, feeds)
    times: dict[str, list[float]] = {k: [] for k in engines}
    for f in engines.values():
        f()
    for _ in range(args.runs):
        for k, f in engines.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    for k, ts in times.items():
        print(f"{k:<28} median {statistics.median(ts) * 1e3:8.2f} ms  {shares.get(k, '')}")


if __name__ == "__main__":
    main()
