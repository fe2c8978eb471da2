"""Outputs kept on a device across runs (core/api/device_values.py): ``bind_output(name,
device)`` hands the device tensor over instead of copying it to the host, and a run fed that
``DeviceValue`` copies nothing in; the device's copies are counted at its driver."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.core.api.device_values import DeviceValue
from anychip.errors import AnychipError, InputError

RNG = np.random.default_rng(440)
N = 32


def _chain(layers: int = 3) -> bytes:
    """y = Tanh(... Tanh(x @ W0 + b0) ...): [N, N] in and out, so y feeds the next run."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, N])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, N])
    nodes, inits, prev = [], [], "x"
    rng = np.random.default_rng(layers)  # the same model at every call
    for i in range(layers):
        w = (rng.standard_normal((N, N)) / np.sqrt(N)).astype(np.float32)
        b = rng.standard_normal(N).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        out = "y" if i == layers - 1 else f"t{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]))
        nodes.append(helper.make_node("Tanh", [f"a{i}"], [out]))
        prev = out
    graph = helper.make_graph(nodes, "chain", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _ort(model: bytes, x: np.ndarray) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


class _Counted:
    """The xpu backend's copies in and out, counted where they reach its driver."""

    def __init__(self, backend, monkeypatch) -> None:
        self.ins = self.outs = 0
        copy_in, copy_out = backend._copy_in, backend._copy_out

        def counted_in(a):
            self.ins += 1
            return copy_in(a)

        def counted_out(t):
            self.outs += 1
            return copy_out(t)

        monkeypatch.setattr(backend, "_copy_in", counted_in)
        monkeypatch.setattr(backend, "_copy_out", counted_out)

    def take(self) -> tuple[int, int]:
        got, self.ins, self.outs = (self.ins, self.outs), 0, 0
        return got


def _session(device: str = "xpu") -> tuple[anychip.Session, object]:
    """The chain wholly on ``device`` (the xpu runs kernels; the npu compiles the graph)."""
    sess = anychip.load(
        _chain(), devices=[device, "cpu"], cost_model=False, strict=True, background_compile=False
    )
    assert set(sess.placement().by_device()) == {device}, sess.placement().by_device()
    return sess, next(b for b in sess.compiled.backends if b.name == device)


@pytest.mark.parametrize("device", ["xpu", "npu"])
def test_an_output_kept_on_the_device_feeds_the_next_run_without_copies(
    monkeypatch, device: str
) -> None:
    model = _chain()
    sess, xpu = _session(device)
    copies = _Counted(xpu, monkeypatch)
    in_use = xpu.memory_stats().in_use
    x = RNG.standard_normal((N, N)).astype(np.float32)
    _close(sess.run(None, {"x": x})[0], _ort(model, x))
    assert copies.take() == (1, 1)  # the usual run: x in, y out

    binding = sess.io_binding()
    binding.bind_input("x", x)
    binding.bind_output("y", device)
    sess.run_with_iobinding(binding)
    (y1,) = binding.get_outputs()
    assert isinstance(y1, DeviceValue) and y1.device_name() == device
    assert y1.shape() == [N, N] and y1.data_type() == "tensor(float32)"
    assert copies.take() == (1, 0)  # x in; y stays on the device

    want = _ort(model, x)
    for _ in range(3):  # the last output fed back in: nothing crosses the host link
        binding.bind_input("x", binding.get_outputs()[0])
        sess.run_with_iobinding(binding)
        assert copies.take() == (0, 0)
        want = _ort(model, want)
    _close(binding.copy_outputs_to_cpu()[0], want)
    assert copies.take() == (0, 1)  # the one copy out, asked for
    # the session's copy steps (x in, y out) counted only the copies made
    assert [st.runs for st in sess.compiled.steps.copy_steps] == [2, 1]

    # Session.run takes a DeviceValue feed too, and the step counters saw only real copies
    y = binding.get_outputs()[0]
    _close(sess.run(None, {"x": y})[0], _ort(model, want))
    assert copies.take() == (0, 1)
    assert [st.runs for st in sess.compiled.steps.copy_steps] == [2, 2]
    # what the values held goes back to the device when they are dropped
    del binding, y, y1
    gc.collect()
    assert xpu.memory_stats().in_use == in_use


def test_an_output_computed_on_the_host_is_copied_onto_the_device_once(monkeypatch) -> None:
    model = _chain()
    sess = anychip.load(model, devices=["xpu", "cpu"], cost_model=False, placement={"Tanh": "cpu"})
    xpu = next(b for b in sess.compiled.backends if b.name == "xpu")
    copies = _Counted(xpu, monkeypatch)
    x = RNG.standard_normal((N, N)).astype(np.float32)
    binding = sess.io_binding()
    binding.bind_input("x", x)
    binding.bind_output("y", "xpu")
    sess.run_with_iobinding(binding)
    ins, outs = copies.take()
    (y,) = binding.get_outputs()
    assert y.device_name() == "xpu"
    _close(y.numpy(), _ort(model, x))
    assert ins == 3 + 1 and outs == 3  # 3 partitions' x-side copies, y onto the xpu


def test_bad_bindings_are_refused() -> None:
    sess, _ = _session()
    binding = sess.io_binding()
    with pytest.raises(InputError, match="'npu' is not among the session's devices"):
        binding.bind_output("y", "npu")
    with pytest.raises(InputError, match="a numpy array, a device name or None"):
        binding.bind_output("y", [1.0])
    x = RNG.standard_normal((N, N)).astype(np.float32)
    binding.bind_input("x", x)
    binding.bind_output("y", "xpu")
    sess.run_with_iobinding(binding)
    (y,) = binding.get_outputs()
    y.release()
    with pytest.raises(AnychipError, match="was released"):
        y.numpy()
