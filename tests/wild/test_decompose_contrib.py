"""com.microsoft ops rewritten into standard ONNX when a preferred device can run only those:
the NPU and XPU simulated devices then run them, with onnxruntime's results; with the CPU
alone (or first, or a pin) the contrib nodes stay as written."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import anychip
from tests.wild._compare import ort_run

MS = "com.microsoft"


def _model(opset: int = 17) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)

    def init(name: str, *shape: int) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        h.make_node("FusedMatMul", ["x", "w"], ["m"], domain=MS, alpha=0.5, transB=1),
        h.make_node("QuickGelu", ["m"], ["a"], domain=MS, alpha=1.5),
        h.make_node("FastGelu", ["a", "bias"], ["f"], domain=MS),
        h.make_node("Gelu", ["f"], ["g"], domain=MS),
        h.make_node("BiasGelu", ["g", "bias"], ["bg"], domain=MS),
        h.make_node(
            "SkipLayerNormalization", ["bg", "x", "gamma", "beta", "bias"], ["y", "", "", "s"],
            domain=MS, epsilon=1e-5,
        ),
    ]  # fmt: skip
    inits = [init("w", 16, 16), init("bias", 16), init("gamma", 16), init("beta", 16)]
    g = h.make_graph(
        nodes,
        "contrib",
        [h.make_tensor_value_info("x", T.FLOAT, [2, 5, 16])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 5, 16]),
         h.make_tensor_value_info("s", T.FLOAT, [2, 5, 16])],
        inits,
    )  # fmt: skip
    opsets = [h.make_opsetid("", opset), h.make_opsetid(MS, 1)]
    model = h.make_model(g, opset_imports=opsets)
    return model, {"x": rng.standard_normal((2, 5, 16)).astype(np.float32)}


def _devices(sess: anychip.Session) -> dict[str, list[str]]:
    by_op: dict[str, list[str]] = {}
    for n in sess.placement().nodes:
        by_op.setdefault(n.op_type, []).append(n.device)
    return by_op


@pytest.mark.parametrize("device", ["npu", "xpu"])
def test_contrib_ops_decomposed_run_on_the_device(device: str) -> None:
    model, feeds = _model()
    want = ort_run(model, feeds)
    with anychip.load(model, devices=[device, "cpu"], cost_model=False) as sess:
        got = sess.run(None, feeds)
        by_op = _devices(sess)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    assert not {"FusedMatMul", "QuickGelu", "FastGelu", "Gelu", "BiasGelu"} & set(by_op), by_op
    assert all(d == device for op in ("Erf", "Tanh", "Sigmoid", "MatMul") for d in by_op[op]), by_op
    assert "SkipLayerNormalization" not in by_op, by_op
    assert by_op["LayerNormalization"] == [device], by_op  # both have LayerNormalization


@pytest.mark.parametrize("devices", [["cpu"], ["cpu", "xpu"]])
def test_cpu_first_keeps_the_contrib_ops(devices: list[str]) -> None:
    model, feeds = _model()
    with anychip.load(model, devices=devices, cost_model=False) as sess:
        got = sess.run(None, feeds)
        by_op = _devices(sess)
    assert by_op["FastGelu"] == ["cpu"] and by_op["SkipLayerNormalization"] == ["cpu"], by_op
    np.testing.assert_allclose(got[0], ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_pins_and_opsets() -> None:
    model, feeds = _model()
    with anychip.load(
        model, devices=["npu", "cpu"], cost_model=False, placement={"FastGelu": "cpu"}
    ) as sess:
        assert _devices(sess)["FastGelu"] == ["cpu"]
        np.testing.assert_allclose(
            sess.run(None, feeds)[0], ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4
        )
    old, feeds = _model(opset=16)  # no standard LayerNormalization below 17: written out
    with anychip.load(old, devices=["npu", "cpu"], cost_model=False) as sess:
        by_op = _devices(sess)  # with ReduceMean, which the NPU runs (bench/hf_zoo.py's fix)
        assert by_op["ReduceMean"] == ["npu", "npu"] and "SkipLayerNormalization" not in by_op
        assert "FastGelu" not in by_op and set(sum(by_op.values(), [])) == {"npu"}, by_op
        np.testing.assert_allclose(
            sess.run(None, feeds)[0], ort_run(old, feeds)[0], rtol=1e-4, atol=1e-4
        )
    for opset in (16, 18):  # at 16 no LayerNormalization: written out with ReduceMean
        model, feeds = _model(opset=opset)
        with anychip.load(model, devices=["xpu", "cpu"], cost_model=False) as sess:
            by_op = _devices(sess)
            if opset == 16:
                assert by_op["ReduceMean"] == ["xpu", "xpu"], by_op
            else:
                assert by_op["LayerNormalization"] == ["xpu"], by_op
            for g, w in zip(sess.run(None, feeds), ort_run(model, feeds)):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("device", "act"), [("xpu", "Tanh"), ("npu", "Relu"), ("xpu", "LeakyRelu")]
)
def test_fused_gemm_decomposed_runs_on_the_device(device: str, act: str) -> None:
    rng = np.random.default_rng(3)
    w = onnx.numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "w")
    c = onnx.numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "c")
    node = h.make_node(
        "FusedGemm", ["x", "w", "c"], ["y"], domain=MS, alpha=0.7, transB=0,
        activation=act, activation_alpha=0.2,
    )  # fmt: skip
    g = h.make_graph(
        [node], "g", [h.make_tensor_value_info("x", T.FLOAT, [4, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [4, 6])], [w, c],
    )  # fmt: skip
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)])
    feeds = {"x": rng.standard_normal((4, 8)).astype(np.float32)}
    with anychip.load(model, devices=[device, "cpu"], cost_model=False) as sess:
        got = sess.run(None, feeds)
        if act == "LeakyRelu":  # the XPU has no LeakyRelu: the node stays whole on the CPU
            assert _devices(sess) == {"FusedGemm": ["cpu"]}
        else:
            assert _devices(sess) == {"Gemm": [device], act: [device]}, _devices(sess)
    np.testing.assert_allclose(got[0], ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", ["npu", "xpu"])
def test_decompositions_the_cost_model_keeps_on_the_cpu_are_put_back(device: str) -> None:
    # With the cost model on, whatever it decides, no decomposition ends up wholly on the
    # CPU: the CPU then runs the contrib node with its native kernel.
    model, feeds = _model()
    with anychip.load(model, devices=[device, "cpu"]) as sess:
        got = sess.run(None, feeds)
        groups: dict[str, set[str]] = {}
        for n in sess.compiled.model.graph.nodes:
            if "decomposed_from" in n.meta:
                groups.setdefault(n.meta["decomposed_from"], set()).add(n.meta["device"])
        contrib = [n for n in sess.compiled.model.graph.nodes if n.domain == MS]
    assert all(devices != {"cpu"} for devices in groups.values()), groups
    assert len(groups) + len(contrib) == 6
    assert all(n.meta["device"] == "cpu" for n in contrib)
    for g, w in zip(got, ort_run(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def _attention_model(op: str, masked: bool) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Attention (packed weights) or MultiHeadAttention (separate Q, K, V and a bias), seeded
    random weights, with or without a raw [B, T] mask that hides a few keys per row."""
    rng = np.random.default_rng(11)
    b, s, d, n = 2, 5, 16, 4
    mask = (rng.random((b, s)) > 0.3).astype(np.int32)
    mask[:, 0] = 1  # every row keeps a key
    feeds = {"x": rng.standard_normal((b, s, d)).astype(np.float32)}
    if masked:
        feeds["mask"] = mask
    m = "mask" if masked else ""
    inputs = [h.make_tensor_value_info("x", T.FLOAT, [b, s, d])]
    if masked:
        inputs.append(h.make_tensor_value_info("mask", T.INT32, [b, s]))
    weights = []
    if op == "Attention":
        w = rng.standard_normal((d, 3 * d)).astype(np.float32) * 0.3
        bias = rng.standard_normal(3 * d).astype(np.float32) * 0.1
        weights = [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(bias, "b")]
        nodes = [h.make_node("Attention", ["x", "w", "b", m], ["y"], domain=MS, num_heads=n)]
    else:
        for name in ("wq", "wk", "wv"):
            arr = rng.standard_normal((d, d)).astype(np.float32) * 0.3
            weights.append(onnx.numpy_helper.from_array(arr, name))
        bias = rng.standard_normal(3 * d).astype(np.float32) * 0.1
        weights.append(onnx.numpy_helper.from_array(bias, "b"))
        nodes = [h.make_node("MatMul", ["x", f"w{c}"], [c]) for c in "qkv"]
        nodes.append(
            h.make_node(
                "MultiHeadAttention", ["q", "k", "v", "b", m], ["y"], domain=MS, num_heads=n
            )
        )
    g = h.make_graph(
        nodes, "attn", inputs, [h.make_tensor_value_info("y", T.FLOAT, [b, s, d])], weights
    )
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)])
    return model, feeds


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("op", ["Attention", "MultiHeadAttention"])
@pytest.mark.parametrize("device", ["npu", "xpu"])
def test_attention_decomposed_runs_on_the_device(device: str, op: str, masked: bool) -> None:
    model, feeds = _attention_model(op, masked)
    want = ort_run(model, feeds)
    with anychip.load(model, devices=[device, "cpu"], cost_model=False) as sess:
        got = sess.run(None, feeds)
        by_op = _devices(sess)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    if device == "xpu" and masked:  # the XPU casts no int32 (the mask's type): kept whole
        assert by_op[op] == ["cpu"], by_op
        return
    assert op not in by_op, by_op
    assert all(d == device for o in ("MatMul", "Softmax", "Transpose") for d in by_op[o]), by_op
    with anychip.load(model, devices=["cpu", device], cost_model=False) as sess:
        assert _devices(sess)[op] == ["cpu"]  # the CPU first keeps its fused kernel


