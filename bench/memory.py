"""Peak resident memory of a fresh process running a light model: anychip CPU against
onnxruntime CPU, reported as a ratio (anychip / onnxruntime; at most 1 is the goal).

Each measurement is its own subprocess (``resource.getrusage(RUSAGE_SELF).ru_maxrss`` at its
end): it imports numpy and onnx (both runtimes read the model with them), loads the model,
makes one random input and runs it ``--runs`` times. The figures include the interpreter and
the imported libraries, so the baseline (the same process loading nothing) is printed too.
The anychip process also prints ``Session.memory()``.

    python bench/memory.py [--models resnet50,vgg19] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import onnx

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")

_CHILD = r"""
import os, resource, sys
import numpy as np
import onnx
runtime, path, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
if runtime == "onnxruntime":
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    info = sess.get_inputs()[0]
    x = np.random.default_rng(0).random(info.shape, dtype=np.float32)
    for _ in range(runs):
        sess.run(None, {info.name: x})
elif runtime == "anychip":
    import anychip
    sess = anychip.load(path, devices=["cpu"])
    info = next(i for i in sess.inputs if not i.optional)
    x = np.random.default_rng(0).random(info.shape, dtype=np.float32)
    for _ in range(runs):
        sess.run(None, {info.name: x})
    print(sess.memory(), file=sys.stderr)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def peak_rss(runtime: str, path: str, runs: int) -> tuple[int, str]:
    """Peak RSS in bytes of a fresh process running ``path`` on ``runtime``, and its stderr."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, runtime, path, str(runs)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(proc.stdout.strip().splitlines()[-1]), proc.stderr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50,vgg19")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    mib = 1 << 20
    base, _ = peak_rss("none", "-", 0)
    print(f"baseline (python + numpy + onnx): {base / mib:.0f} MiB")
    print(f"{'model':<12} {'anychip MiB':>12} {'onnxruntime MiB':>16} {'ratio':>7}")
    for name in args.models.split(","):
        path = os.path.join(LIGHT, f"light_{name}.onnx")
        ours, report = peak_rss("anychip", path, args.runs)
        theirs, _ = peak_rss("onnxruntime", path, args.runs)
        print(f"{name:<12} {ours / mib:>12.0f} {theirs / mib:>16.0f} {ours / theirs:>7.2f}")
        print("  " + report.strip().replace("\n", "\n  "))


if __name__ == "__main__":
    main()
