"""Inspect a model, then profile it on two devices: per-node times, a timeline, a trace.

    python examples/profile_and_inspect.py [OUT_DIR]

Prints what ``anychip inspect`` prints (opsets, inputs, ops, parameters, FLOPs, and which
device can run which op), then runs the model three times with every node and copy timed and
writes ``profile.html`` (a timeline) and ``profile.json`` (open it at ui.perfetto.dev).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import anychip
from anychip.viz.inspect import inspect_model
from anychip.zoo import light_model


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model = light_model("squeezenet", seed=0)
    summary = inspect_model(model, ["xpu", "cpu"])
    print(summary)
    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    with anychip.load(model, devices=["xpu", "cpu"], placement_policy="prefer-first") as sess:
        prof = sess.profile({sess.inputs[0].name: x}, runs=3)
    print(prof)
    print(prof.save_html(out_dir / "profile.html"), prof.save_trace(out_dir / "profile.json"))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("."))