def test_attention_with_a_read_present_stays_whole() -> None:
    model, feeds = _attention_model("Attention", True)
    node = model.graph.node[0]
    node.output.append("present")
    model.graph.output.append(h.make_tensor_value_info("present", T.FLOAT, None))
    with anychip.load(model, devices=["npu", "cpu"], cost_model=False) as sess:
        got = sess.run(None, feeds)
        assert _devices(sess) == {"Attention": ["cpu"]}
    for g, w in zip(got, ort_run(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def _embed_model(positions: bool, read_mask_index: bool) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(13)
    b, s, d, vocab = 2, 6, 16, 30

    def table(name: str, *shape: int) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    inits = [table("word", vocab, d), table("pos", 10, d), table("seg", 2, d)]
    inits += [table("gamma", d), table("beta", d)]
    ins = ["ids", "segs", "word", "pos", "seg", "gamma", "beta", "mask"]
    feeds = {
        "ids": rng.integers(0, vocab, (b, s)).astype(np.int32),
        "segs": rng.integers(0, 2, (b, s)).astype(np.int32),
        "mask": (rng.random((b, s)) > 0.3).astype(np.int32),
    }
    inputs = [h.make_tensor_value_info(k, T.INT32, [b, s]) for k in ("ids", "segs", "mask")]
    if positions:
        ins.append("pids")
        feeds["pids"] = rng.integers(0, 10, (b, s)).astype(np.int32)
        inputs.append(h.make_tensor_value_info("pids", T.INT32, [b, s]))
    outs = ["y", "mi" if read_mask_index else "", "sum"]
    node = h.make_node("EmbedLayerNormalization", ins, outs, domain=MS, epsilon=1e-5)
    outputs = [h.make_tensor_value_info("y", T.FLOAT, [b, s, d])]
    outputs.append(h.make_tensor_value_info("sum", T.FLOAT, [b, s, d]))
    if read_mask_index:
        outputs.append(h.make_tensor_value_info("mi", T.INT32, [b]))
    g = h.make_graph([node], "embed", inputs, outputs, inits)
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)])
    return model, feeds


@pytest.mark.parametrize("positions", [False, True])
def test_embed_layer_norm_decomposed_runs_on_the_npu(positions: bool) -> None:
    model, feeds = _embed_model(positions, read_mask_index=False)
    with anychip.load(model, devices=["npu", "cpu"], cost_model=False) as sess:
        got = sess.run(None, feeds)
        by_op = _devices(sess)
    for g, w in zip(got, ort_run(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    assert "EmbedLayerNormalization" not in by_op, by_op
    assert by_op["LayerNormalization"] == ["npu"] and set(by_op["Gather"]) == {"npu"}, by_op


def test_embed_layer_norm_with_a_read_mask_index_stays_whole() -> None:
    model, feeds = _embed_model(False, read_mask_index=True)
    with anychip.load(model, devices=["npu", "cpu"], cost_model=False) as sess:
        got = sess.run(None, feeds)
        assert _devices(sess) == {"EmbedLayerNormalization": ["cpu"]}
    for g, w in zip(got, ort_run(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
