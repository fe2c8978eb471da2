"""Graph-compiling devices in practice: per model on ``npu,cpu``, the nodes on the NPU, the
compiles and cache hits over three input shapes, and the first-run and steady-state latency,
with the background compile on (runs go to the CPU while the NPU compiles) and off, against
the CPU placement's first run. Interleaved rounds, medians.

    python bench/npu_compile.py [--rounds 3] [--only hf_bert,hf_gpt2]

The Hugging Face BERT and GPT-2 exports are the tiny ones of tests/data (bench/hf_exports.py)
at sequence lengths 16, 32 and 64.

(``*``: compiled at load: static shapes with the background compile off.)
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

import numpy as np

import anychip

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench._timing import bars, progress
from bench.models import cnn, mlp
from tests.backends.npu_stub.test_hf_models import MODELS as HF
from tests.backends.npu_stub.test_hf_models import feeds as hf_feeds
from tests.models import transformer_layer


def _models() -> dict[str, tuple[bytes, list[dict]]]:
    from anychip.zoo import light_model

    rng = np.random.default_rng(0)

    def feeds(name: str, shapes: list[tuple]) -> list[dict]:
        return [{name: rng.standard_normal(s).astype(np.float32)} for s in shapes]

    resnet = light_model("resnet50", seed=0).SerializeToString()
    bert = transformer_layer(seq="S", hidden=256, heads=4, ffn=1024).SerializeToString()
    return {
        "bert_like": (bert, feeds("x", [(1, 32, 256), (1, 64, 256), (1, 128, 256)])),
        "hf_bert": (HF["bert"].read_bytes(), [hf_feeds("bert", s) for s in (16, 32, 64)]),
        "hf_gpt2": (HF["gpt2"].read_bytes(), [hf_feeds("gpt2", s) for s in (16, 32, 64)]),
        "resnet50": (resnet, feeds("gpu_0/data_0", [(1, 3, 224, 224)] * 3)),
        "cnn_dynamic": (cnn(), feeds("x", [(1, 3, 64, 64), (4, 3, 64, 64), (8, 3, 64, 64)])),
        "mlp": (mlp(batch=64), feeds("x", [(64, 1024)] * 3)),
    }


def _first_and_steady(model: bytes, devices: list[str], feeds: list[dict], **kw) -> tuple:
    t0 = time.perf_counter()
    sess = anychip.load(model, devices=devices, cost_model=False, **kw)
    sess.run(None, feeds[0])
    first = time.perf_counter() - t0
    for sp in sess.compiled.specialized.values():
        sp.wait(120)
    for f in feeds:
        sess.run(None, f)
    for sp in sess.compiled.specialized.values():
        sp.wait(120)
    steady = min(_timed(sess, f) for f in feeds for _ in range(3))
    return first, steady, sess


def _timed(sess: anychip.Session, feeds: dict) -> float:
    t0 = time.perf_counter()
    sess.run(None, feeds)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated model names")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    os.environ["ANYCHIP_COMPILE_CACHE"] = "0"  # every round compiles: no artifacts from disk
    print(
        f"{'model':<12} {'npu nodes':>9} {'compiles':>8} {'hits':>5} {'cpu first':>10} "
        f"{'bg first':>9} {'bg/cpu':>6} {'sync first':>10} {'npu steady':>10} {'cpu steady':>10}"
    )
    for name, (model, feeds) in _models().items():
        if only and name not in only:
            continue
        rows: dict[str, list[float]] = {k: [] for k in ("cf", "bf", "sf", "ns", "cs")}
        for _ in progress(range(args.rounds), f"{name}: rounds"):
            cf, cs, _ = _first_and_steady(model, ["cpu"], feeds)
            gc.collect()  # the NPU's memory back from the last round's sessions
            bf, _, _ = _first_and_steady(model, ["npu", "cpu"], feeds, background_compile=True)
            gc.collect()
            sf, ns, sess = _first_and_steady(model, ["npu", "cpu"], feeds, background_compile=False)
            for k, v in zip(rows, (cf, bf, sf, ns, cs)):
                rows[k].append(v)
            tel = [sp.telemetry() for sp in sess.compiled.specialized.values()]
            placed = sess.placement()
            del sess
            gc.collect()
        med = {k: statistics.median(v) * 1e3 for k, v in rows.items()}
        on_npu = placed.by_device().get("npu", 0)
        total = len(placed.nodes)
        compiles = sum(t["compiles"] for t in tel) if tel else f"{len(placed.partitions)}*"
        print(
            f"{name:<12} {on_npu:>4}/{total:<4} {compiles:>8} "
            f"{sum(t['hits'] for t in tel):>5} {med['cf']:9.1f}ms {med['bf']:8.1f}ms "
            f"{med['bf'] / med['cf']:5.2f}x "
            f"{med['sf']:9.1f}ms {med['ns']:9.1f}ms {med['cs']:9.1f}ms"
        )


if __name__ == "__main__":
    with bars():
        main()
