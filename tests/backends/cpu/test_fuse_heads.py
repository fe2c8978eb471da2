"""``FuseHeadsPass`` and ``anychip::HeadsAttention``: the heads' Reshapes and Transposes around
a fused attention become one node, the three projections one product and a Split; results
equal onnxruntime's, the unfused graph's and the run without the pass, with shapes computed
at run time (two sequence lengths through one session); where a condition fails the pass
leaves the graph alone; the kernel's own paths (``out``, broadcast heads, a wider mask, bad
shapes) against numpy."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.cpu.kernels.op_fused_attention import fused_attention
from anychip.backends.cpu.kernels.op_heads_attention import heads_attention
from anychip.errors import AnychipError
from tests.backends.cpu._fusion_models import check, heads_nodes, model, ops, rand

N = helper.make_node
S, H, D = 12, 2, 8


def _layer(
    bias: bool = True,
    packed: bool = False,
    also_output: str = "",
    k_read_twice: bool = False,
    sizes: bool = True,
    split_axis: int = 2,
):
    """x [1, S, H*D] -> Q, K, V projections (three MatMul + Add, or one MatMul and a Split)
    -> heads -> attention with a mask -> merged heads -> Sigmoid."""
    nodes, inits = [], []
    if packed:  # one product; Split (with sizes, or num_outputs at opset 18) by K, Q, V
        nodes.append(N("MatMul", ["x", "wqkv"], ["qkv"]))
        if split_axis != 2:  # [1, S, 3HD] -> a Reshape to [3, S, HD] split on axis 0
            nodes.append(N("Reshape", ["qkv", "by_rows"], ["qkv3"]))
            inits.append(("by_rows", np.array([3, S, H * D], np.int64)))
        src = "qkv" if split_axis == 2 else "qkv3"
        if sizes:
            nodes.append(N("Split", [src, "sizes"], ["k2", "q2", "v2"], axis=split_axis))
            part = H * D if split_axis == 2 else 1
            inits.append(("sizes", np.array([part] * 3, np.int64)))
        else:
            nodes.append(N("Split", [src], ["k2", "q2", "v2"], axis=split_axis, num_outputs=3))
        inits += [("wqkv", rand(1, H * D, 3 * H * D) * 0.3)]
    for i, name in enumerate("qkv"):
        if not packed:
            nodes.append(N("MatMul", ["x", f"w{name}"], [f"{name}m" if bias else f"{name}2"]))
            inits.append((f"w{name}", rand(i + 1, H * D, H * D) * 0.3))
            if bias:
                nodes.append(N("Add", [f"{name}m", f"b{name}"], [f"{name}2"]))
                inits.append((f"b{name}", rand(i + 5, H * D)))
        nodes.append(N("Reshape", [f"{name}2", "shape4"], [f"{name}4"]))
    nodes += heads_nodes() + [N("Sigmoid", ["o3"], ["y"])]
    inits += [
        ("shape4", np.array([1, S, H, D], np.int64)),
        ("shape3", np.array([1, S, H * D], np.int64)),
        ("c", np.array(math.sqrt(D), np.float32)),
        ("mask", rand(9, 1, 1, S, S)),
    ]
    outputs = [("y", [1, S, H * D])]
    if also_output:  # an intermediate the pass would remove
        shape = {"o2": [1, S, H, D], "q": [1, H, S, D], "q4": [1, S, H, D]}[also_output]
        outputs.append((also_output, shape))
    if k_read_twice:
        nodes.append(N("Relu", ["k2"], ["k_relu"]))
        outputs.append(("k_relu", [1, S, H * D]))
    return model(nodes, [("x", [1, S, H * D])], outputs, inits, opset=17 if sizes else 18)


def test_nine_nodes_become_one_and_the_projections_one_product():
    m = _layer()
    counts = check(m)
    assert counts["fuse_heads"] == 1 and counts["fuse_attention"] == 1
    kinds = ops(m)
    assert kinds.count("HeadsAttention") == 1
    assert "Transpose" not in kinds and "TransposeView" not in kinds
    assert "Reshape" not in kinds and "FusedAttention" not in kinds
    assert kinds.count("MatMulAdd") == 1 and "Split" not in kinds  # read in parts


@pytest.mark.parametrize(
    "kw", [{"bias": False}, {"packed": True}, {"packed": True, "sizes": False}]
)
def test_projections_without_bias_and_a_packed_export(kw):
    m = _layer(**kw)
    assert check(m)["fuse_heads"] == 1
    kinds = ops(m)
    assert kinds == ["MatMul", "HeadsAttention", "Sigmoid"]


def test_a_split_of_another_axis_stays():
    m = _layer(packed=True, split_axis=0)
    assert check(m)["fuse_heads"] == 1
    assert ops(m) == ["MatMul", "Reshape", "Split", "HeadsAttention", "Sigmoid"]


def test_a_projection_read_elsewhere_is_not_packed():
    m = _layer(k_read_twice=True)
    assert check(m)["fuse_heads"] == 1
    kinds = ops(m)
    assert kinds.count("HeadsAttention") == 1 and "Split" not in kinds
    assert kinds.count("MatMulAdd") == 3


@pytest.mark.parametrize("name", ["o2", "q", "q4"])
def test_left_alone_where_an_intermediate_is_an_output(name):
    m = _layer(also_output=name)
    counts = check(m)
    assert "fuse_heads" not in counts
    assert "HeadsAttention" not in ops(m)


def test_equal_to_the_run_without_the_pass_over_several_runs():
    data = _layer().SerializeToString()
    on = anychip.load(data, "cpu")
    off = anychip.load(data, "cpu", device_options={"cpu": {"disabled_passes": ["fuse_heads"]}})
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for seed in range(3):
        feeds = {"x": rand(20 + seed, 1, S, H * D)}
        a, b = on.run(None, feeds)[0], off.run(None, feeds)[0]
        np.testing.assert_allclose(a, ref.run(None, feeds)[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)  # one sgemm for three


def _dynamic_layer():
    """The exporters' form: the heads' shapes computed from the input's at run time."""
    f = TensorProto.FLOAT
    nodes = [
        N("Shape", ["x"], ["lead"], start=0, end=2),
        N("Concat", ["lead", "hd"], ["shape4"], axis=0),
        N("Concat", ["lead", "hidden"], ["shape3"], axis=0),
    ]
    for name in "qkv":
        nodes += [
            N("MatMul", ["x", f"w{name}"], [f"{name}m"]),
            N("Add", [f"{name}m", f"b{name}"], [f"{name}2"]),
            N("Reshape", [f"{name}2", "shape4"], [f"{name}4"]),
        ]
    nodes += heads_nodes("Mul", mask=False, out="y")
    inits = [(f"w{n}", rand(i + 1, H * D, H * D) * 0.3) for i, n in enumerate("qkv")]
    inits += [(f"b{n}", rand(i + 5, H * D)) for i, n in enumerate("qkv")]
    inits += [
        ("hd", np.array([H, D], np.int64)),
        ("hidden", np.array([H * D], np.int64)),
        ("c", np.array(1 / math.sqrt(D), np.float32)),
    ]
    graph = helper.make_graph(
        nodes,
        "heads",
        [helper.make_tensor_value_info("x", f, ["B", "S", H * D])],
        [helper.make_tensor_value_info("y", f, ["B", "S", H * D])],
        [numpy_helper.from_array(a, n) for n, a in inits],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_shapes_computed_at_run_time_two_sequence_lengths():
    data = _dynamic_layer().SerializeToString()
    s = anychip.load(data, "cpu")
    assert [n.op_type for n in s.partitions[0].graph.nodes].count("HeadsAttention") == 1
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for batch, seq in ((1, 7), (3, 20), (1, 7)):
        feeds = {"x": rand(seq, batch, seq, H * D)}
        got = s.run(None, feeds)[0]
        assert got.shape == (batch, seq, H * D)
        np.testing.assert_allclose(got, ref.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def _reference(q, k, v, sq, sk, sv, so, mask, scale, divide):
    qh = q.reshape(sq).transpose(0, 2, 1, 3)
    kt = k.reshape(sk).transpose(0, 2, 3, 1)
    vh = v.reshape(sv).transpose(0, 2, 1, 3)
    s = qh @ kt
    s = s / scale if divide else s * scale
    if mask is not None:
        s = s + mask
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return ((e / e.sum(axis=-1, keepdims=True)) @ vh).transpose(0, 2, 1, 3).reshape(so)


def _shapes(*shapes):
    return [np.array(s, np.int64) for s in shapes]


@pytest.mark.parametrize("divide", [1, 0])
@pytest.mark.parametrize("mask_shape", [None, (1, 1, 5, 6), (2, 3, 5, 6), (6,)])
def test_kernel_against_numpy(divide, mask_shape):
    rng = np.random.default_rng(len(mask_shape or ()) + divide)
    packed = rng.standard_normal((2, 6, 3 * 3 * 4)).astype(np.float32)
    q = packed[:2, :5, :12]  # strided parts, as a Split gives them
    k, v = packed[..., 12:24], packed[..., 24:]
    mask = None if mask_shape is None else rng.standard_normal(mask_shape).astype(np.float32)
    sq, sk, so = _shapes([2, 5, 3, 4], [2, 6, 3, 4], [2, 5, 12])
    want = _reference(q, k, v, sq, sk, sk, so, mask, 2.0, divide)
    got = heads_attention(q, k, v, sq, sk, sk, so, mask, scale=2.0, divide=divide)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    out = np.full((2, 5, 12), np.nan, np.float32)
    res = heads_attention(q, k, v, sq, sk, sk, so, mask, scale=2.0, divide=divide, out=out)
    assert res is out
    np.testing.assert_array_equal(out, got)


@pytest.mark.parametrize("split", [[12, 12, 12], []])
def test_kernel_reads_parts_of_a_packed_tensor(split):
    rng = np.random.default_rng(7)
    packed = rng.standard_normal((2, 5, 36)).astype(np.float32)
    k, q, v = packed[..., :12], packed[..., 12:24], packed[..., 24:]
    s4, s3 = _shapes([2, 5, 3, 4], [2, 5, 12])
    want = _reference(q, k, v, s4, s4, s4, s3, None, 2.0, 1)
    got = heads_attention(
        packed, packed, packed, s4, s4, s4, s3, scale=2.0, split=split, parts=[3, 1, 0, 2]
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(AnychipError, match="Split: sizes"):
        heads_attention(
            packed,
            packed,
            packed,
            s4,
            s4,
            s4,
            s3,
            scale=2.0,
            split=[12, 12, 13],
            parts=[3, 0, 1, 2],
        )


def test_kernel_broadcast_heads_and_a_wider_mask_take_the_general_path():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 5, 8)).astype(np.float32)
    kv = rng.standard_normal((1, 6, 4)).astype(np.float32)  # one key/value head for two
    sq, skv = _shapes([1, 5, 2, 4], [1, 6, 1, 4])
    so = np.array([1, 5, 8], np.int64)
    want = _reference(q, kv, kv, sq, skv, skv, so, None, 2.0, 1)
    got = heads_attention(q, kv, kv, sq, skv, skv, so, scale=2.0, divide=1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    wide = rng.standard_normal((3, 2, 5, 6)).astype(np.float32)  # batch 3 from the mask
    k = rng.standard_normal((1, 6, 8)).astype(np.float32)
    sk = np.array([1, 6, 2, 4], np.int64)
    y = fused_attention(
        q.reshape(1, 5, 2, 4).transpose(0, 2, 1, 3),
        k.reshape(1, 6, 2, 4).transpose(0, 2, 3, 1),
        k.reshape(1, 6, 2, 4).transpose(0, 2, 1, 3),
        wide,
        scale=2.0,
    )
    so3 = np.array([3, 5, 8], np.int64)
    got = heads_attention(q, k, k, sq, sk, sk, so3, wide, scale=2.0)
    np.testing.assert_allclose(got, y.transpose(0, 2, 1, 3).reshape(3, 5, 8), rtol=1e-6)


def test_kernel_names_bad_shapes():
    x = rand(1, 1, 5, 8)
    s4, s3 = _shapes([1, 5, 2, 4], [1, 5, 8])
    with pytest.raises(AnychipError, match="rank 4"):
        heads_attention(x, x, x, s3, s4, s4, s3, scale=1.0)
    with pytest.raises(AnychipError, match="Reshape"):
        heads_attention(x, x, x, s4, s4, s4, np.array([7, 3], np.int64), scale=1.0)


def test_kernel_plans_follow_the_shape_values_not_the_arrays():
    """Plans are kept per shape values: the same arrays split into other heads, and a shape
    tensor rewritten in place, give the reference's results each time."""
    rng = np.random.default_rng(8)
    packed = rng.standard_normal((2, 5, 36)).astype(np.float32)
    q, k, v = packed[..., :12], packed[..., 12:24], packed[..., 24:]
    shape, s3 = np.array([2, 5, 3, 4], np.int64), np.array([2, 5, 12], np.int64)
    for heads in ([2, 5, 3, 4], [2, 5, 2, 6], [2, 5, 3, 4], [2, 5, 6, 2]):
        shape[:] = heads  # in place: the same array, other values
        want = _reference(q, k, v, shape, shape, shape, s3, None, 2.0, 1)
        for _ in range(2):
            got = heads_attention(packed, packed, packed, shape, shape, shape, s3, scale=2.0,
                                  split=[12, 12, 12], parts=[3, 0, 1, 2])  # fmt: skip
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
