"""Run-time feedback: the session's first runs measured, the estimates corrected, and one
re-placement when the corrected estimates predict a better one.

Run 1 is a warm-up. Runs 2 to ``1 + TIMED_RUNS`` time every step (each partition and each
copy). Then, per device, the *factor* measured / estimated time of its partitions, and per
device link the same for its copies, corrects the cost model (``cost_search.Costs``), and the
model is placed again with the corrected costs. When that placement differs and is predicted
at least ``MARGIN`` faster than what the runs measured, it is tried first (below): a
prediction is not kept until it is measured (PaddlePaddle's elastic re-partition, inside one
process, measured).

Estimates can be wrong in ways no factor corrects (a device fast on one op class and slow on
another, copies that overlap), so the other placements worth having are *measured* too, one
after another, each over the requests that come next (a warm-up, then runs of it in turn with
as many of the placement, so each pair is measured under the same conditions; all serving
those requests): the host alone, and for each other device the most it can take
(onnxruntime's PREFER_<device>); a run right after the other placement's is not timed, since
what that one left spinning slows it. A placement identical to one measured is skipped; a
trial that fails is dropped (its request is served by the current placement).

Exploring has bounded regret (decisions/032): a request may explore (compile a trial, run it,
or run the placement right after it) only while the time explored so far beyond the
placement's typical run, plus what this request is expected to add, stays within ``budget``
(``explore_budget``, 5%) of the session's run time so far, this request included; otherwise
the placement serves it and the trial waits. A trial is decided on the ratios of its paired
runs with a one-sided 95% confidence bound (``_verdict``): kept when the bound says it is
``MARGIN`` faster, dropped when it says it is not, or after ``MAX_PAIRS`` pairs undecided. The
fastest kept wins. Under a named policy (``prefer-first``, ``min-copies``) or ``strict`` the
user said how to place, and only the corrected costs' placement is tried. Either way the
partitions' info and ``Session.placement()`` say what was measured and decided. Outputs do not
depend on which placement ran beyond the devices' floating-point differences.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

from anychip.core.plan.cost_search import MARGIN, Costs, estimate
from anychip.errors import RunTerminatedError

if TYPE_CHECKING:
    from anychip.core.compile.pipeline import CompiledModel

__all__ = ["Feedback", "explain_partitions", "predicted_time", "TIMED_RUNS", "EXPLORE_BUDGET"]

TIMED_RUNS = 3
#: Exploring may cost at most this share of the session's run time so far (``explore_budget``).
EXPLORE_BUDGET = 0.05
#: Pairs a trial is measured over at most; still undecided then, the placement stays.
MAX_PAIRS = 12
#: One-sided 95% quantiles of Student's t, by degrees of freedom 1, 2, ... (n pairs: n - 1).
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796)
log = logging.getLogger("anychip")


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1e3:.3f} ms"


def explain_partitions(compiled: CompiledModel, costs: Costs) -> None:
    """Write into each partition's info its estimated time here and on the best alternative
    device that can run all of its nodes."""
    for p in compiled.partitions:
        here = _sum(costs.node(n, p.device) for n in p.nodes)
        best = None
        for name in costs.by_name:
            if name == p.device or not all(costs.capable(name, n) for n in p.nodes):
                continue
            alt = _sum(costs.node(n, name) for n in p.nodes)
            if alt is not None and (best is None or alt < best[1]):
                best = (name, alt)
        p.info["estimate"] = _ms(here)
        if best is not None:
            p.info["alternative"] = f"{best[0]} {_ms(best[1])}"


def _compiling(compiled: CompiledModel) -> bool:
    """Whether a graph-mode partition of ``compiled`` still waits for its compile."""
    return any(sp.compiling() for sp in compiled.specialized.values())


def _sum(times: Any) -> float | None:
    total = 0.0
    for t in times:
        if t is None:
            return None
        total += t
    return total


class Feedback:
    """The measuring, the trials and the one re-placement of a session (see the module
    docstring). ``budget``: the share of the session's run time exploring may cost;
    ``clock``: what times the runs (a fake one in tests)."""

    def __init__(
        self,
        recompile: Any,
        trials: bool = True,
        budget: float = EXPLORE_BUDGET,
        clock: Any = time.perf_counter,
    ) -> None:
        #: ``recompile(factors, devices=None, policy=None) -> CompiledModel``: the model placed
        #: with corrected costs, or over ``devices`` with ``policy`` (for a trial).
        self.recompile = recompile
        #: Whether other placements are measured too (not when a policy or strict says how).
        self.trials = trials
        self.budget, self.clock = budget, clock
        self.runs = 0
        self.samples: list[list[float]] = []
        #: Each timed run's whole time (what the trials are compared with, like for like).
        self.totals: list[float] = []
        self.measured = 0.0
        #: The placement's typical run (the median of its timed runs): what a request costs
        #: when nothing is explored.
        self.ref = 0.0
        #: Seconds of every request this feedback served, and the part of them spent
        #: exploring beyond ``ref`` per request (compiling trials, running them, the untimed
        #: runs after them).
        self.session_time = 0.0
        self.explored = 0.0
        self.done = False
        self.decision = ""
        #: The placements still to try, as (label, compiled or (factors, devices, policy) to
        #: compile it), and the one being tried.
        self.queue: list[tuple[str, Any]] = []
        self.trial: tuple[str, CompiledModel] | None = None
        self.trial_samples: list[float] = []
        #: The placements measured or being measured (node -> device), not tried twice.
        self.seen: list[dict[str, str]] = []
        #: The placement's own runs paired with the trial's (see ``_run_trial``).
        self.paired_samples: list[float] = []
        #: The fastest measured so far: (its time / the placement's, label, compiled model).
        self.best: tuple[float, str, CompiledModel] | None = None
        #: Which of the two ran last in a trial ("trial" or "placed"): a run right after the
        #: other one is not timed (see ``_run_trial``).
        self.last = "placed"
        #: An untimed run was made: the timed one follows in the next request (its cost was
        #: counted when the untimed one was allowed).
        self.committed = False
        #: What a compile of a trial is expected to cost: the session's own compile (set by
        #: the session), then the last trial compile's measured time.
        self.compile_cost = 0.0
        #: The one-time work of a placement's first run (primitives, program builds, the
        #: replay's recording): the session's own first run beyond its typical run, then the
        #: most a trial's first run took beyond its prediction. A trial's first run on a device
        #: the placement does not use is expected to cost as much again (read as its predicted
        #: time only, an OpenCL trial's program loads made exploring 31% of Inception-v1's
        #: first 70 runs on ``opencl,cpu``, quiet Xeon).
        self.first_cost = 0.0
        self._first_run = 0.0
        #: The session's placement when it first ran (what a trial's devices are new to).
        self.placed_on: Any = None
        #: The label of the last trial that won and was taken (its placement serves since).
        self.adopted = ""
        #: How the trial and the last winner were compiled, ``(factors, devices, policy)``
        #: (None: not reproducible); ``on_decided(label, recipe, decision)`` is told the
        #: decision when the last trial is done (``core/api/remembered.py`` records it).
        self.trial_recipe: tuple | None = None
        self.best_recipe: tuple | None = None
        self.on_decided: Any = None
        #: A trial ended undecided (``MAX_PAIRS`` pairs, the bound wide: a busy machine): the
        #: decision is not recorded for later sessions.
        self.undecided = False

    @classmethod
    def for_session(cls, recompile: Any, options: Any, n_devices: int) -> Feedback | None:
        """The feedback of a session placed by the cost model over several devices (None
        otherwise); other placements are tried only under the ``latency`` policy, not strict."""
        if not options.cost_model or n_devices < 2:
            return None
        trials = options.policy == "latency" and not options.strict
        return cls(recompile, trials=trials, budget=options.explore_budget)

    def run(self, compiled: CompiledModel, arrays: list[Any]) -> tuple[list[Any], Any]:
        """One run of ``compiled`` (or of the placement being tried, when the budget allows);
        returns its outputs and the compiled model to use from now on (a new one after a
        re-placement)."""
        if self.done:
            return compiled.steps.run(arrays), compiled
        self.runs += 1
        if self.placed_on is None:
            self.placed_on = compiled
        t0, ref = self.clock(), self.ref  # a win taken in this request changes ``ref``
        exploring = (self.trial is not None or bool(self.queue)) and self._affordable()
        try:
            if exploring:
                return self._explore(compiled, arrays)
            if self.trial is not None or self.queue:  # over budget: the placement serves
                self.last = "placed"
                return compiled.steps.run(arrays), compiled
            return self._measure(compiled, arrays, t0)
        finally:
            elapsed = self.clock() - t0
            self.session_time += elapsed
            if exploring:
                self.explored += max(0.0, elapsed - ref)

    def _affordable(self) -> bool:
        """Whether this request may explore: the time explored so far plus what this request
        is expected to add stays within ``budget`` of the session's time, this one included
        (expected: the trial's last run, or its predicted time before it ran; for a compile,
        the last compile's time)."""
        if math.isinf(self.budget) or self.committed:
            return True
        if self.budget <= 0:
            return False
        expected = 0.0
        if self.trial is None and self.queue and isinstance(self.queue[0][1], tuple):
            expected = self.compile_cost  # the next request compiles a trial
        elif self.trial is not None:
            trial = self.trial[1]
            took = self.trial_samples[-1] if self.trial_samples else None
            took = took if took is not None else getattr(trial, "predicted", None)
            turn = len(self.trial_samples) + len(self.paired_samples)
            if turn == 0 or turn % 2 == 1:  # the trial's side: with its untimed run, two
                runs = 1 if turn == 0 or self.last == "trial" else 2
                expected = runs * max(0.0, (took or self.ref) - self.ref)
                if turn == 0 and self._new_device(trial):  # its first run: one-time work
                    expected += self.first_cost
        total = self.session_time + self.ref + expected
        return self.explored + expected <= self.budget * total

    def _measure(self, compiled: CompiledModel, arrays: list[Any], t0: float) -> tuple:
        """Runs 1 to ``1 + TIMED_RUNS``: the warm-up, then the placement timed; then the
        placements to try are queued (tried in the requests that follow, within budget)."""
        if self.runs == 1:
            outs = compiled.steps.run(arrays)
            self._first_run = self.clock() - t0
            return outs, compiled
        if _compiling(compiled):
            # A background compile: the host serves these partitions for now, which is not
            # the placement's time. Measured once it is done.
            return compiled.steps.run(arrays), compiled
        times: list[float] = []
        outs = compiled.steps.run(arrays, times)
        self.totals.append(self.clock() - t0)
        self.samples.append(times)
        if len(self.samples) < TIMED_RUNS:
            return outs, compiled
        factors = self._measured(compiled)
        self.best = (1.0, "the placement", compiled)  # time relative to the placement's
        # The cost model's re-placement is measured before it is kept, like the others.
        self.queue = [("the corrected costs' placement", ("corrected", factors))]
        if self.trials:
            self.queue += _candidates(compiled)
        if not self.seen:
            self.seen.append(_placement(compiled))
        return outs, compiled

    def _new_device(self, trial: CompiledModel) -> bool:
        """Whether ``trial`` runs partitions on a device this session's placement does not use
        (its one-time work is ahead of it; a trial on the same devices finds much of it done:
        primitives and programs are kept per process)."""
        used = {getattr(p, "device", None) for p in getattr(self.placed_on, "partitions", [])}
        return bool({getattr(p, "device", None) for p in getattr(trial, "partitions", [])} - used)

    def stop(self, why: str) -> None:
        """Measure no more (the session was placed again, or closed); hold no placement."""
        self.done, self.trial, self.queue, self.decision = True, None, [], why
        self.best = None

    def _explore(self, compiled: CompiledModel, arrays: list[Any]) -> tuple[list[Any], Any]:
        if self.trial is not None:
            return self._run_trial(compiled, arrays)
        # Compiling the next trial is this request's exploring; the placement serves it.
        self._next_trial(compiled)
        outs = compiled.steps.run(arrays)
        self.last = "placed"
        self.done = self.trial is None and not self.queue
        return self._finish(outs, compiled)

    def _next_trial(self, compiled: CompiledModel) -> None:
        """Compile the next placement to try that differs from every one measured; at most
        one compile per request (each is exploring time, counted against the budget)."""
        compiled_one = False
        while self.queue and self.trial is None and not compiled_one:
            label, how = self.queue.pop(0)
            compiled_one = isinstance(how, tuple)
            t0 = self.clock()
            try:
                if isinstance(how, tuple) and how[0] == "corrected":
                    candidate = self._corrected(compiled, how[1])
                    if candidate is None:
                        continue
                else:
                    candidate = how if not isinstance(how, tuple) else self.recompile(*how)
            except Exception as e:
                self.decision += f"; {label}: not tried ({type(e).__name__})"
                continue
            finally:
                if compiled_one:
                    self.compile_cost = self.clock() - t0
            where = _placement(candidate)
            if where in self.seen:
                continue
            self.seen.append(where)
            self.trial, self.trial_samples, self.paired_samples = (label, candidate), [], []
            self.trial_recipe = _recipe(how)

    def _run_trial(self, compiled: CompiledModel, arrays: list[Any]) -> tuple[list[Any], Any]:
        """One request of a trial: its warm-up first, then the trial and the placement in
        turn (a pair compares runs made under the same conditions: right after a load, the
        first runs of every placement are slower than later ones, unequally)."""
        assert self.trial is not None and self.best is not None  # run() set both first
        label, trial = self.trial
        turn = len(self.trial_samples) + len(self.paired_samples)
        side = "trial" if turn == 0 or turn % 2 == 1 else "placed"
        # A run right after the other placement's is not timed (it serves its request): what
        # that one left running (OpenBLAS's workers spin for about 0.1 s after a product,
        # OpenMP's too) slows the next run. An NPU placement's numpy products made the CPU
        # alone's paired runs 2x slower, and ResNet-50 kept the NPU at 1.6x the CPU alone.
        timed = turn == 0 or side == self.last
        self.last, self.committed = side, not timed
        t0 = self.clock()
        if side == "trial":
            before = _compiling(trial)
            try:
                outs = trial.steps.run(arrays)
            except RunTerminatedError:
                raise  # the request was cancelled: the trial is not at fault
            except Exception as e:
                self.decision += f"; {label}, tried, failed ({type(e).__name__})"
                self._end_trial(compiled)
                return self._finish(compiled.steps.run(arrays), compiled)
            elapsed = self.clock() - t0
            # The trial's own compiles (only the session's are started after a request); while
            # one runs the host serves its partitions: a time of the host, not of the trial.
            for sp in trial.specialized.values():
                sp.start_compiles()
            if turn == 0 and self._new_device(trial):  # its one-time work: the next's may
                guess = max(getattr(trial, "predicted", None) or self.ref, self.ref)
                self.first_cost = max(self.first_cost, elapsed - guess)
            if not timed or (turn > 0 and (before or _compiling(trial))):
                return outs, compiled
            self.trial_samples.append(elapsed)  # the first is its warm-up
            return outs, compiled
        outs = compiled.steps.run(arrays)
        if not timed:
            return outs, compiled
        self.paired_samples.append(self.clock() - t0)
        tried, placed = self.trial_samples[1:], self.paired_samples
        verdict = _verdict(tried, placed)
        if verdict is None:
            return outs, compiled
        ratio, low, high = verdict[1:]
        if verdict[0] == "lose" and low <= 1 - MARGIN:  # MAX_PAIRS, not a measured loss
            self.undecided = True
        self.decision += (
            f"; {label}, tried, took {_ms(_stats().median(tried))} against "
            f"{_ms(_stats().median(placed))} ({len(placed)} pairs: {ratio:.2f}x, "
            f"95% bounds {low:.2f}-{high:.2f}x)"
        )
        self._end_trial(compiled)
        if verdict[0] == "win":
            # Taken at once: the requests until the other trials are decided run on it, and
            # those are paired with it from now on (waiting for the last trial left the
            # session on the slower placement for hundreds of runs: 5% budget).
            self.best, self.adopted = (1.0, label, trial), label
            self.best_recipe = self.trial_recipe
            self.ref, self.placed_on = _stats().median(tried), trial
            trial.replaced = f"re-placed to {label}: {self.decision}"
            log.info("anychip: %s", trial.replaced)
            return self._finish(outs, trial)
        return self._finish(outs, compiled)

    def _end_trial(self, compiled: CompiledModel) -> None:
        self.trial, self.paired_samples, self.last = None, [], "placed"
        self.committed = False
        self.done = not self.queue

    def _finish(self, outs: list[Any], compiled: CompiledModel) -> tuple[list[Any], Any]:
        """After the last trial: the fastest measured placement is the session's."""
        if not self.done or self.best is None:  # None: stopped, nothing measured to keep
            return outs, compiled
        if self.session_time > 0:
            share = self.explored / self.session_time
            self.decision += (
                f"; exploring cost {share:.1%} of {self.runs} runs' {self.session_time:.3f} s"
            )
        took, label, best = self.best
        if best is compiled and self.adopted:
            best.replaced = self.decision = f"re-placed to {self.adopted}: {self.decision}"
            if self.on_decided is not None and self.best_recipe is not None and not self.undecided:
                self.on_decided(self.adopted, self.best_recipe, self.decision)
            return outs, compiled
        if best is compiled:
            self.decision = f"kept: {self.decision}"
            if self.on_decided is not None and not self.undecided:
                self.on_decided("the placement", None, self.decision)
            return outs, compiled
        best.replaced = self.decision = f"re-placed to {label}: {self.decision}"
        log.info("anychip: %s", self.decision)
        return outs, best

    def _measured(self, compiled: CompiledModel) -> dict:
        """The placement's figures from its timed runs, written into ``decision`` and each
        partition's info; the factors that correct the cost model."""
        steps = compiled.steps.steps
        best = [min(col) for col in zip(*self.samples)]
        # The whole run, not the sum of its steps' minima: that leaves out what lies between
        # the steps and flatters a placement of many small partitions.
        self.measured = min(self.totals)
        self.ref = _stats().median(self.totals)
        self.first_cost = max(self.first_cost, self._first_run - self.ref)
        self.decision = f"measured {_ms(self.measured)} per run"
        # Partitions and partition steps are in the same order.
        by_part = iter(t for s, t in zip(steps, best) if not s.is_copy)
        for p in compiled.partitions:
            p.info["measured"] = _ms(next(by_part))
        return self._factors(compiled, steps, best)

    def _corrected(self, compiled: CompiledModel, factors: dict) -> CompiledModel | None:
        """The placement the corrected costs predict ``MARGIN`` faster than measured (None:
        the placement stays), with the figures in ``decision``."""
        try:
            candidate = self.recompile(factors)
        except Exception as e:
            self.decision += f"; re-placing with the measured costs failed ({type(e).__name__})"
            return None
        predicted = candidate.predicted
        if _placement(candidate) == _placement(compiled):
            self.decision += "; with the measured costs the placement is unchanged"
        elif predicted is None or predicted >= self.measured * (1 - MARGIN):
            self.decision += f"; with the measured costs another placement is {_ms(predicted)}"
        else:
            self.decision += f"; the measured costs predict {_ms(predicted)} for another"
            return candidate
        return None

    @staticmethod
    def _factors(compiled: CompiledModel, steps: list[Any], best: list[float]) -> dict:
        costs = compiled.costs
        if costs is None:  # placed without the cost model: nothing to correct
            return {}
        measured: dict[str, float] = {}
        estimated: dict[str, float] = {}
        parts = iter(compiled.partitions)
        for step, t in zip(steps, best):
            if step.is_copy:
                continue
            p = next(parts)
            est = _sum(costs.node(n, p.device) for n in p.nodes)
            if est:
                measured[p.device] = measured.get(p.device, 0.0) + t
                estimated[p.device] = estimated.get(p.device, 0.0) + est
        for step, t in zip(steps, best):
            if not step.is_copy:
                continue
            src, dst = step.label.rsplit(" ", 1)[1].split("->")
            for dev in {src, dst} - {compiled.backends[-1].name}:
                est = costs.copy(step.last, dev)
                if est:
                    key = "copy:" + dev
                    measured[key] = measured.get(key, 0.0) + t
                    estimated[key] = estimated.get(key, 0.0) + est
        return {k: measured[k] / estimated[k] for k in measured if estimated.get(k)}


def _verdict(tried: list[float], placed: list[float]) -> tuple[str, float, float, float] | None:
    """Whether a trial is ``MARGIN`` faster than the placement, on the ratios of its paired
    runs (``tried[i] / placed[i]``): ("win" | "lose", the ratio, its 95% bounds) once the
    one-sided 95% confidence bound of the mean log ratio is past ``1 - MARGIN`` (its upper
    bound below for a win, after ``TIMED_RUNS`` pairs at least; its lower bound above for a
    loss), or "lose" after ``MAX_PAIRS`` undecided (the placement stays); None to measure on.
    A pair shares what the machine was doing, so a burst of load mostly cancels in its ratio;
    the bound, not one median, holds on a busy machine."""
    n = min(len(tried), len(placed))
    if n < 2:
        return None
    logs = [math.log(t / p) for t, p in zip(tried, placed) if t > 0 and p > 0]
    if len(logs) < n:
        return ("lose", 1.0, 0.0, math.inf)  # a clock that did not move: nothing to trust
    mean = _stats().fmean(logs)
    half = _T95[min(n - 2, len(_T95) - 1)] * _stats().stdev(logs) / math.sqrt(n)
    ratio, low, high = math.exp(mean), math.exp(mean - half), math.exp(mean + half)
    bound = 1 - MARGIN
    if n >= TIMED_RUNS and high < bound:
        return ("win", ratio, low, high)
    if low > bound or n >= MAX_PAIRS:
        return ("lose", ratio, low, high)
    return None


def _candidates(compiled: CompiledModel) -> list[tuple[str, Any]]:
    """The placements worth measuring beside the cost model's: the host alone, and for each
    other device the most it can take (onnxruntime's PREFER_<device> policy)."""
    host = compiled.backends[-1].name
    factors = dict(compiled.costs.factors) if compiled.costs else {}
    out: list[tuple[str, Any]] = [(f"{host} alone", (factors, [host], "prefer-first"))]
    for b in compiled.backends[:-1]:
        out.append((f"{b.name} first", (factors, [b.name, host], "prefer-first")))
    return out


def _recipe(how: Any) -> tuple | None:
    """``(factors, devices, policy)`` that compiles a queue entry's placement again (another
    process: ``remembered.py``), or None for an entry given compiled."""
    if not isinstance(how, tuple):
        return None
    if how[0] == "corrected":
        return (dict(how[1]), None, None)
    factors, devices, policy = how
    return (dict(factors), list(devices) if devices is not None else None, policy)


def _placement(compiled: CompiledModel) -> dict[str, str]:
    return {n.name: n.meta["device"] for n in compiled.model.graph.nodes}


def predicted_time(compiled: CompiledModel) -> float | None:
    """The corrected cost model's time of ``compiled``'s placement."""
    graph, costs = compiled.model.graph, compiled.costs
    if costs is None:  # placed without the cost model
        return None
    return estimate(
        graph, {n: n.meta["device"] for n in graph.nodes}, costs, compiled.backends[-1].name
    ).seconds


def _stats() -> Any:
    """``statistics`` (which imports fractions and decimal), imported by the first session
    that measures placements, not by every load."""
    import statistics

    return statistics
