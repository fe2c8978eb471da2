"""onnxruntime's own ``sparse_initializer_as_output`` model: a Constant with a sparse tensor in
``value`` (onnx.checker wants it in ``sparse_value``). anychip repairs it, says so, and gives
the dense form of onnxruntime's sparse output."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as h

from tests.wild._compare import anychip_run


def _sparse_constant_model(rng: np.random.Generator) -> tuple[onnx.ModelProto, np.ndarray]:
    dense = np.zeros((4, 5), np.float32)
    where = np.sort(rng.choice(dense.size, 6, replace=False)).astype(np.int64)
    dense.flat[where] = rng.standard_normal(6).astype(np.float32)
    values = h.make_tensor("values", TensorProto.FLOAT, [6], dense.flat[where])
    indices = h.make_tensor("indices", TensorProto.INT64, [6], where)
    sparse = h.make_sparse_tensor(values, indices, list(dense.shape))
    node = h.make_node("Constant", [], ["c"], name="Constant", value=sparse)
    out = onnx.ValueInfoProto(name="c")
    out.type.sparse_tensor_type.elem_type = TensorProto.FLOAT
    for d in dense.shape:
        out.type.sparse_tensor_type.shape.dim.add().dim_value = d
    model = h.make_model(
        h.make_graph([node], "g", [], [out]), opset_imports=[h.make_opsetid("", 12)]
    )
    model.ir_version = 7
    return model, dense


def test_sparse_constant_in_value_is_repaired() -> None:
    model, dense = _sparse_constant_model(np.random.default_rng(5))
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)
    (sparse,) = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, {})
    want = np.zeros(sparse.dense_shape(), np.float32)
    want.flat[sparse.get_coo_data().indices()] = sparse.values()
    np.testing.assert_array_equal(want, dense)  # onnxruntime read the model as written
    (got,), warned = anychip_run(model, {})
    np.testing.assert_array_equal(got, want)
    assert any("sparse tensor in 'value'" in w and "sparse_value" in w for w in warned), warned
