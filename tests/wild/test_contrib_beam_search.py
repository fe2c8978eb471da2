"""com.microsoft BeamSearch against onnxruntime on tiny T5-style encoder-decoders and a GPT-2
style decoder made here (seeded random weights; decision 056)."""

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
from tests.wild.test_contrib_greedy_search import V as GPT_V
from tests.wild.test_contrib_greedy_search import _decoder as _gpt_decoder

_MS = "com.microsoft"
V, D, HEADS, LAYERS = 24, 8, 2, 2
HS = D // HEADS


class _Build:
    """Nodes and initializers of one subgraph, with small helpers for T5's shapes."""

    def __init__(self, rng: np.random.Generator, tag: str) -> None:
        self.rng, self.tag = rng, tag
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.n = 0
        self.const("heads4", np.array([0, -1, HEADS, HS], np.int64))
        self.const("flat3", np.array([0, 0, -1], np.int64))

    def name(self) -> str:
        self.n += 1
        return f"{self.tag}_t{self.n}"

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(nh.from_array(value, name))
        return name

    def weight(self, shape: tuple[int, ...], scale: float = 1.0) -> str:
        w = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return self.const(self.name(), w)

    def op(self, op: str, ins: list[str], out: str | None = None, **attrs: Any) -> str:
        out = out or self.name()
        self.nodes.append(h.make_node(op, ins, [out], **attrs))
        return out

    def heads(self, x: str, out: str | None = None) -> str:
        """``[B, L, D] -> [B, HEADS, L, HS]``"""
        r = self.op("Reshape", [x, "heads4"])
        return self.op("Transpose", [r], out, perm=[0, 2, 1, 3])

    def pooled(self, kv: str) -> str:
        """``[B, HEADS, L, HS] -> [B, 1, D]``: the mean over the positions."""
        m = self.op("ReduceMean", [kv], axes=[2], keepdims=1)
        t = self.op("Transpose", [m], perm=[0, 2, 1, 3])
        return self.op("Reshape", [t, "flat3"])

    def embed(self, ids: str, table: str, keep: str | None = None) -> str:
        """Token embeddings ``[B, L, D]``, zero where the mask ``keep`` is 0."""
        e = self.op("Gather", [table, ids])
        if keep is not None:
            mask = self.op("Cast", [keep], to=TP.FLOAT)
            e = self.op(
                "Mul", [e, self.op("Unsqueeze", [mask, self.const(self.name(), np.array([2]))])]
            )
        return e


def _vi(name: str, dtype: int, shape: list[Any]) -> Any:
    return h.make_tensor_value_info(name, dtype, shape)


def _encoder(rng: np.random.Generator, new_format: bool, markov: str | None = None) -> Any:
    """onnxruntime's T5 encoder contract (decision 056), old form (3 inputs) or new (2)."""
    g = _Build(rng, "enc")
    emb = g.weight((V, D))
    hidden = g.op(
        "Tanh",
        [
            g.op(
                "MatMul",
                [g.embed("encoder_input_ids", emb, "encoder_attention_mask"), g.weight((D, D))],
            )
        ],
    )
    ins = [
        _vi("encoder_input_ids", TP.INT32, ["B", "S"]),
        _vi("encoder_attention_mask", TP.INT32, ["B", "S"]),
    ]
    cross = []
    for i in range(LAYERS):
        for kind in ("key", "value"):
            name = f"present_{kind}_cross_{i}"
            g.heads(g.op("MatMul", [hidden, g.weight((D, D))]), name)
            cross.append(_vi(name, TP.FLOAT, ["B", HEADS, "S", HS]))
    if new_format:
        return h.make_graph(g.nodes, "encoder", ins, cross, g.inits)
    ins.append(_vi("decoder_input_ids", TP.INT32, ["B", 1]))
    g.op("Identity", [hidden], "encoder_hidden_states")
    x = g.op("Gather", [g.weight((V, D)), "decoder_input_ids"])
    selfs = []
    for i in range(LAYERS):
        for kind in ("key", "value"):
            name = f"present_{kind}_self_{i}"
            g.heads(g.op("MatMul", [x, g.weight((D, D))]), name)
            selfs.append(_vi(name, TP.FLOAT, ["B", HEADS, 1, HS]))
    ctx = g.op("ReduceMean", [hidden], axes=[1], keepdims=1)
    if markov:  # logits read from a table by the token: no arithmetic to round differently
        g.op("Gather", [g.const(markov, _markov_table()), "decoder_input_ids"], "logits")
    else:
        g.op("MatMul", [g.op("Tanh", [g.op("Add", [x, ctx])]), g.weight((D, V), 2.0)], "logits")
    outs = [
        _vi("logits", TP.FLOAT, ["B", 1, V]),
        _vi("encoder_hidden_states", TP.FLOAT, ["B", "S", D]),
    ]
    return h.make_graph(g.nodes, "encoder", ins, outs + selfs + cross, g.inits)


