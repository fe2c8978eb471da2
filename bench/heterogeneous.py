"""Each device configuration on the light ResNet-50 and a transformer layer: wall time against
cpu alone (same process), partitions, and copies per run with their bytes.

    python bench/heterogeneous.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx

import anychip

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench._timing import bars, best_of, progress
from tests.models import transformer_layer

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
CONFIGS = [["cpu"], ["xpu", "cpu"], ["npu", "cpu"], ["npu", "xpu", "cpu"]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    available = {d.name for d in anychip.devices() if d.available}
    models = {
        "resnet50": (os.path.join(LIGHT, "light_resnet50.onnx"), None),
        "transformer": (
            transformer_layer(),
            {"x": np.random.default_rng(0).standard_normal((1, 64, 256)).astype(np.float32)},
        ),
    }
    print(
        f"{'model':<12} {'devices':<12} {'ms':>9} {'vs cpu':>7} {'parts':>5} "
        f"{'copies/run':>10} {'bytes/run':>10} {'max|diff|':>10}  nodes"
    )
    for mname, (model, feeds) in progress(models.items(), "models", len(models)):
        base_t = base_y = None
        for cfg in CONFIGS:
            if not set(cfg) <= available:
                print(f"{mname:<12} {','.join(cfg):<12} unavailable")
                continue
            sess = anychip.load(model, devices=cfg)
            if feeds is None:
                info = next(i for i in sess.inputs if not i.optional)
                feeds = {info.name: np.random.default_rng(0).random(info.shape, dtype=np.float32)}
            for _ in range(60):  # the feedback's runs and trials first: then the placement holds
                sess.run(None, feeds)
                if sess.feedback is None or sess.feedback.done:
                    break
            t = best_of(lambda s=sess, f=feeds: s.run(None, f), args.repeat)
            y = sess.run(None, feeds)[0]
            if base_t is None:
                base_t, base_y = t, y
            rep = sess.placement()
            print(
                f"{mname:<12} {','.join(cfg):<12} {t * 1e3:9.2f} {t / base_t:7.2f} "
                f"{len(rep.partitions):>5} {rep.copy_count:>10} {rep.copy_bytes:>10} "
                f"{float(np.max(np.abs(y - base_y))):10.2e}  {rep.by_device()}"
            )


if __name__ == "__main__":
    with bars():
        main()
