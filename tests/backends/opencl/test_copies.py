"""Host-to-device copies on a second queue (``ClDevice.use_copy_queue``): the results are those
of the one-queue path, the events order a copy after the kernels still reading its buffer and
before the kernels reading its data, and the overlap probe reports what the device did."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pyopencl as cl
import pytest

import anychip
from anychip.backends.opencl.driver.overlap import copy_overlap
from anychip.backends.opencl.kernels.op_matmul import matmul
from tests.models import transformer_layer


@pytest.fixture
def copy_queue(cl_device):
    cl_device.use_copy_queue(True)
    try:
        yield cl_device
    finally:
        cl_device.use_copy_queue(False)


@pytest.mark.slow  # about 1 s: the kernel must run long enough for the copy to meet it
def test_an_upload_into_a_buffer_a_queued_kernel_reads_waits_for_it(copy_queue):
    d = copy_queue
    rng = np.random.default_rng(0)
    a, b, new = (rng.standard_normal((768, 768)).astype(np.float32) for _ in range(3))
    ta, tb = d.upload(a), d.upload(b)
    y = matmul(ta, tb)  # queued on the compute queue, reads ta's buffer in place
    d.queue.flush()  # running while the copy below is enqueued
    old = id(ta.buffer)
    ta.release()
    t2 = d.upload(new)  # the pool hands the same buffer back
    assert id(t2.buffer) == old
    assert d.last_copy.command_queue == d.copy_queue
    np.testing.assert_allclose(y.numpy(), a @ b, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(t2.numpy(), new)
    # a kernel enqueued right after an upload reads the new data (barrier on the copy)
    t3 = d.upload(b)
    y2 = matmul(t2, t3)
    np.testing.assert_allclose(y2.numpy(), new @ b, rtol=1e-4, atol=1e-3)
    for t in (tb, t2, t3, y, y2):
        t.release()


def test_a_session_on_two_queues_gives_the_same_outputs(copy_queue):
    model = transformer_layer()
    x = np.random.default_rng(1).standard_normal((1, 64, 256)).astype(np.float32)
    (ref,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    sess = anychip.load(model, devices=["opencl"], strict=True)
    for _ in range(2):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-4)
    assert copy_queue.last_copy is not None
    status = copy_queue.last_copy.get_info(cl.event_info.COMMAND_EXECUTION_STATUS)
    assert status == cl.command_execution_status.COMPLETE


def test_one_queue_after_switching_back(cl_device):
    cl_device.use_copy_queue(True)
    cl_device.use_copy_queue(False)
    assert cl_device.copy_queue is None
    x = np.arange(10, dtype=np.float32)
    np.testing.assert_array_equal(cl_device.upload(x).numpy(), x)


def test_the_overlap_probe_reports_device_timings(cl_device):
    r = copy_overlap(cl_device, nbytes=1 << 20, iters=500)
    assert isinstance(r["overlap"], bool)
    assert r["kernel_ms"] > 0 and r["copy_ms"] > 0
    assert 0 <= r["shared_ms"] <= min(r["kernel_ms"], r["copy_ms"]) + 1e-9
    assert r["overlap"] == (r["shared_ms"] > 0)