def _t5_decoder(
    rng: np.random.Generator, *, whole: bool, enc_ids: bool, hidden: bool, markov: bool = False
) -> Any:
    """onnxruntime's T5 decoder contract: (input_ids, [encoder_input_ids],
    encoder_attention_mask, [encoder_hidden_states], past self k/v..., past cross k/v...) ->
    (logits, present self k/v...)."""
    g = _Build(rng, "dec")
    ins = [_vi("input_ids", TP.INT32, ["B", "L" if whole else 1])]
    x = g.op("Gather", [g.weight((V, D)), "input_ids"])
    if whole:
        x = g.op("ReduceMean", [x], axes=[1], keepdims=1)
    if enc_ids:
        ins.append(_vi("encoder_input_ids", TP.INT32, ["B", "S"]))
        e = g.op(
            "ReduceMean",
            [g.op("Gather", [g.weight((V, D)), "encoder_input_ids"])],
            axes=[1],
            keepdims=1,
        )
        x = g.op("Add", [x, e])
    ins.append(_vi("encoder_attention_mask", TP.INT32, ["B", "S"]))
    if hidden:
        ins.append(_vi("encoder_hidden_states", TP.FLOAT, ["B", "S", D]))
        x = g.op("Add", [x, g.op("ReduceMean", ["encoder_hidden_states"], axes=[1], keepdims=1)])
    outs = [_vi("logits", TP.FLOAT, ["B", 1, V])]
    past: list[Any] = []
    cross: list[Any] = []
    for i in range(LAYERS):
        parts = [x]
        for kind in ("key", "value"):
            name = f"past_{kind}_self_{i}"
            past.append(_vi(name, TP.FLOAT, ["B", HEADS, "P", HS]))
            new = g.heads(g.op("MatMul", [x, g.weight((D, D))]))
            present = g.op("Concat", [name, new], f"present_{kind}_self_{i}", axis=2)
            outs.append(_vi(present, TP.FLOAT, ["B", HEADS, "T", HS]))
            parts.append(g.pooled(present))
            cname = f"past_{kind}_cross_{i}"
            cross.append(_vi(cname, TP.FLOAT, ["B", HEADS, "S", HS]))
            parts.append(g.pooled(cname))
        x = g.op("Tanh", [g.op("Sum", parts)])
    if markov:
        g.op("Gather", [g.const("dec_table", _markov_table()), "input_ids"], "logits")
    else:
        g.op("MatMul", [x, g.weight((D, V), 2.0)], "logits")
    return h.make_graph(g.nodes, "decoder", ins + past + cross, outs, g.inits)


def _markov_table() -> np.ndarray:
    """Next-token logits ``[V, V]`` by the current token alone: two sequences making the same
    transitions in another order score the same, as in onnxruntime's pointer-generator test
    model (a tie onnxruntime orders by insertion)."""
    return (np.random.default_rng(3).standard_normal((V, V)) * 2).astype(np.float32)


_INPUTS = [
    "input_ids",
    "max_length",
    "min_length",
    "num_beams",
    "num_return_sequences",
    "length_penalty",
    "repetition_penalty",
    "vocab_mask",
    "prefix_vocab_mask",
    "attention_mask",
]


def _model(
    graphs: dict[str, Any], feeds: dict[str, np.ndarray], outputs: int, **attrs: Any
) -> onnx.ModelProto:
    ins = [n if n in feeds else "" for n in _INPUTS]
    while ins[-1] == "":
        ins.pop()
    names = ["sequences", "sequences_scores", "scores"][:outputs]
    node = h.make_node("BeamSearch", ins, names, domain=_MS, **graphs, **attrs)
    vis = [
        _vi(k, nh.helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)) for k, v in feeds.items()
    ]
    outs = [
        _vi("sequences", TP.INT32, ["b", "r", "m"]),
        _vi("sequences_scores", TP.FLOAT, ["b", "r"]),
        _vi("scores", TP.FLOAT, ["s", "b", "w", "v"]),
    ][:outputs]
    m = h.make_model(
        h.make_graph([node], "generate", vis, outs),
        opset_imports=[h.make_opsetid("", 17), h.make_opsetid(_MS, 1)],
    )
    m.ir_version = 8
    return m


