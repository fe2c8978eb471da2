"""Each convolution's time inside a session at one thread and at two, side by side: where the
second core helps and where it does not.

Every call of ``onednn/conv.conv`` (the oneDNN path and the C kernels behind it) is timed
inside the session's runs; sessions at one and two threads alternate (``--rounds`` each), and
each convolution's median is reported with its shapes, slowest first, after their sums and
how many calls split by rows a run (``conv_split.RUNS``).

    python bench/conv_threads.py MODEL [--runs 40] [--rounds 2] [--top 15]

``MODEL`` is any name of ``bench/cpu_models.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

__all__ = ["conv_times", "main"]


def conv_times(model: Any, feeds: dict, threads: int, runs: int) -> tuple[list, float]:
    """``([(x shape, w shape, [seconds per run...]), ...] in call order, splits a run)`` of
    ``model``'s convolutions in an anychip CPU session on ``threads`` threads."""
    from threadpoolctl import threadpool_limits

    import anychip
    from anychip.backends.cpu.onednn import _lib, conv_split
    from anychip.backends.cpu.onednn import kernels as K

    _lib.available()  # load libgomp first: threadpoolctl limits only what is loaded
    inner = K._conv_mod.conv
    calls: list[tuple[tuple, tuple, float]] = []

    def timed(x: np.ndarray, w: np.ndarray, *args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        y = inner(x, w, *args, **kw)
        calls.append((x.shape, w.shape, time.perf_counter() - t))
        return y

    with threadpool_limits(threads):
        sess = anychip.load(model.SerializeToString(), devices=["cpu"])
        for _ in range(3):
            sess.run(None, feeds)
        splits = sum(conv_split.RUNS.values())
        K._conv_mod.conv = timed
        try:
            for _ in range(runs):
                sess.run(None, feeds)
        finally:
            K._conv_mod.conv = inner
        splits = (sum(conv_split.RUNS.values()) - splits) / runs
    n = len(calls) // max(runs, 1)
    return [(calls[i][0], calls[i][1], [c[2] for c in calls[i::n]]) for i in range(n)], splits


def report(one: list, two: list, splits: tuple[float, float], top: int) -> str:
    """The table: sums, scaling, splits, then the ``top`` slowest convolutions at one thread."""
    rows = [(np.median(a[2]) * 1e6, np.median(b[2]) * 1e6, a[0], a[1]) for a, b in zip(one, two)]
    s1, s2 = sum(r[0] for r in rows), sum(r[1] for r in rows)
    lines = [
        f"{len(rows)} convolutions; sum 1 thread {s1:.0f} us, 2 threads {s2:.0f} us, "
        f"scaling {s1 / s2 if s2 else float('nan'):.2f}; row splits a run {splits[0]:g} / "
        f"{splits[1]:g}",
        "  1 thr us  2 thr us  1/2",
    ]
    for a, b, xs, ws in sorted(rows, key=lambda r: -r[0])[:top]:
        lines.append(f"{a:10.0f} {b:9.0f} {a / b:5.2f}  x={list(xs)} w={list(ws)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import cpu_models

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=list(cpu_models.MODELS))
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)
    if args.runs < 1 or args.rounds < 1:
        ap.error("--runs and --rounds must be at least 1")
    model, feeds = cpu_models.build(args.model)
    acc: dict[int, list] = {}
    splits = {1: 0.0, 2: 0.0}
    for _ in range(args.rounds):
        for threads in (1, 2):
            got, split = conv_times(model, feeds, threads, args.runs)
            splits[threads] = split
            if threads not in acc:
                acc[threads] = got
            else:
                for kept, new in zip(acc[threads], got):
                    kept[2].extend(new[2])
    print(report(acc[1], acc[2], (splits[1], splits[2]), args.top))


if __name__ == "__main__":
    main()
