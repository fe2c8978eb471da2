"""Compiling for the NPU: device memory, copies, the memory plan, out-of-memory, capability."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from onnx import TensorProto
from onnx import helper as h

from anychip.backends.npu_stub.backend import NpuBackend
from anychip.backends.npu_stub.driver import NpuTensor
from anychip.errors import DeviceError, OutOfMemoryError, UnsupportedOpError
from tests.backends.npu_stub.conftest import convnet, ir_graph, run_on_npu, single_op


def test_copies_are_real_bytes():
    npu = NpuBackend(memory=1 << 20)
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = npu.to_device(host)
    assert isinstance(t, NpuTensor) and t.shape == (3, 4)
    assert not np.shares_memory(npu.view(t), host)
    host[:] = -1  # the device copy does not follow the host array
    back = npu.to_host(t)
    np.testing.assert_array_equal(back, np.arange(12, dtype=np.float32).reshape(3, 4))
    back[:] = 7  # nor does the device follow the copied-out array
    np.testing.assert_array_equal(npu.to_host(t)[0], [0, 1, 2, 3])
    used = npu.memory_stats().in_use
    npu.release(t)
    assert npu.memory_stats().in_use == used - 64
    with pytest.raises(DeviceError, match="already released"):
        npu.to_host(t)


def test_tampering_with_device_memory_changes_the_result(x):
    graph = ir_graph(convnet())
    npu = NpuBackend(memory=16 << 20)
    compiled = npu.compile(graph)
    t = npu.to_device(x)
    clean = npu.to_host(compiled.run([t])[0])
    raw = npu.memory.data[t.offset : t.offset + t.nbytes]
    raw[:] = 0  # overwrite the input's bytes inside the device array
    tampered = npu.to_host(compiled.run([t])[0])
    zeros = npu.to_host(compiled.run([npu.to_device(np.zeros_like(x))])[0])
    assert not np.allclose(clean, tampered)
    np.testing.assert_array_equal(tampered, zeros)


def test_weights_live_in_device_memory_and_are_freed_with_the_executable(x):
    graph = ir_graph(convnet())
    npu = NpuBackend(memory=16 << 20)
    compiled = npu.compile(graph)
    info = compiled.info
    in_use = npu.memory_stats().in_use
    assert in_use >= info["weights_bytes"] + info["activation_bytes"]
    # Wiping device memory (weights included) changes the result; host initializers do not.
    t = npu.to_device(x)
    out = compiled.run([t])[0]
    before = npu.to_host(out)
    npu.memory.data[:] = 0
    npu.view(t)[...] = x
    out2 = compiled.run([t])[0]
    after = npu.to_host(out2)
    assert not np.allclose(before, after)
    for tensor in (t, out, out2):
        npu.release(tensor)
    del compiled
    gc.collect()
    assert npu.memory_stats().in_use == 0


def test_outputs_are_fresh_device_tensors_released_by_the_caller(x):
    graph = ir_graph(convnet())
    npu = NpuBackend(memory=16 << 20)
    compiled = npu.compile(graph)
    base = npu.memory_stats().in_use
    t = npu.to_device(x)
    out1 = compiled.run([t])[0]
    out2 = compiled.run([t])[0]
    assert out1.offset != out2.offset
    np.testing.assert_array_equal(npu.to_host(out1), npu.to_host(out2))
    for tensor in (t, out1, out2):
        npu.release(tensor)
    assert npu.memory_stats().in_use == base


def test_memory_plan_reuses_activation_memory():
    graph = ir_graph(convnet())
    compiled = NpuBackend(memory=16 << 20).compile(graph)
    info = compiled.info
    # Every intermediate tensor summed is larger than the planned block: memory is reused.
    total = sum(
        v.nbytes for n in graph.nodes for v in n.outputs if v is not None and v not in graph.outputs
    )
    assert info["activation_lower_bound"] <= info["activation_bytes"] < total


def test_too_small_memory_raises_out_of_memory_with_figures():
    graph = ir_graph(convnet())
    npu = NpuBackend().configure(memory=8192)
    with pytest.raises(OutOfMemoryError) as err:
        npu.compile(graph)
    e = err.value
    assert e.device == "npu" and e.capacity == 8192 and e.need > 8192 and e.in_use == 0
    assert "does not fit in NPU memory" in str(e) and "weights" in str(e)
    assert npu.memory_stats().in_use == 0  # nothing stays allocated


def test_compile_rejects_nodes_it_cannot_run():
    model, _ = single_op("Sin", [np.ones((2, 2), np.float32)])
    with pytest.raises(UnsupportedOpError, match="op Sin not in the NPU op set"):
        NpuBackend(memory=1 << 20).compile(ir_graph(model))


def test_input_from_another_npu_instance_is_rejected(x):
    graph = ir_graph(convnet())
    a, b = NpuBackend(memory=16 << 20), NpuBackend(memory=16 << 20)
    compiled = a.compile(graph)
    with pytest.raises(DeviceError, match="another NPU instance"):
        compiled.run([b.to_device(x)])


def _reason(op, inputs, consts=None, **attributes):
    model, _ = single_op(op, inputs, consts=consts, **attributes)
    return NpuBackend().check_node(ir_graph(model).nodes[0])


def test_check_node_reasons():
    f = np.ones((1, 2, 4, 4), np.float32)
    w = np.ones((2, 2, 3, 3), np.float32)
    assert _reason("Relu", [f]) is None
    assert _reason("Sin", [f]) == "op Sin not in the NPU op set"
    why = _reason("Conv", [f, w], consts={1: w}, auto_pad="SAME_LOWER")
    assert why == "attribute auto_pad=SAME_LOWER not supported"
    assert _reason("Conv", [f, w], consts={1: w}, auto_pad="SAME_UPPER") is None
    assert _reason("Conv", [f[0], w[0]], consts={1: w[0]}) is None  # 1-D: lower_conv1d
    conv3d = _reason("Conv", [f[None], w[..., None]], consts={1: w[..., None]})
    assert conv3d.startswith("only 1-D or 2-D Conv runs on the NPU")
    pool1d = _reason("MaxPool", [f[0]], kernel_shape=[2])
    assert pool1d.startswith("only 2-D MaxPool runs on the NPU")
    shape = np.array([1, 32], np.int64)
    assert _reason("Reshape", [f, shape], consts={1: shape}) is None
    i64 = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"])],
        "g",
        [h.make_tensor_value_info("x", TensorProto.INT64, [2])],
        [h.make_tensor_value_info("y", TensorProto.INT64, [2])],
    )
    node = ir_graph(h.make_model(i64, opset_imports=[h.make_opsetid("", 17)])).nodes[0]
    assert NpuBackend().check_node(node).startswith("dtype int64 not supported")


def test_reshape_takes_a_runtime_shape_clip_bounds_must_be_constant():
    """Under the static shape policy a compiled Reshape knows its output shape (the runtime
    traced it), so its shape input may be computed (transformer exports compute it); Clip's
    bounds are still read at compile time."""
    g = h.make_graph(
        [h.make_node("Reshape", ["x", "s"], ["y"])],
        "g",
        [
            h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            h.make_tensor_value_info("s", TensorProto.INT64, [2]),
        ],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
    )
    node = ir_graph(h.make_model(g, opset_imports=[h.make_opsetid("", 17)])).nodes[0]
    assert NpuBackend().check_node(node) is None
    g = h.make_graph(
        [h.make_node("Clip", ["x", "lo"], ["y"])],
        "g",
        [
            h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            h.make_tensor_value_info("lo", TensorProto.FLOAT, []),
        ],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    node = ir_graph(h.make_model(g, opset_imports=[h.make_opsetid("", 17)])).nodes[0]
    assert NpuBackend().check_node(node) == "Clip input 1 (lo) must be a constant on the NPU"


def test_run_on_npu_helper_matches_numpy():
    a = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    model, feeds = single_op("Sigmoid", [a])
    (got,) = run_on_npu(ir_graph(model), feeds)
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-a)), rtol=1e-6)