_T5_CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "one_beam_returned": {"returned": 1},
    "four_beams": {"beams": 4, "returned": 4},
    "length_penalty_short": {"length_penalty": 0.4},
    "length_penalty_long": {"length_penalty": 2.5},
    "early_stopping": {"attrs": {"early_stopping": 1}},
    "no_repeat_ngram": {"attrs": {"no_repeat_ngram_size": 2}},
    "repetition_penalty": {"repetition_penalty": 1.6},
    "min_length": {"min_length": 7},
    "vocab_masks": {"vocab_mask": True, "prefix_vocab_mask": True},
    "scores_output": {"outputs": 3},
    "left_padding": {"pad": True},
    "attention_mask": {"pad": True, "attention_mask": True},
    "new_format_encoder": {"new_format": True},
    "sequence_as_input_ids": {"whole": True, "hidden": True},
    "encoder_ids_in_decoder": {"enc_ids": True, "hidden": True},
    "batch_of_one": {"batch": 1},
    "single_beam": {"beams": 1, "returned": 1},
    "new_format_max_length_2": {"new_format": True, "max_length": 2},
    "markov": {"markov": True},
    "markov_length_penalty": {"markov": True, "length_penalty": 0.7, "beams": 4, "returned": 4},
}


def _t5_case(case: str, eos: int = 2) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    spec = dict(_T5_CASES[case])
    rng = np.random.default_rng(56)
    b, w = spec.get("batch", 3), spec.get("beams", 3)
    ids = rng.integers(3, V, (b, 5)).astype(np.int32)
    if spec.get("pad"):
        ids[0, :2] = 1  # left padding (pad_token_id 1); a pad later in a row counts
        ids[-1, 3] = 1
    feeds: dict[str, np.ndarray] = {
        "input_ids": ids,
        "max_length": np.array([spec.get("max_length", 9)], np.int32),
        "min_length": np.array([spec.get("min_length", 0)], np.int32),  # onnxruntime needs it
        "num_beams": np.array([w], np.int32),
        "num_return_sequences": np.array([spec.get("returned", 2)], np.int32),
        "length_penalty": np.array([spec.get("length_penalty", 1.0)], np.float32),
    }
    if "repetition_penalty" in spec:
        feeds["repetition_penalty"] = np.array([spec["repetition_penalty"]], np.float32)
    if spec.get("vocab_mask"):
        feeds["vocab_mask"] = (rng.random(V) > 0.25).astype(np.int32)
        feeds["vocab_mask"][eos] = 1
    if spec.get("prefix_vocab_mask"):
        feeds["prefix_vocab_mask"] = (rng.random((b, V)) > 0.5).astype(np.int32)
    if spec.get("attention_mask"):
        feeds["attention_mask"] = (rng.random(ids.shape) > 0.2).astype(np.int32)
    graphs = {
        "encoder": _encoder(rng, spec.get("new_format", False), spec.get("markov") and "enc_table"),
        "decoder": _t5_decoder(
            rng,
            whole=spec.get("whole", False),
            enc_ids=spec.get("enc_ids", False),
            hidden=spec.get("hidden", False),
            markov=spec.get("markov", False),
        ),
    }
    attrs = {"eos_token_id": eos, "pad_token_id": 1, "decoder_start_token_id": 0, "model_type": 1}
    attrs.update(spec.get("attrs", {}))
    return _model(graphs, feeds, spec.get("outputs", 2), **attrs), feeds


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[Any]:
    want = ort_run(model, feeds)
    got, _ = anychip_run(model, feeds)
    assert len(got) == len(want)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
    if len(want) > 2:
        np.testing.assert_allclose(got[2], want[2], rtol=1e-4, atol=1e-4)
    return want


