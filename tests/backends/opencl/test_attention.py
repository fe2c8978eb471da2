"""``anychip::FusedAttention`` on OpenCL: the CPU's attention fusion on OpenCL partitions and
the one-launch kernel (both variants, on PoCL), against onnxruntime on seeded random inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import anychip
from anychip.backends.opencl.kernels import op_attention
from tests.models import transformer_layer

pytestmark = pytest.mark.usefixtures("cl_device")


def _attention(q, kt, v, mask_shape, op: str = "Div", dtype=TensorProto.FLOAT) -> bytes:
    """Q @ Kt, scaled by a constant, [+ mask], Softmax, @ V: the pattern the pass fuses."""
    np_dt = np.float32 if dtype == TensorProto.FLOAT else np.float64
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node(op, ["s", "c"], ["ss"]),
        helper.make_node("Softmax", ["sm" if mask_shape else "ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    ins = [helper.make_tensor_value_info(n, dtype, s) for n, s in (("q", q), ("kt", kt), ("v", v))]
    if mask_shape:
        nodes.insert(2, helper.make_node("Add", ["ss", "mask"], ["sm"]))
        ins.append(helper.make_tensor_value_info("mask", dtype, mask_shape))
    c = onnx.numpy_helper.from_array(np.array(np.sqrt(q[-1]), np_dt), "c")
    g = helper.make_graph(
        nodes, "attention", ins, [helper.make_tensor_value_info("y", dtype, None)], [c]
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _feeds(model: bytes, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in onnx.load_from_string(model).graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        dt = np.float32 if i.type.tensor_type.elem_type == TensorProto.FLOAT else np.float64
        x = rng.standard_normal(shape)
        if i.name == "mask":  # a padding-style mask: large negatives at random places
            x = np.where(rng.random(shape) < 0.3, -1e4, x)
        feeds[i.name] = x.astype(dt)
    return feeds


def _fused_run(model: bytes, feeds: dict) -> tuple[np.ndarray, np.ndarray]:
    (ref,) = ort.InferenceSession(model).run(None, feeds)
    sess = anychip.load(model, devices=["opencl"], strict=True)
    (part,) = sess.compiled.partitions
    assert [n.op_type for n in part.graph.nodes] == ["FusedAttention"]
    return sess.run(None, feeds)[0], ref


CASES = {
    "heads_mask_rows": ([2, 4, 16, 8], [2, 4, 8, 24], [2, 4, 24, 16], [2, 1, 1, 24], "Div"),
    "full_mask": ([3, 16, 8], [3, 8, 16], [3, 16, 8], [3, 16, 16], "Div"),
    "causal_2d_mask": ([2, 2, 8, 16], [2, 2, 16, 8], [2, 2, 8, 8], [8, 8], "Mul"),
    "no_mask_odd_sizes": ([2, 5, 7], [2, 7, 9], [2, 9, 3], None, "Div"),
    "shared_kv_over_heads": ([1, 4, 8, 16], [1, 1, 16, 8], [1, 1, 8, 16], [1, 1, 8, 1], "Mul"),
    "mask_column_broadcast": ([2, 9, 16], [2, 16, 9], [2, 9, 8], [2, 9, 1], "Div"),
}


@pytest.mark.parametrize("how", ["rows", "group"])
@pytest.mark.parametrize("case", list(CASES))
def test_attention_is_one_launch_and_matches_onnxruntime(case, how, monkeypatch):
    q, kt, v, mask, op = CASES[case]
    monkeypatch.setattr(op_attention, "FORCE", how)
    model = _attention(q, kt, v, mask, op)
    got, ref = _fused_run(model, _feeds(model, seed=len(case)))
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_attention_in_double():
    model = _attention([2, 8, 8], [2, 8, 8], [2, 8, 8], [2, 8, 8], dtype=TensorProto.DOUBLE)
    got, ref = _fused_run(model, _feeds(model, seed=5))
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-13)


def test_disabling_the_pass_runs_the_unfused_nodes(monkeypatch):
    model = _attention([2, 8, 16], [2, 16, 8], [2, 8, 16], [2, 8, 8])
    feeds = _feeds(model, seed=7)
    monkeypatch.setenv("ANYCHIP_DISABLED_PASSES", "fuse_attention")
    sess = anychip.load(model, devices=["opencl"], strict=True)
    ops = [n.op_type for n in sess.compiled.partitions[0].graph.nodes]
    assert "FusedAttention" not in ops and "Softmax" in ops
    (ref,) = ort.InferenceSession(model).run(None, feeds)
    np.testing.assert_allclose(sess.run(None, feeds)[0], ref, rtol=1e-5, atol=1e-6)


def test_a_cpu_device_runs_the_row_kernel_with_groups_for_every_core(cl_device):
    assert cl_device.info.type == "cpu"
    assert op_attention.variant(cl_device, 64, 64, 4) == "rows"
    lsz = op_attention.rows_group(cl_device, 256)
    assert 1 <= lsz <= min(64, cl_device.info.max_work_group)
    assert -(-256 // lsz) >= min(256, 4 * cl_device.info.compute_units) or lsz == 1
    g = op_attention.group_size(cl_device, 40, 24)
    assert g == 64 and g <= cl_device.info.max_work_group


def _masked_bert_layer() -> onnx.ModelProto:
    """The BERT-like layer with a padding mask input added to the scaled scores."""
    m = transformer_layer()
    for node in m.graph.node:
        if node.name == "attn/softmax":
            node.input[0] = "ss_masked"
    idx = next(i for i, n in enumerate(m.graph.node) if n.name == "attn/scale")
    m.graph.node.insert(
        idx + 1, helper.make_node("Add", ["ss", "mask"], ["ss_masked"], name="attn/mask")
    )
    m.graph.input.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, 1, 64]))
    return m


@pytest.mark.parametrize("which", ["bert_like_masked", "gpt_like"])
def test_transformer_layers_fuse_attention_on_opencl(which):
    model = _masked_bert_layer() if which == "bert_like_masked" else transformer_layer(causal=True)
    rng = np.random.default_rng(11)
    feeds = {"x": rng.standard_normal((1, 64, 256)).astype(np.float32)}
    if which == "bert_like_masked":
        feeds["mask"] = np.where(np.arange(64) >= 50, -1e4, 0.0).astype(np.float32)[
            None, None, None
        ]
    ref = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    sess = anychip.load(model, devices=["opencl"], strict=True)
    np.testing.assert_allclose(sess.run(None, feeds)[0], ref, rtol=1e-4, atol=1e-4)
    (part,) = sess.compiled.partitions
    assert part.info["fusions"]["fuse_attention"] == 1
    assert sum(n.op_type == "FusedAttention" for n in part.graph.nodes) == 1
