"""Large buffers on transparent huge pages (``core/memory/hugepages.py``): from ``MIN_BYTES`` a
private mapping advised for huge pages, starting on a 2 MiB boundary, writable, of the size
asked; plain numpy arrays under it and with ``ANYCHIP_HUGEPAGES=0``; oneDNN's prepared weights
made there; a session on them gives onnxruntime's answer."""

from __future__ import annotations

import re

import numpy as np
import pytest

from anychip.core.memory import hugepages


def _vm_flags(address: int) -> list[str]:
    """The ``VmFlags`` of the mapping that holds ``address`` (``/proc/self/smaps``)."""
    lines = open("/proc/self/smaps").read().splitlines()
    inside = False
    for line in lines:
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if m:
            inside = int(m.group(1), 16) <= address < int(m.group(2), 16)
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


needs_thp = pytest.mark.skipif(
    not hugepages.enabled(), reason="transparent huge pages are off on this kernel"
)


@needs_thp
def test_a_large_buffer_is_an_advised_private_mapping_on_a_huge_page_boundary(monkeypatch):
    monkeypatch.delenv("ANYCHIP_HUGEPAGES", raising=False)
    n = 3 * hugepages.HUGE + 12345
    a = hugepages.empty(n)
    assert a.dtype == np.uint8 and a.shape == (n,) and a.flags.writeable
    assert a.ctypes.data % hugepages.HUGE == 0
    flags = _vm_flags(a.ctypes.data)
    assert "hg" in flags  # MADV_HUGEPAGE applied
    assert "sh" not in flags  # private: a shared mapping gets no huge pages
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, n, dtype=np.uint8)
    a[:] = data
    np.testing.assert_array_equal(a, data)


def test_small_buffers_and_the_switch_give_numpy_arrays(monkeypatch):
    small = hugepages.empty(hugepages.MIN_BYTES - 1)
    assert small.shape == (hugepages.MIN_BYTES - 1,) and small.base is None
    monkeypatch.setenv("ANYCHIP_HUGEPAGES", "0")
    assert not hugepages.enabled()
    off = hugepages.empty(4 * hugepages.HUGE)
    assert off.shape == (4 * hugepages.HUGE,) and off.base is None  # np.empty's own


@needs_thp
def test_onednn_prepared_weights_and_a_session_on_huge_pages(monkeypatch):
    from anychip.backends.cpu.onednn import _lib
    from anychip.backends.cpu.onednn import _prim as P

    if not _lib.available():
        pytest.skip(_lib.unavailable_reason())
    monkeypatch.delenv("ANYCHIP_HUGEPAGES", raising=False)
    big = P.empty_for(P.md((512, 512, 3, 3), P.plain_tag(4)))
    assert big.dtype == np.float32 and big.size >= 512 * 512 * 9
    assert big.ctypes.data % hugepages.HUGE == 0 and "hg" in _vm_flags(big.ctypes.data)

    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    import anychip

    rng = np.random.default_rng(1)
    w = (rng.standard_normal((256, 128, 3, 3)) * 0.05).astype(np.float32)  # 1.2 MB
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 40, 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session = anychip.load(model, devices=["cpu"])
    for _ in range(6):  # through the recording and its replays
        x = rng.standard_normal((1, 128, 40, 40)).astype(np.float32)
        got = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