@pytest.mark.parametrize("case", sorted(_T5_CASES))
def test_t5_beam_search_matches_onnxruntime(case) -> None:
    model, feeds = _t5_case(case)
    want = _check(model, feeds)
    seqs = want[0]
    assert len({tuple(s) for s in seqs.reshape(-1, seqs.shape[-1])}) > 1  # the beams differ


@pytest.mark.parametrize("case", ["plain", "early_stopping", "length_penalty_short", "single_beam"])
def test_t5_beam_search_finishes_beams_at_eos(case) -> None:
    """With an eos the model picks early, hypotheses end (padded) before max_length."""
    model, feeds = _t5_case(case)
    probe = ort_run(model, feeds)[0]
    eos = int(probe[0, 0, 2])  # the best beam's second generated token
    model, feeds = _t5_case(case, eos=eos)
    want = _check(model, feeds)
    assert (want[0] == 1).any()  # some returned sequence was padded after its eos


def _gpt_model(
    rng: np.random.Generator, feeds: dict[str, np.ndarray], init: bool, **attrs: Any
) -> Any:
    graphs = {"decoder": _gpt_decoder(rng, "decoder")[0]}
    if init:
        graphs["init_decoder"] = _gpt_decoder(rng, "init_decoder")[0]
    return _model(graphs, feeds, 2, **attrs)


@pytest.mark.parametrize(
    "case",
    ["plain", "padded_prompt", "attention_mask", "no_repeat_ngram", "init_decoder", "masks"],
)
def test_gpt2_beam_search_matches_onnxruntime(case) -> None:
    rng = np.random.default_rng(7)
    ids = rng.integers(1, GPT_V, (2, 4)).astype(np.int32)
    if case in ("padded_prompt", "attention_mask"):
        ids[1, :2] = 0
    feeds: dict[str, np.ndarray] = {
        "input_ids": ids,
        "max_length": np.array([11], np.int32),
        "min_length": np.array([0], np.int32),
        "num_beams": np.array([3], np.int32),
        "num_return_sequences": np.array([2], np.int32),
        "length_penalty": np.array([1.2], np.float32),
    }
    attrs: dict[str, Any] = {"eos_token_id": GPT_V - 1, "pad_token_id": 0}
    if case == "no_repeat_ngram":
        attrs["no_repeat_ngram_size"] = 2
    if case == "attention_mask":
        feeds["attention_mask"] = (ids != 0).astype(np.int32)
    if case == "masks":
        feeds["repetition_penalty"] = np.array([1.4], np.float32)
        feeds["vocab_mask"] = (rng.random(GPT_V) > 0.2).astype(np.int32)
        feeds["prefix_vocab_mask"] = (rng.random((2, GPT_V)) > 0.4).astype(np.int32)
        feeds["min_length"] = np.array([8], np.int32)
    _check(_gpt_model(rng, feeds, case == "init_decoder", **attrs), feeds)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"num_return_sequences": 4}, "num_return_sequences"),
        ({"max_length": 1}, "max_length"),
        ({"attrs": {"model_type": 2}}, "model_type 2"),
        ({"attrs": {"decoder_start_token_id": -1}}, "decoder_start_token_id"),
        ({"attrs": {"vocab_size": 7}}, "vocab_size 7"),
        ({"vocab_mask": np.ones(V - 1, np.int32)}, "vocab_mask must be"),
        ({"prefix_vocab_mask": np.ones((2, V), np.int32)}, "prefix_vocab_mask must be"),
    ],
)
def test_beam_search_refuses_what_it_does_not_do(change, match) -> None:
    model, feeds = _t5_case("plain")
    node = model.graph.node[0]
    for k, v in change.get("attrs", {}).items():
        for a in node.attribute:
            if a.name == k:
                node.attribute.remove(a)
                break
        node.attribute.append(h.make_attribute(k, v))
    for k in ("num_return_sequences", "max_length"):
        if k in change:
            feeds[k] = np.array([change[k]], np.int32)
    for k in ("vocab_mask", "prefix_vocab_mask"):
        if k in change:
            model, feeds = _t5_case("vocab_masks")
            feeds[k] = change[k]
            declared = next(i for i in model.graph.input if i.name == k)
            declared.CopyFrom(_vi(k, TP.INT32, list(change[k].shape)))
    sess = anychip.load(model, devices=["cpu"])
    with pytest.raises(anychip.AnychipError, match=match):
        sess.run(None, feeds)
