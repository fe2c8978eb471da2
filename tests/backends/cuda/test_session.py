"""A session naming ``cuda`` on this machine: it loads and runs, and the placement report says
why each node went elsewhere (on a machine with a GPU, the nodes are on cuda instead)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h

import anychip
from anychip.cli.main import main
from anychip.core.plugin.host import get_registry


def _model() -> tuple[bytes, np.ndarray]:
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "w")
    g = h.make_graph(
        [h.make_node("MatMul", ["x", "w"], ["y"]), h.make_node("Gelu", ["y"], ["z"])],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [3, 8])],
        [h.make_tensor_value_info("z", T.FLOAT, [3, 5])],
        [w],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 20)])
    return m.SerializeToString(), rng.standard_normal((3, 8)).astype(np.float32)


def test_cuda_cpu_session_runs_and_says_why():
    model, x = _model()
    sess = anychip.load(model, devices=["cuda", "cpu"])
    (got,) = sess.run(None, {"x": x})
    (want,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    ok, why = get_registry().backends["cuda"].available()
    counts = sess.placement().by_device()
    if ok:  # a machine with a GPU
        assert counts.get("cuda") == 2
    else:
        assert counts == {"cpu": 2}
        text = str(sess.placement())
        assert text.count(f"cuda is not available here: {why}") == 2


def test_devices_lists_cuda_with_its_reason(capsys):
    assert main(["devices"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("cuda "))
    ok, why = get_registry().backends["cuda"].available()
    assert ("yes" if ok else "no") in line.split()
    assert ok or why[:40] in line
