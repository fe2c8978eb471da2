"""Run-time feedback: the session's first runs measured, the estimates corrected, and one
re-placement when the corrected estimates predict a better one.

Run 1 is a warm-up. Runs 2 to ``1 + TIMED_RUNS`` time every step (each partition and each
copy). Then, per device, the *factor* measured / estimated time of its partitions, and per
device link the same for its copies, corrects the cost model (``cost_search.Costs``), and the
model is placed again with the corrected costs. When that placement differs and is predicted
at least ``MARGIN`` faster than what the runs measured, the session switches to it, once
(PaddlePaddle's elastic re-partition, inside one process).

Where the estimate cannot be trusted (a dynamic shape leaves it unknown, or the runs took more
than twice the prediction) and the placement uses a device other than the host, the host alone
is *tried*: compiled, warmed up and timed over the next runs (which it serves), and kept when
measured ``MARGIN`` faster. Either way the partitions' info and ``Session.placement()`` say
what was measured and decided. Outputs do not depend on which placement ran beyond the
devices' floating-point differences.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from anychip.core.cost_search import MARGIN, Costs, estimate

if TYPE_CHECKING:
    from anychip.core.compiler import CompiledModel

__all__ = ["Feedback", "explain_partitions", "predicted_time", "TIMED_RUNS"]

TIMED_RUNS = 3
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


def _sum(times: Any) -> float | None:
    total = 0.0
    for t in times:
        if t is None:
            return None
        total += t
    return total


class Feedback:
    """The measuring and the one re-placement of a session (see the module docstring)."""

    def __init__(self, recompile: Any) -> None:
        #: ``recompile(factors, host_only=False) -> CompiledModel``: the model placed with
        #: corrected costs (or on the host alone, for a trial).
        self.recompile = recompile
        self.runs = 0
        self.samples: list[list[float]] = []
        self.trial: CompiledModel | None = None
        self.trial_samples: list[float] = []
        self.measured = 0.0
        self.done = False
        self.decision = ""

    def run(self, compiled: CompiledModel, arrays: list[Any]) -> tuple[list[Any], Any]:
        """One run of ``compiled``; returns its outputs and the compiled model to use from
        now on (a new one after a re-placement)."""
        self.runs += 1
        if self.trial is not None:
            return self._run_trial(compiled, arrays)
        if self.runs == 1:
            return compiled.steps.run(arrays), compiled
        times: list[float] = []
        outs = compiled.steps.run(arrays, times)
        self.samples.append(times)
        if len(self.samples) < TIMED_RUNS:
            return outs, compiled
        chosen = self._decide(compiled)
        if chosen is compiled and self._worth_a_trial(compiled):
            try:
                self.trial = self.recompile(dict(compiled.costs.factors), host_only=True)
            except Exception as e:  # noqa: BLE001 - no trial; the placement stays
                self.decision += f"; no trial of the host alone ({type(e).__name__}: {e})"
        self.done = self.trial is None
        return outs, chosen

    def _worth_a_trial(self, compiled: CompiledModel) -> bool:
        host = compiled.backends[-1].name
        if all(p.device == host for p in compiled.partitions):
            return False
        predicted = compiled.predicted
        return predicted is None or self.measured > 2 * predicted

    def _run_trial(self, compiled: CompiledModel, arrays: list[Any]) -> tuple[list[Any], Any]:
        trial = self.trial
        t0 = time.perf_counter()
        outs = trial.steps.run(arrays)
        elapsed = time.perf_counter() - t0
        if self.runs == 1 + TIMED_RUNS + 1:
            return outs, compiled  # the trial's warm-up
        self.trial_samples.append(elapsed)
        if len(self.trial_samples) < TIMED_RUNS:
            return outs, compiled
        self.trial, self.done = None, True
        best = min(self.trial_samples)
        host = trial.backends[-1].name
        if best < self.measured * (1 - MARGIN):
            trial.replaced = self.decision = (
                f"re-placed: measured {_ms(self.measured)} per run; {host} alone, tried, "
                f"took {_ms(best)}"
            )
            log.info("anychip: %s", self.decision)
            return outs, trial
        self.decision += f"; {host} alone, tried, took {_ms(best)}: kept"
        return outs, compiled

    def _decide(self, compiled: CompiledModel) -> CompiledModel:
        steps = compiled.steps.steps
        best = [min(col) for col in zip(*self.samples)]
        self.measured = measured_total = sum(best)
        factors = self._factors(compiled, steps, best)
        # Partitions and partition steps are in the same order.
        by_part = iter(t for s, t in zip(steps, best) if not s.is_copy)
        for p in compiled.partitions:
            p.info["measured"] = _ms(next(by_part))
        try:
            candidate = self.recompile(factors)
        except Exception as e:  # noqa: BLE001 - the current placement stays; say why
            self.decision = f"kept: re-placing failed ({type(e).__name__}: {e})"
            return compiled
        same = _placement(candidate) == _placement(compiled)
        predicted = candidate.predicted
        if same or predicted is None or predicted >= measured_total * (1 - MARGIN):
            self.decision = (
                f"kept: measured {_ms(measured_total)} per run; with the measured costs the "
                + ("placement is unchanged" if same else f"alternative is {_ms(predicted)}")
            )
            return compiled
        candidate.replaced = self.decision = (
            f"re-placed: measured {_ms(measured_total)} per run, the placement with measured "
            f"costs is predicted {_ms(predicted)}"
        )
        log.info("anychip: %s", self.decision)
        return candidate

    @staticmethod
    def _factors(compiled: CompiledModel, steps: list[Any], best: list[float]) -> dict:
        costs = compiled.costs
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


def _placement(compiled: CompiledModel) -> dict[str, str]:
    return {n.name: n.meta["device"] for n in compiled.model.graph.nodes}


def predicted_time(compiled: CompiledModel) -> float | None:
    """The corrected cost model's time of ``compiled``'s placement."""
    graph = compiled.model.graph
    return estimate(
        graph,
        {n: n.meta["device"] for n in graph.nodes},
        compiled.costs,
        compiled.backends[-1].name,
    ).seconds
