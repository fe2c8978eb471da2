"""GatherND's flat-index path against onnxruntime on seeded random data and indices: batch
dimensions, negative indices, partial index depth (slices), a bool mask as the tiny BERT's,
and an out-of-range index as a clear error."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from anychip.backends.cpu.kernels.op_gather_scatter import gather_nd
from anychip.errors import ModelError


def _ort(data: np.ndarray, idx: np.ndarray, batch_dims: int) -> np.ndarray:
    ty = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(bool): TensorProto.BOOL}[data.dtype]
    node = helper.make_node("GatherND", ["d", "i"], ["y"], batch_dims=batch_dims)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("d", ty, data.shape),
         helper.make_tensor_value_info("i", TensorProto.INT64, idx.shape)],
        [helper.make_tensor_value_info("y", ty, None)],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"d": data, "i": idx})[0]


CASES = [
    # data shape, indices shape (last: depth), batch_dims, negative indices
    ((4, 5, 6), (7, 2), 0, False),
    ((4, 5, 6), (3, 2, 3), 0, True),
    ((2, 5, 6, 3), (2, 4, 1), 1, True),
    ((2, 3, 5, 6), (2, 3, 4, 2), 2, False),
    ((6,), (5, 1), 0, True),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_gather_nd_matches_onnxruntime(case):
    dshape, ishape, b, negative = CASES[case]
    rng = np.random.default_rng(case)
    data = rng.standard_normal(dshape).astype(np.float32)
    sizes = np.array(dshape[b : b + ishape[-1]])
    idx = rng.integers(0, sizes, size=ishape).astype(np.int64)
    if negative:
        idx = np.where(rng.random(ishape) < 0.5, idx - sizes, idx)
    np.testing.assert_array_equal(gather_nd(data, idx, batch_dims=b), _ort(data, idx, b))


def test_bool_mask_gather_as_the_tiny_bert():
    rng = np.random.default_rng(7)
    mask = rng.random((1, 128)) < 0.7
    cols = np.broadcast_to(np.arange(128)[None, None, None, :, None], (1, 1, 128, 128, 1))
    idx = np.ascontiguousarray(np.concatenate([np.zeros_like(cols), cols], -1))
    np.testing.assert_array_equal(gather_nd(mask, idx), _ort(mask, idx, 0))


@pytest.mark.parametrize("bad", [5, -6])
def test_index_out_of_range_is_a_clear_error(bad):
    data = np.zeros((5, 3), np.float32)
    with pytest.raises(ModelError, match="out of range"):
        gather_nd(data, np.array([[0], [bad]], np.int64))


@pytest.mark.parametrize("case", range(len(CASES)))
def test_read_only_indices_are_cached_and_match_onnxruntime(case):
    """A read-only index array (a constant, a ShapeMemo result) has its flat index cached:
    the second call, on new data, must still give onnxruntime's result; another array with
    other values (same shape) must not be served the first one's cached index."""
    from anychip.backends.cpu.kernels import op_gather_scatter as mod

    dshape, ishape, b, negative = CASES[case]
    rng = np.random.default_rng(100 + case)
    sizes = np.array(dshape[b : b + ishape[-1]])
    frozen = []
    for _ in range(2):
        idx = rng.integers(0, sizes, size=ishape).astype(np.int64)
        if negative:
            idx = np.where(rng.random(ishape) < 0.5, idx - sizes, idx)
        idx.setflags(write=False)
        frozen.append(idx)
    for idx in frozen + frozen:
        data = rng.standard_normal(dshape).astype(np.float32)
        np.testing.assert_array_equal(gather_nd(data, idx, batch_dims=b), _ort(data, idx, b))
    assert any(hit[0] is frozen[0] for hit in mod._FLAT.values())


def test_read_only_out_of_range_index_is_refused_every_time():
    idx = np.array([[0, 1], [3, 0]], np.int64)
    idx.setflags(write=False)
    data = np.zeros((3, 2), np.float32)
    for _ in range(2):
        with pytest.raises(ModelError, match="out of range"):
            gather_nd(data, idx)
