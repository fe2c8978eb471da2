"""The benchmarks' progress (``bench/_timing.py``): each loop is a ``core.progress`` task, so
the CLI's rich bars show it in a terminal and nothing changes elsewhere."""

from __future__ import annotations

import contextlib

from anychip.core.progress import reporting_to
from bench._timing import progress


def test_a_benchmark_loop_reports_its_total_and_each_step():
    seen = []

    @contextlib.contextmanager
    def listener(description, total):
        seen.append((description, total, []))
        yield lambda n=1: seen[-1][2].append(n)

    with reporting_to(listener):
        assert list(progress(range(3), "rounds")) == [0, 1, 2]
        assert list(progress(iter("ab"), "models")) == ["a", "b"]  # no len(): counted first
    assert seen == [("rounds", 3, [1, 1, 1]), ("models", 2, [1, 1])]


def test_without_a_listener_the_items_pass_through():
    assert list(progress({"x": 1}.items(), "models", 1)) == [("x", 1)]
