"""com.microsoft GreedySearch against onnxruntime on a tiny GPT-2 style decoder made here
(seeded random weights; decision 048)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import anychip
from tests.wild._compare import anychip_run, ort_run

_MS = "com.microsoft"
V, D, HEADS, LAYERS = 16, 8, 2, 2


def _decoder(rng: np.random.Generator, name: str, outer: bool = False) -> tuple[Any, list]:
    """GPT-2's subgraph contract: (input_ids, position_ids, attention_mask, past_i...) ->
    (logits, present_i...). With ``outer`` the token table is read from the main graph."""
    hs = D // HEADS
    weights = {
        "wpe": rng.standard_normal((32, D)),
        "w_out": rng.standard_normal((D, V)) * 2,
    }
    nodes = [
        h.make_node("Gather", ["wte", "input_ids"], ["tok"]),
        h.make_node("Gather", ["wpe", "position_ids"], ["pos"]),
        h.make_node("Add", ["tok", "pos"], ["x0"]),
    ]
    ins = [
        h.make_tensor_value_info("input_ids", TP.INT32, ["batch", "seq"]),
        h.make_tensor_value_info("position_ids", TP.INT32, ["batch", "seq"]),
        h.make_tensor_value_info("attention_mask", TP.INT32, ["batch", "total"]),
    ]
    outs = [h.make_tensor_value_info("logits", TP.FLOAT, ["batch", "seq", V])]
    for i in range(LAYERS):
        weights[f"w{i}"] = rng.standard_normal((D, 3 * D)) * 0.5
        weights[f"b{i}"] = rng.standard_normal(3 * D) * 0.1
        nodes += [
            h.make_node(
                "Attention",
                [f"x{i}", f"w{i}", f"b{i}", "attention_mask", f"past_{i}"],
                [f"a{i}", f"present_{i}"],
                domain=_MS,
                num_heads=HEADS,
                unidirectional=1,
            ),
            h.make_node("Add", [f"x{i}", f"a{i}"], [f"x{i + 1}"]),
        ]
        ins.append(h.make_tensor_value_info(f"past_{i}", TP.FLOAT, [2, "batch", HEADS, "past", hs]))
        outs.append(
            h.make_tensor_value_info(f"present_{i}", TP.FLOAT, [2, "batch", HEADS, "total", hs])
        )
    nodes.append(h.make_node("MatMul", [f"x{LAYERS}", "w_out"], ["logits"]))
    wte = nh.from_array(rng.standard_normal((V, D)).astype(np.float32), "wte")
    inits = [nh.from_array(w.astype(np.float32), k) for k, w in weights.items()]
    if not outer:
        inits.append(wte)
    graph = h.make_graph(nodes, name, ins, outs, inits)
    return graph, [wte] if outer else []


def _model(
    rng: np.random.Generator,
    feeds: dict[str, np.ndarray],
    *,
    init_decoder: bool = False,
    outer: bool = False,
    **attrs: Any,
) -> onnx.ModelProto:
    decoder, outer_inits = _decoder(rng, "decoder", outer)
    graph_attrs = {"decoder": decoder}
    if init_decoder:
        graph_attrs["init_decoder"], more = _decoder(rng, "init_decoder", outer)
        outer_inits = outer_inits or more
    names = [
        "input_ids",
        "max_length",
        "min_length",
        "repetition_penalty",
        "vocab_mask",
        "prefix_vocab_mask",
        "attention_mask",
    ]
    ins = [n if n in feeds else "" for n in names]
    while ins[-1] == "":
        ins.pop()
    node = h.make_node("GreedySearch", ins, ["sequences"], domain=_MS, **graph_attrs, **attrs)
    vis = [
        h.make_tensor_value_info(k, nh.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for k, v in feeds.items()
    ]
    out = h.make_tensor_value_info("sequences", TP.INT32, ["batch", "max_length"])
    g = h.make_graph([node], "generate", vis, [out], outer_inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(_MS, 1)])
    m.ir_version = 8
    return m


def _prompt(rng: np.random.Generator, b: int = 3, s: int = 4) -> np.ndarray:
    return rng.integers(1, V, (b, s)).astype(np.int32)


_CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "repetition_penalty": {"repetition_penalty": np.array([1.7], np.float32)},
    "min_length": {"min_length": np.array([9], np.int32)},
    "no_repeat_ngram": {"attrs": {"no_repeat_ngram_size": 2}},
    "vocab_masks": {"vocab_mask": "vocab", "prefix_vocab_mask": "prefix"},
    "left_padding": {"pad_prompt": True},
    "attention_mask": {"pad_prompt": True, "attention_mask": True},
    "init_decoder": {"init_decoder": True},
    "outer_scope_weights": {"outer": True, "init_decoder": True},
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_greedy_search_matches_onnxruntime(case) -> None:
    rng = np.random.default_rng(48)
    spec = dict(_CASES[case])
    ids = _prompt(rng)
    feeds: dict[str, np.ndarray] = {"input_ids": ids, "max_length": np.array([12], np.int32)}
    if spec.pop("pad_prompt", False):
        ids[0, :2] = 0  # left padding with pad_token_id 0
        ids[2, :1] = 0
    if spec.pop("attention_mask", False):
        feeds["attention_mask"] = (ids != 0).astype(np.int32)
    for k in ("min_length", "repetition_penalty"):
        if k in spec:
            feeds[k] = spec.pop(k)
    if spec.pop("vocab_mask", None):
        feeds["vocab_mask"] = (rng.random(V) > 0.3).astype(np.int32)
    if spec.pop("prefix_vocab_mask", None):
        feeds["prefix_vocab_mask"] = (rng.random((ids.shape[0], V)) > 0.5).astype(np.int32)
    attrs = {"eos_token_id": V - 1, "pad_token_id": 0, **spec.pop("attrs", {})}
    model = _model(rng, feeds, **spec, **attrs)
    want = ort_run(model, feeds)
    got, _ = anychip_run(model, feeds)
    np.testing.assert_array_equal(got[0], want[0])


def test_greedy_search_stops_rows_at_eos() -> None:
    """A row that produced eos is padded from there; the others go on."""
    rng = np.random.default_rng(5)
    ids = _prompt(rng)
    feeds = {"input_ids": ids, "max_length": np.array([12], np.int32)}
    weights = np.random.default_rng(6)
    probe = ort_run(_model(weights, feeds, eos_token_id=V + 1, pad_token_id=0), feeds)[0]
    eos = int(probe[0, ids.shape[1] + 1])  # row 0's second new token
    model = _model(np.random.default_rng(6), feeds, eos_token_id=eos, pad_token_id=0)
    want = ort_run(model, feeds)[0]
    got = anychip_run(model, feeds)[0][0]
    np.testing.assert_array_equal(got, want)
    assert (got[0, ids.shape[1] + 1 :] == 0).all()


def test_greedy_search_refuses_an_encoder_decoder() -> None:
    rng = np.random.default_rng(1)
    feeds = {"input_ids": _prompt(rng), "max_length": np.array([8], np.int32)}
    model = _model(rng, feeds, eos_token_id=1, pad_token_id=0, model_type=1)
    sess = anychip.load(model, devices=["cpu"])
    with pytest.raises(anychip.AnychipError, match="model_type 1"):
        sess.run(None, feeds)


def test_greedy_search_max_length_must_exceed_the_prompt() -> None:
    rng = np.random.default_rng(2)
    feeds = {"input_ids": _prompt(rng), "max_length": np.array([4], np.int32)}
    sess = anychip.load(_model(rng, feeds, eos_token_id=1, pad_token_id=0), devices=["cpu"])
    with pytest.raises(anychip.AnychipError, match="max_length"):
        sess.run(None, feeds)


def _sampling_model(
    rng: np.random.Generator, feeds: dict[str, np.ndarray], **attrs: Any
) -> onnx.ModelProto:
    m = _model(rng, {k: v for k, v in feeds.items() if k not in ("presence_mask", "seed")}, **attrs)
    node = m.graph.node[0]
    node.op_type = "Sampling"
    for name in ("presence_mask", "seed"):
        if name in feeds:
            while len(node.input) < (7 if name == "presence_mask" else 8):
                node.input.append("")
            node.input.append(name)
            v = feeds[name]
            m.graph.input.append(
                h.make_tensor_value_info(name, nh.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            )
    return m


_SAMPLING: dict[str, dict[str, Any]] = {
    "top_p": {"attrs": {"top_p": 0.6, "min_tokens_to_keep": 1}},
    "seeded": {"attrs": {"top_p": 0.9, "min_tokens_to_keep": 1}, "seed": 1234},
    "temperature": {"attrs": {"top_p": 0.8, "temperature": 1.7, "min_tokens_to_keep": 2}},
    "custom": {"attrs": {"top_p": 0.7, "custom": 1}, "seed": 7},
    "presence_mask_unweighted": {"attrs": {"top_p": 0.9}, "presence": True},
    "repetition_penalty": {
        "attrs": {"top_p": 0.95, "min_tokens_to_keep": 1},
        "repetition_penalty": np.array([1.3], np.float32),
    },
}


@pytest.mark.parametrize("case", sorted(_SAMPLING))
def test_sampling_draws_as_onnxruntime(case) -> None:
    """Same tokens as onnxruntime: its nucleus filter and its random engine reproduced."""
    rng = np.random.default_rng(11)
    spec = _SAMPLING[case]
    ids = _prompt(rng, b=4, s=3)
    feeds: dict[str, np.ndarray] = {"input_ids": ids, "max_length": np.array([16], np.int32)}
    if "repetition_penalty" in spec:
        feeds["min_length"] = np.array([0], np.int32)
        feeds["repetition_penalty"] = spec["repetition_penalty"]
    if spec.get("presence"):
        feeds["presence_mask"] = (rng.random((4, V)) > 0.5).astype(np.int32)
    if "seed" in spec:
        feeds["seed"] = np.array([spec["seed"]], np.int32)
    attrs = {"eos_token_id": V - 1, "pad_token_id": 0, **spec["attrs"]}
    model = _sampling_model(rng, feeds, **attrs)
    want = ort_run(model, feeds)
    got, _ = anychip_run(model, feeds)
    np.testing.assert_array_equal(got[0], want[0])
    assert len(np.unique(want[0][:, 3:])) > 2  # drawn, not a constant


def test_sampling_refuses_a_presence_penalty() -> None:
    """onnxruntime 1.32's CPU kernel applies it to the first score only: refused (048)."""
    rng = np.random.default_rng(12)
    ids = _prompt(rng)
    feeds = {"input_ids": ids, "max_length": np.array([8], np.int32)}
    feeds["presence_mask"] = np.ones((3, V), np.int32)
    attrs = {"eos_token_id": V - 1, "pad_token_id": 0, "top_p": 0.9, "presence_penalty": 1.0}
    sess = anychip.load(_sampling_model(rng, feeds, **attrs), devices=["cpu"])
    with pytest.raises(anychip.AnychipError, match="presence_penalty"):
        sess.run(None, feeds)


@pytest.mark.parametrize("op", ["GreedySearch", "Sampling"])
def test_sequences_declared_three_dimensional_is_read_as_two(op) -> None:
    """onnxruntime's tiny_gpt2_sampling.onnx declares BeamSearch's [batch, n, max_length]
    for a 2-D result: the declaration is dropped at load, as onnxruntime ignores it."""
    rng = np.random.default_rng(13)
    feeds = {"input_ids": _prompt(rng), "max_length": np.array([7], np.int32)}
    attrs: dict[str, Any] = {"eos_token_id": V - 1, "pad_token_id": 0}
    if op == "Sampling":
        attrs.update(top_p=0.9, min_tokens_to_keep=1)
    model = (_model if op == "GreedySearch" else _sampling_model)(rng, feeds, **attrs)
    out = model.graph.output[0]
    out.CopyFrom(h.make_tensor_value_info("sequences", TP.INT32, ["batch", "n", "max_length"]))
    want = ort_run(model, feeds)
    got, _ = anychip_run(model, feeds)
    np.testing.assert_array_equal(got[0], want[0])
