"""``anychip run --concurrency N``: N requests in flight, as onnxruntime_perf_test's ``-c``
and benchmark_app's ``-nireq`` put them.

A session serialises its runs (``core/api/session.py``), so N requests overlap only over N
sessions: the command's own session and N-1 more loaded with the same options (N times the
memory, N-1 more loads; their load time is not timed). Each session's thread runs its requests
back to back (a closed loop: one request in flight per session, N in all); the latency of a
request is its own run, the throughput the requests over the wall time of the phase.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from anychip.errors import AnychipError

__all__ = ["concurrent_runs", "percentiles", "concurrency_text"]


def percentiles(seconds: list[float]) -> dict[str, float]:
    """p50, p90 and p99 of ``seconds`` in ms (numpy's linear interpolation)."""
    ms = np.asarray(seconds) * 1e3
    return {f"p{q}_ms": float(np.percentile(ms, q)) for q in (50, 90, 99)}


def concurrent_runs(
    first: Any,
    load: Callable[[], Any],
    feeds: Mapping[str, Any],
    concurrency: int,
    per_session: int,
) -> dict[str, Any]:
    """``per_session`` requests on each of ``concurrency`` sessions (``first`` and
    ``load()``-ed ones) at once; their latencies' percentiles and the throughput."""
    if concurrency < 1:
        raise AnychipError(f"--concurrency must be >= 1, got {concurrency}")
    sessions = [first] + [load() for _ in range(concurrency - 1)]
    for s in sessions[1:]:  # each one's first runs (compiles, warm-up) are not the phase's
        for _ in range(3):
            s.run(None, feeds)
    latencies: list[list[float]] = [[] for _ in sessions]
    errors: list[BaseException] = []
    start = threading.Barrier(len(sessions) + 1)

    def worker(i: int) -> None:
        start.wait()
        try:
            for _ in range(per_session):
                t0 = time.perf_counter()
                sessions[i].run(None, feeds)
                latencies[i].append(time.perf_counter() - t0)
        except BaseException as e:  # handed to the command's thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(sessions))]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for s in sessions[1:]:
        s.close()
    if errors:
        raise errors[0]
    every = [x for lat in latencies for x in lat]
    return {
        "concurrency": concurrency,
        "requests": len(every),
        "wall_s": wall,
        "throughput_per_s": len(every) / wall if wall > 0 else float("inf"),
        **percentiles(every),
    }


def concurrency_text(c: Mapping[str, Any]) -> str:
    """The phase in one line."""
    return (
        f"concurrency {c['concurrency']} ({c['concurrency']} sessions): {c['requests']} "
        f"requests in {c['wall_s']:.2f} s, {c['throughput_per_s']:.1f} runs/s; latency p50 "
        f"{c['p50_ms']:.2f} ms, p90 {c['p90_ms']:.2f} ms, p99 {c['p99_ms']:.2f} ms"
    )
