"""``ViewTransposesPass``: the Transposes of an exporter's attention that feed FusedAttention's
queries and values become views (``anychip::TransposeView``), the keys' stays a copy; results
equal the unfused graph's, onnxruntime's, and the run without the pass, over runs with new
inputs (the planner keeps a view's input alive: nothing planned over it). The heads' fusion,
which takes these Transposes in (``test_fuse_heads.py``), is off here."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
from onnx import helper

import anychip
from anychip.backends.cpu.kernels.op_transpose import transpose_view
from tests.backends.cpu._fusion_models import check, heads_nodes, model, ops, rand

N = helper.make_node
S, H, D = 12, 2, 8
NO_HEADS = ["fuse_heads"]


def _layer(q_also_output: bool = False):
    """x [1, S, H*D] -> Q, K, V projections -> heads -> attention -> merged heads -> Relu."""
    shape4 = np.array([1, S, H, D], np.int64)
    shape3 = np.array([1, S, H * D], np.int64)
    nodes = []
    for name in "qkv":
        nodes += [
            N("MatMul", ["x", f"w{name}"], [f"{name}2"]),
            N("Reshape", [f"{name}2", "shape4"], [f"{name}4"]),
        ]
    nodes += heads_nodes() + [N("Sigmoid", ["o3"], ["y"])]
    inits = [(f"w{n}", rand(i + 1, H * D, H * D) * 0.3) for i, n in enumerate("qkv")]
    inits += [
        ("shape4", shape4),
        ("shape3", shape3),
        ("c", np.array(math.sqrt(D), np.float32)),
        ("mask", rand(9, 1, 1, S, S)),
    ]
    outputs = [("y", [1, S, H * D])] + ([("q", [1, H, S, D])] if q_also_output else [])
    return model(nodes, [("x", [1, S, H * D])], outputs, inits)


def test_queries_and_values_are_views_keys_stay_a_copy():
    m = _layer()
    counts = check(m, disabled_passes=NO_HEADS)
    assert counts["view_transposes"] == 2 and counts["fuse_attention"] == 1
    kinds = ops(m, disabled_passes=NO_HEADS)
    assert kinds.count("TransposeView") == 2
    assert kinds.count("Transpose") == 2  # the keys' and the merged heads'


def test_a_transpose_that_is_an_output_stays_a_copy():
    counts = check(_layer(q_also_output=True), disabled_passes=NO_HEADS)
    assert counts["view_transposes"] == 1  # the values only


def test_with_and_without_the_pass_over_several_runs():
    m = _layer()
    data = m.SerializeToString()
    on = anychip.load(data, "cpu", device_options={"cpu": {"disabled_passes": NO_HEADS}})
    off = anychip.load(
        data, "cpu", device_options={"cpu": {"disabled_passes": ["view_transposes"] + NO_HEADS}}
    )
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for seed in range(3):
        feeds = {"x": rand(20 + seed, 1, S, H * D)}
        want = ref.run(None, feeds)[0]
        a, b = on.run(None, feeds)[0], off.run(None, feeds)[0]
        np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(a, b)


def test_kernel_is_a_view():
    x = rand(3, 1, 4, 2, 5)
    y = transpose_view(x, perm=[0, 2, 1, 3])
    assert np.shares_memory(x, y)
    np.testing.assert_array_equal(y, np.transpose(x, (0, 2, 1, 3)))
