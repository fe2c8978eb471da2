"""The OpenCL streams (``driver/streams.ClStreams``, opt-in): a multi-partition session gives the
synchronous path's outputs, and each of the runtime's two events really orders the queues: with
one queue held back by a user event, a dropped wait would let the other read stale data."""

from __future__ import annotations

import time

import numpy as np
import pyopencl as cl
import pytest

import anychip
from anychip.backends.opencl.driver.streams import ClStreams
from anychip.core.plugin.streams import COMPUTE, COPY
from anychip.core.run import streams as run_streams
from tests.models import transformer_layer


@pytest.fixture
def streams(cl_device):
    had = cl_device.copy_queue is not None
    s = ClStreams(cl_device)
    try:
        yield s
    finally:
        cl_device.finish()
        if not had:
            cl_device.use_copy_queue(False)


def _hold(queue, ctx):
    """A user event every later command of ``queue`` waits for."""
    gate = cl.UserEvent(ctx)
    cl.enqueue_barrier(queue, wait_for=[gate])
    return gate


def test_a_multi_partition_session_gives_the_synchronous_outputs(cl_device):
    model = transformer_layer()
    x = np.random.default_rng(1).standard_normal((1, 64, 256)).astype(np.float32)
    kw = dict(devices=["opencl", "cpu"], placement={"Softmax": "cpu", "ffn/*": "cpu"})
    sync = anychip.load(model, cost_model=False, **kw)
    on = anychip.load(model, cost_model=False, device_options={"opencl": {"streams": True}}, **kw)
    pending = [st for st in on.compiled.steps.steps if st.is_copy and st.pending]
    assert pending and not any(st.pending for st in sync.compiled.steps.steps)
    assert len({st.device for st in on.compiled.steps.steps if not st.is_copy}) == 2
    ref = sync.run(None, {"x": x})[0]
    for _ in range(3):
        np.testing.assert_array_equal(on.run(None, {"x": x})[0], ref)
    on.close()
    sync.close()
    cl_device.use_copy_queue(False)


def test_a_kernel_waits_for_the_upload_before_it(streams):
    d = streams.device
    rng = np.random.default_rng(2)
    new = rng.standard_normal(4096).astype(np.float32)
    gate = _hold(d.copy_queue, d.context)
    t = run_streams._upload("opencl", streams, new)  # held back on the copy queue
    y = d.copy(t)  # a kernel-side copy on the compute queue: must wait for the upload
    d.queue.flush()
    time.sleep(0.2)  # without the wait, the copy would have run by now on stale data
    gate.set_status(cl.command_execution_status.COMPLETE)
    np.testing.assert_array_equal(y.numpy(), new)
    t.release()
    y.release()


def test_a_download_waits_for_the_kernel_before_it(streams):
    d = streams.device
    src = np.random.default_rng(3).standard_normal(4096).astype(np.float32)
    a = d.upload(src)
    d.finish()
    gate = _hold(d.queue, d.context)
    y = d.copy(a)  # held back on the compute queue
    out, sync = run_streams._download("opencl", streams, y)
    d.copy_queue.flush()
    time.sleep(0.2)  # without the wait, the download would have read y's stale buffer
    gate.set_status(cl.command_execution_status.COMPLETE)
    sync()
    np.testing.assert_array_equal(out, src)
    a.release()
    y.release()


def test_a_released_tensor_a_download_reads_is_not_overwritten_first(streams):
    d = streams.device
    src = np.random.default_rng(4).standard_normal(4096).astype(np.float32)
    a = d.upload(src)
    d.finish()
    gate = _hold(d.copy_queue, d.context)
    out = streams.copy_out(a)  # held back on the copy queue
    done = streams.record(COPY)
    buf = id(a.buffer)
    a.release()
    b = d.upload(np.zeros(4096, np.float32))  # the pool hands the same buffer back
    assert id(b.buffer) == buf
    d.queue.flush()
    time.sleep(0.2)
    gate.set_status(cl.command_execution_status.COMPLETE)
    streams.synchronize(done)
    np.testing.assert_array_equal(out, src)
    b.release()


def test_events_and_synchronize(streams):
    ev = streams.record(COMPUTE)
    streams.wait(ev, COPY)
    streams.synchronize(ev)
    assert (
        ev.get_info(cl.event_info.COMMAND_EXECUTION_STATUS) == cl.command_execution_status.COMPLETE
    )
    streams.synchronize()


def test_streams_are_off_by_default_and_options_are_checked():
    from anychip.core.plugin.host import get_registry
    from anychip.errors import DeviceError

    backend = get_registry().backends["opencl"]
    assert backend.streams() is None
    with pytest.raises(DeviceError, match="streams"):
        backend.configure(stream=True)
