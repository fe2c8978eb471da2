"""Wall time of the nine light CNNs: anychip CPU against onnxruntime CPU, same process, same
inputs, reported as a ratio (anychip / onnxruntime; below 1 means anychip is faster).

    python bench/light_models.py [--repeat 10] [--threads N]
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

import numpy as np
import onnx

import anychip

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench._timing import bars, best_of, progress

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def main() -> None:
    import onnxruntime as ort

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads")
    args = ap.parse_args()
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    print(f"{'model':<14} {'anychip ms':>11} {'ort ms':>9} {'ratio':>7} {'max|diff|':>10}")
    ratios = []
    for path in progress(sorted(glob.glob(os.path.join(LIGHT, "light_*.onnx"))), "models"):
        name = os.path.basename(path)[6:-5]
        sess = anychip.load(path, devices=["cpu"])
        info = next(i for i in sess.inputs if not i.optional)
        feeds = {info.name: np.random.default_rng(0).random(info.shape, dtype=np.float32)}
        ref = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        t_any = best_of(lambda s=sess, f=feeds: s.run(None, f), args.repeat)
        t_ort = best_of(lambda r=ref, f=feeds: r.run(None, f), args.repeat)
        diff = float(np.max(np.abs(sess.run(None, feeds)[0] - ref.run(None, feeds)[0])))
        ratios.append(t_any / t_ort)
        print(
            f"{name:<14} {t_any * 1e3:11.2f} {t_ort * 1e3:9.2f} {t_any / t_ort:7.2f} {diff:10.2e}"
        )
    geo = float(np.exp(np.mean(np.log(ratios))))
    print(f"geometric mean ratio anychip/onnxruntime: {geo:.2f}")


if __name__ == "__main__":
    with bars():
        main()
