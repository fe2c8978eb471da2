"""IREE's devices against anychip's CPU and onnxruntime, interleaved in one process.

    python bench/iree_compare.py mlp bert_like squeezenet --runs 10 [--sets iree-cpu,vulkan]
    python bench/iree_compare.py tests/data/hf_bert_tiny.onnx --runs 20

Models: names of ``bench/cpu_models.py`` (mlp, bert_like, gpt2_like, resnet_like,
squeezenet, hf_bert_tiny, hf_gpt2_tiny...) with their seeded inputs, or ONNX paths (random
floats, integer inputs in [0, 100), symbolic dimensions at ``--dim``, the first at 1).

Engines per model: onnxruntime's CPU provider; anychip on ``cpu``; for each IREE device D of
``--sets``: ``D,cpu`` as a user gets it (calibration ``auto``, the cost model choosing; run
until its feedback has decided and its background compiles are done) and ``D max`` (every node
D takes, the cost model off: the device "alone" as far as it can be). Each round runs every
engine once in a new seeded order, after an untimed run; the medians are printed with the
nodes on D and, for ``D,cpu``, the median over the rounds of its ratio to the faster (by
median) of ``cpu`` and ``D max`` in the same round (the issue's rule: a mixed set within 1.05x
its best single device; on a shared machine the medians alone moved 1.5x between sessions of
one placement). Devices with no calibration here are
calibrated first (``anychip calibrate``), as a user's second load finds them.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

#: Runs at most before timing (the feedback's trials, background compiles).
WARMUP_CAP = 1000
#: An engine whose run takes longer than this (seconds) is left out of the rounds (lavapipe
#: runs a CNN's convolutions in seconds).
TOO_SLOW = 2.0


def _model(name: str, dim: int) -> tuple[bytes, dict[str, np.ndarray]]:
    import onnx

    if os.path.exists(name):
        import onnxruntime as ort

        m = onnx.load(name)
        rng = np.random.default_rng(0)
        feeds = {}
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        for i in sess.get_inputs():
            shape = [
                d if isinstance(d, int) else (1 if n == 0 else dim) for n, d in enumerate(i.shape)
            ]
            if "int" in i.type:
                feeds[i.name] = rng.integers(0, 100, shape).astype(np.int64)
            else:
                feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
        return m.SerializeToString(), feeds
    from bench.cpu_models import build

    m, feeds = build(name)
    return m.SerializeToString(), feeds


def _settle(sess, feeds) -> None:
    """Runs until the session's feedback has decided and its background compiles are done."""
    for n in range(WARMUP_CAP):
        sess.run(None, feeds)
        for sp in sess.compiled.specialized.values():
            sp.wait(600)
        fb = sess.feedback
        if n >= 4 and (fb is None or fb.done):
            break


def _engines(model: bytes, feeds: dict, devices: list[str]) -> tuple[dict, dict]:
    import onnxruntime as ort

    import anychip

    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    engines = {"onnxruntime": lambda: ref.run(None, feeds)}
    shares = {}
    sessions = {"cpu": anychip.load(model, devices=["cpu"])}
    for d in devices:
        sessions[f"{d},cpu"] = anychip.load(model, devices=[d, "cpu"], calibration="auto")
        sessions[f"{d} max"] = anychip.load(model, devices=[d, "cpu"], cost_model=False)
    for key, sess in sessions.items():
        _settle(sess, feeds)
        t0 = time.perf_counter()
        sess.run(None, feeds)
        if time.perf_counter() - t0 > TOO_SLOW:
            shares[key] = f"left out: a run takes {time.perf_counter() - t0:.1f} s"
            continue
        by = sess.placement().by_device()
        dev = key.split(",")[0].split()[0]
        shares[key] = f"{by.get(dev, 0)}/{sum(by.values())} on {dev}" if dev != "cpu" else ""
        engines[key] = lambda s=sess: s.run(None, feeds)
    return engines, shares


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("models", nargs="+")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--sets", default="iree-cpu,vulkan", help="IREE devices, comma-separated")
    args = p.parse_args()

    import anychip
    from anychip.core.plan.calibration import calibration_for
    from anychip.core.plugin.host import get_registry

    available = {d.name for d in anychip.devices() if d.available}
    devices = [d for d in args.sets.split(",") if d in available]
    registry = get_registry(["cpu", *devices])
    for d in ["cpu", *devices]:
        calibration_for(registry.backends[d])
    print(f"{'model':<14} {'engine':<14} {'median ms':>10} {'x best':>7}  nodes")
    for name in args.models:
        model, feeds = _model(name, args.dim)
        engines, shares = _engines(model, feeds, devices)
        times: dict[str, list[float]] = {k: [] for k in engines}
        order = list(engines.items())
        rng = random.Random(0)
        for _ in range(args.runs):
            rng.shuffle(order)
            for k, f in order:
                f()
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(ts) for k, ts in times.items()}
        for k, why in shares.items():
            if k not in med:
                print(f"{name:<14} {k:<14} {'':>10} {'':>7}  {why}")
        for k, t in med.items():
            ratio = ""
            if k.endswith(",cpu"):  # the median of the rounds' ratios to the best single
                best = min(["cpu", f"{k.split(',')[0]} max"], key=lambda e: med.get(e, 1e9))
                ratio = f"{statistics.median(a / b for a, b in zip(times[k], times[best])):7.2f}"
            print(f"{name:<14} {k:<14} {t * 1e3:10.3f} {ratio:>7}  {shares.get(k, '')}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
