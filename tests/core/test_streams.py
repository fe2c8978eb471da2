"""The stream/event contract in the step runner (``core/run/streams.py``): copies issued on a
device's copy stream, ordered by events, give the synchronous path's results, and dropping any
one of the two waits gives wrong ones. The device is simulated: its two streams run nothing
until the host synchronizes, then run every command whose waits are met, the latest issued
first, so two commands that no event orders run in the wrong order."""

from __future__ import annotations

import numpy as np
import pytest

from anychip.core.plugin.streams import COMPUTE, COPY, Streams
from anychip.core.run.steps import Step, StepProgram, _copier, mark_waits


class _Tensor:
    def __init__(self, shape):
        self.data = np.full(shape, np.nan, np.float32)
        self.nbytes = self.data.nbytes


class LazyStreams(Streams):
    """Streams that run their commands only at ``synchronize``, adversarially ordered."""

    def __init__(self):
        self.cmds = {COMPUTE: [], COPY: []}  # (issue number, fn or None, events waited)
        self.done = {COMPUTE: 0, COPY: 0}
        self.issued = 0

    def issue(self, stream, fn, waits=()):
        self.cmds[stream].append((self.issued, fn, tuple(waits)))
        self.issued += 1

    def copy_in(self, array):
        t = _Tensor(array.shape)
        self.issue(COPY, lambda: t.data.__setitem__(..., array))
        return t

    def copy_out(self, tensor):
        out = np.full(tensor.data.shape, np.nan, np.float32)
        self.issue(COPY, lambda: out.__setitem__(..., tensor.data))
        return out

    def record(self, stream):
        return stream, len(self.cmds[stream])

    def wait(self, event, stream):
        self.issue(stream, None, [event])

    def synchronize(self, event=None):
        while event is None or self.done[event[0]] < event[1]:
            ready = [
                s
                for s in (COMPUTE, COPY)
                if self.done[s] < len(self.cmds[s])
                and all(self.done[e[0]] >= e[1] for e in self.cmds[s][self.done[s]][2])
            ]
            if not ready:
                assert event is None, "deadlock: an event that can never complete"
                return
            s = max(ready, key=lambda s: self.cmds[s][self.done[s]][0])  # the latest first
            fn = self.cmds[s][self.done[s]][1]
            if fn is not None:
                fn()
            self.done[s] += 1


class _Host:
    name = "cpu"
    host_memory = True


class _Lazy:
    name = "lazy"
    host_memory = False

    def __init__(self, streams):
        self._streams = streams

    def streams(self):
        return self._streams

    def to_device(self, array):  # the synchronous path
        t = _Tensor(array.shape)
        t.data[...] = array
        return t

    def to_host(self, t):
        self._streams.synchronize()
        return t.data.copy()

    def kernel(self, f):
        """A partition of one kernel issued on the compute stream."""

        def run(ins):
            out = _Tensor(ins[0].data.shape)
            self._streams.issue(COMPUTE, lambda: out.data.__setitem__(..., f(ins[0].data)))
            return [out]

        return run


def _program(dev, host, use_streams=True):
    """x -> lazy (2x+1) -> host (+1) -> lazy (3x) -> host: slots 0..7."""
    if not use_streams:
        dev.streams = lambda: None
    prog = StepProgram()
    prog.nslots = 8

    def copy(src, dst, i, o):
        fn, pending = _copier(src, dst)
        st = Step(True, fn, [i], [o], f"copy {src.name}->{dst.name}", dst.name)
        st.pending = pending
        return st

    prog.steps = [
        copy(host, dev, 0, 1),
        Step(False, dev.kernel(lambda a: 2 * a + 1), [1], [2], "p0", "lazy"),
        copy(dev, host, 2, 3),
        Step(False, lambda ins: [ins[0] + 1], [3], [4], "p1", "cpu"),
        copy(host, dev, 4, 5),
        Step(False, dev.kernel(lambda a: 3 * a), [5], [6], "p2", "lazy"),
        copy(dev, host, 6, 7),
    ]
    mark_waits(prog.steps)
    prog.feed_slots = [0]
    prog.output_slots = [7, 4]
    return prog


def _expected(x):
    return [3 * (2 * x + 2), 2 * x + 2]


@pytest.fixture
def x():
    return np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)


def test_streams_give_the_synchronous_results(x):
    for use in (True, False):
        dev = _Lazy(LazyStreams())
        prog = _program(dev, _Host(), use)
        assert [st.pending for st in prog.steps if st.is_copy] == [False, use, False, use]
        for _ in range(2):
            got = prog.run([x])
            for g, w in zip(got, _expected(x)):
                np.testing.assert_allclose(g, w, rtol=1e-6)


def test_the_host_reads_a_download_only_after_its_event(x):
    dev = _Lazy(LazyStreams())
    prog = _program(dev, _Host())
    assert prog.steps[3].waits == (3,)  # the host partition waits for the download
    got = prog.run([x])
    assert not any(np.isnan(g).any() for g in got)
    assert dev._streams.done[COPY] == len(dev._streams.cmds[COPY])  # all synchronized


@pytest.mark.parametrize("dropped", ["copy->compute", "compute->copy"])
def test_a_dropped_wait_gives_wrong_results(x, dropped):
    """The simulator catches a missing event: a kernel reading an upload it did not wait for,
    or a download reading a tensor before the kernel that writes it."""
    streams = LazyStreams()
    real_wait = streams.wait

    def wait(event, stream):
        if f"{event[0]}->{stream}" != dropped:
            real_wait(event, stream)

    streams.wait = wait
    got = _program(_Lazy(streams), _Host()).run([x])
    assert np.isnan(got[0]).any()


def test_a_failed_run_synchronizes_pending_copies(x):
    """A download still pending when a later step fails is waited for before the error."""
    streams = LazyStreams()
    dev, host = _Lazy(streams), _Host()
    prog = _program(dev, host)

    def boom(ins):
        raise RuntimeError("kernel failed")

    # after the last download (pending, an output), a host step that fails
    prog.steps.append(Step(False, boom, [0], [4], "p3", "cpu"))
    mark_waits(prog.steps)
    with pytest.raises(RuntimeError, match="kernel failed"):
        prog.run([x])
    assert streams.done[COPY] == len(streams.cmds[COPY])  # nothing left in flight
    assert streams.done[COMPUTE] == len(streams.cmds[COMPUTE])
