"""The second core's work on and off in one process: a model of ``cpu_models.py`` at
``--threads`` with the pool and the splits on (the thresholds as shipped) and off (the
previous round's: nothing on the pool, MatMuls on oneDNN's team from ``SMALL_WORK``),
onnxruntime beside at the same thread count, interleaved as ``anychip bench`` interleaves (a
seeded order each round, each timed run right after an untimed one of the same contender);
medians of wall time.

One process, so the three see the same load second by second: onnxruntime's time against its
one-thread time says whether a second core was there at all.

    python bench/threads_ab.py [--models bert_like,lstm] [--rounds 60] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def _switches() -> list[tuple[object, str, int]]:
    """``(module, name, value when off)``: off is the previous round's behaviour."""
    import anychip.codegen as cg
    from anychip.backends.cpu.kernels import op_fused_attention
    from anychip.backends.cpu.onednn import _lib, matmul, rnn

    never = 1 << 62
    return [
        (cg, "PARALLEL_WORK", never),
        (op_fused_attention, "HEADS_SPLIT_WORK", never),
        (matmul, "ROW_SPLIT_WORK", never),
        (rnn, "BATCH_SPLIT_WORK", never),
        (_lib, "MATMUL_SMALL_WORK", _lib.SMALL_WORK),
    ]


def _measure(name: str, threads: int, rounds: int, mode) -> dict[str, float]:
    """Median ms of ``name`` with the switches on, off, and onnxruntime's."""
    import onnxruntime as ort
    from threadpoolctl import threadpool_limits

    import anychip
    from anychip.cli.bench import _time_model
    from bench.cpu_models import build

    model, feeds = build(name)
    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    peer = ort.InferenceSession(model.SerializeToString(), so)
    sess = anychip.load(model, "cpu")

    def anychip_with(on: bool) -> Callable[[dict], list]:
        def run(f: dict) -> list:
            mode(on)
            return sess.run(None, f)

        return run

    # anychip bench's interleaving: a seeded order each round, each timed run right after an
    # untimed one of the same contender, medians
    engines = {
        "anychip": anychip_with(True),
        "off": anychip_with(False),
        "onnxruntime": lambda f: peer.run(None, f),
    }
    with threadpool_limits(threads):
        ms = _time_model(engines, feeds, rounds, warmup=3)["ms"]
    return {"on": ms["anychip"], "off": ms["off"], "onnxruntime": ms["onnxruntime"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="bert_like,gpt2_like,lstm,mlp")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from anychip.backends.cpu.onednn import _lib

    _lib.available()  # loads libgomp, so threadpool_limits reaches it
    shipped = [(m, name, getattr(m, name), off) for m, name, off in _switches()]

    def mode(on: bool) -> None:
        for m, name, value, off in shipped:
            setattr(m, name, value if on else off)

    print(f"load average {os.getloadavg()[0]:.2f}; threads {args.threads}")
    try:
        for name in args.models.split(","):
            ms = _measure(name, args.threads, args.rounds, mode)
            print(f"{name:16s} on {ms['on']:8.3f}  off {ms['off']:8.3f}  onnxruntime "
                  f"{ms['onnxruntime']:8.3f} ms   on/off {ms['on'] / ms['off']:.2f}"
                  f"   load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    finally:
        mode(True)


if __name__ == "__main__":
    main()
