"""``core/compile/gcpause.py``: the collector is paused during a load and back as it was after it,
whatever the load's outcome, with nested and concurrent loads counted."""

from __future__ import annotations

import gc
import threading

import pytest

import anychip
from anychip.core.api import session as session_mod
from anychip.core.compile.gcpause import gc_paused
from tests.core.test_placement import three_nodes


@pytest.fixture(autouse=True)
def _restore():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_a_load_pauses_the_collector_and_gives_it_back(monkeypatch):
    seen = []
    real = session_mod.Session.__init__

    def spy(self, *a, **k):
        seen.append(gc.isenabled())
        real(self, *a, **k)

    monkeypatch.setattr(session_mod.Session, "__init__", spy)
    gc.enable()
    anychip.load(three_nodes(), devices=["cpu"])
    assert seen == [False] and gc.isenabled()


def test_a_failing_load_gives_it_back_too():
    gc.enable()
    with pytest.raises(anychip.AnychipError):
        anychip.load(b"not a model", devices=["cpu"])
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled():
    gc.disable()
    anychip.load(three_nodes(), devices=["cpu"])
    assert not gc.isenabled()


def test_overlapping_pauses_enable_it_when_the_last_one_leaves():
    gc.enable()
    inside, leave = threading.Event(), threading.Event()

    def other():
        with gc_paused():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    with gc_paused():
        t.start()
        inside.wait(10)
    assert not gc.isenabled()  # the other thread's load is still under way
    leave.set()
    t.join(10)
    assert gc.isenabled()
