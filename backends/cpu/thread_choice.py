"""How many threads a CPU partition runs on: the threads given, or one, whichever its own runs
measured faster.

A small CNN at two threads can be slower than at one on this kind of machine (ShuffleNet
6.65 ms against 5.71 in one table): each split pays a wake and a wait, and the next node reads
the other core's half of the activations from that core's cache. Whether a second core pays
depends on the model, the input's shape and the machine's load at the time, so it is measured,
not guessed: after ``START`` runs on the threads given (a session run a few times gains
nothing from tuning, and its first runs are its slowest) and ``ONE_WARM`` on one thread (to
its replay, ``backends/cpu/replay/record.py``, as the threads given run by then), a partition's
runs alternate
between the threads given and one thread, ``PROBE`` timed runs each, and the threads given
run on unless one thread's median is ``MARGIN`` under theirs in two probes in a row (one
probe may fall in a moment when another tenant held the second core: on this VM a
DenseNet-like model's two-thread probe once read 43.7 ms against its usual 27-29, and one
thread would have run on for 500 runs at 40). One thread chosen is measured again after
``SOON`` runs, then twice as long each time it wins again, up to ``RECHECK``; the threads
given after ``RECHECK``. The probe starts again when the threads given change, and
separately for each set of input shapes (a batch of 64 and a batch of 1 choose apart). The
choice and its figures are in the placement report's partition ``info["threads"]``.

With another process spinning on one of the two cores, two threads given, medians of 12,
ms, chosen / given: SqueezeNet 16.2 / 19.3, a ResNet-like 52.1 / 58.3, a MobileNet-like 24.7 /
26.1, the bench's LSTM 0.64 / 2.05; one thread was chosen for each. On an idle machine the
CNNs keep two threads, and a session with the choice against one without it, alternated in
one process, read 0.994-1.001 (SqueezeNet) and 1.016-1.050 (ShuffleNet-like).

All threading of the CPU backend follows ``omp.max_threads()`` (oneDNN's teams, the generated
code's pool, the splits), so one thread is one call to ``omp.set_threads`` around the run; the
threads given are set back after it, errors included. Off with ``device_options={"cpu":
{"thread_choice": False}}`` or ``ANYCHIP_THREAD_CHOICE=0``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from anychip.backends.cpu.native import omp, pool
from anychip.backends.cpu.replay.run import REPLAY_FROM

__all__ = [
    "ThreadChoice",
    "on_threads",
    "START",
    "ONE_WARM",
    "PROBE",
    "RECHECK",
    "SOON",
    "MARGIN",
    "QUIET",
]

#: Runs of an input signature on the threads given before its first probe.
START = 20
#: Untimed runs on one thread after those: the first builds one thread's primitives, the last
#: ends its replay's recording (``cpu/replay/run.REPLAY_FROM``: recorded from a partition's
#: third run at a thread count, one step a run), so the probe times one thread's replays
#: against the threads given's. With one
#: warm run, one thread's side was timed on the kernels' path and its recording: SqueezeNet's
#: four runs on one thread took 9.65, 63.2, 7.21 and 7.82 ms (median 8.7, the replays 7.2-7.8).
ONE_WARM = REPLAY_FROM - 1
#: Timed runs on each side of a probe (even).
PROBE = 4
#: Runs between probes of one input signature.
RECHECK = 500
#: Runs before one thread, once chosen, is measured again (doubling while it keeps winning).
SOON = 25
#: One thread is chosen only when its median is this much under the threads given.
MARGIN = 0.05
#: Input signatures remembered per partition; others run on the threads given.
SIGNATURES = 16
#: Runs in a row on the threads given that never asked the generated code's pool for threads,
#: after which a signature's runs stop asking whether they did (two calls, 0.5 us a run of a
#: model of a few us) until its next probe.
QUIET = 8

Program = Callable[[list[Any]], list[Any]]


class _Probe:
    """The state of one input signature: the runs left to warm and time, each side's times,
    the threads chosen (0 while probing), runs since, runs until the next probe, and how many
    probes in a row one thread has won."""

    __slots__ = ("warm", "order", "times", "chosen", "runs", "recheck", "wins", "quiet")

    def __init__(self, given: int, warm: bool, wins: int = 0) -> None:
        #: Untimed runs first (popped from the end): ``START`` on the threads given, then
        #: ``ONE_WARM`` on one thread.
        self.warm = [1] * ONE_WARM + [given] * START if warm else []
        #: Alternated in ABBA order, so a drift in the machine's speed falls on both sides.
        self.order = [1, given, given, 1] * (PROBE // 2)
        self.times: dict[int, list[float]] = {1: [], given: []}
        self.chosen = 0
        self.runs = 0
        self.recheck = RECHECK
        self.wins = wins
        #: Runs in a row on the threads given that did not ask the pool for threads.
        self.quiet = 0


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    h = len(s) // 2
    return s[h] if len(s) % 2 else (s[h - 1] + s[h]) / 2


class ThreadChoice:
    """``program`` run on the threads given or on one, as measured (module docstring). Holds
    the generated code's pool awake (``pool.held``) through a run on two or more threads once
    a run of the program has asked the pool for threads (a program of small kernels never
    does, and its runs leave the other core alone); a signature whose last ``QUIET`` runs on
    the threads given did not ask stops asking until its next probe."""

    def __init__(self, program: Program, info: dict | None = None, choose: bool = True) -> None:
        self.wrapped = program
        self.info = info if info is not None else {}
        self.choose = choose
        self.uses = False
        self.given = 0
        self.probes: dict[tuple, _Probe] = {}

    def __call__(self, tensors: list[Any]) -> list[Any]:
        given = omp.max_threads()
        if given < 2:
            return self.wrapped(tensors)
        if not self.choose:
            return self._run(tensors)
        if given != self.given:
            self.given, self.probes = given, {}
        key = tuple([getattr(t, "shape", None) for t in tensors])  # a list: no generator frame
        probe = self.probes.get(key)
        if probe is None:
            if len(self.probes) >= SIGNATURES:
                return self._run(tensors)
            probe = self.probes[key] = _Probe(given, warm=True)
        if probe.chosen:
            probe.runs += 1
            if probe.runs >= probe.recheck:
                self.probes[key] = _Probe(given, warm=False, wins=probe.wins)
            if probe.chosen == given:
                if probe.quiet >= QUIET and not self.uses:
                    return self.wrapped(tensors)  # no pool to hold (class docstring)
                return self._run(tensors, probe)
            return self._on(probe.chosen, given, tensors)
        if probe.warm:
            return self._on(probe.warm.pop(), given, tensors)
        threads = probe.order.pop()
        t0 = time.perf_counter()
        try:
            out = self._on(threads, given, tensors)
            probe.times[threads].append(time.perf_counter() - t0)
        finally:  # a run that raised is not timed; the probe still ends
            if not probe.order:
                self._decide(probe, given, key)
        return out

    def _on(self, threads: int, given: int, tensors: list[Any]) -> list[Any]:
        if threads == given:
            return self._run(tensors)
        omp.set_threads(threads)
        try:
            return self.wrapped(tensors)
        finally:
            omp.set_threads(given)

    def _run(self, tensors: list[Any], probe: _Probe | None = None) -> list[Any]:
        """A run on the threads given, the pool held once the program has asked for it
        (``probe``: the signature's, counting the runs that did not)."""
        if self.uses:
            with pool.held():
                return self.wrapped(tensors)
        before = pool.wanted()
        try:
            return self.wrapped(tensors)
        finally:
            self.uses = pool.wanted() != before
            if probe is not None:
                probe.quiet = 0 if self.uses else probe.quiet + 1

    def _decide(self, probe: _Probe, given: int, key: tuple) -> None:
        if not probe.times[1] or not probe.times[given]:  # runs that raised: measure again
            self.probes[key] = _Probe(given, warm=False, wins=probe.wins)
            return
        one, many = _median(probe.times[1]), _median(probe.times[given])
        if one >= many * (1 - MARGIN):
            probe.chosen, probe.wins, probe.recheck = given, 0, RECHECK
        elif probe.wins == 0:  # one thread won once: measure again before taking it
            self.probes[key] = _Probe(given, warm=False, wins=1)
            return
        else:
            probe.chosen, probe.wins = 1, probe.wins + 1
            probe.recheck = min(RECHECK, SOON << (probe.wins - 2))
        shapes = ", ".join(str(list(s)) for s in key if s is not None)
        self.info["threads"] = (
            f"{probe.chosen} of {given} for inputs {shapes}: measured median "
            f"{one * 1e3:.3f} ms at 1 thread, {many * 1e3:.3f} at {given} ({PROBE} runs each"
            + (", one thread faster in two probes in a row" if probe.chosen == 1 else "")
            + f"; measured again in {probe.recheck} runs)"
        )[:300]

    def chosen(self, tensors: list[Any]) -> int:
        """The threads chosen for inputs shaped as ``tensors`` (0 while still measuring or
        never seen)."""
        probe = self.probes.get(tuple(getattr(t, "shape", None) for t in tensors))
        return probe.chosen if probe is not None else 0


def on_threads(program: Callable[[list[Any]], list[Any]], threads: int) -> Callable:
    """``program`` run with ``threads`` as the threads given (a session's
    ``intra_op_num_threads``): set around each run, the caller's count put back after, errors
    included. The thread choice inside then chooses between ``threads`` and one."""

    def run(tensors: list[Any]) -> list[Any]:
        before = omp.max_threads()
        if before == threads:
            return program(tensors)
        omp.set_threads(threads)
        try:
            return program(tensors)
        finally:
            omp.set_threads(before)

    run.threads = threads  # type: ignore[attr-defined]
    return run
