"""com.microsoft decoding ops against onnxruntime on models made here: MultiHeadAttention's
shared past/present buffer, beam search's cache indirection and its ``qk`` output
(decision 048)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import anychip
from tests.wild._compare import anychip_run, assert_same, ort_run

_MS = "com.microsoft"
_MHA_INPUTS = [
    "query",
    "key",
    "value",
    "bias",
    "key_padding_mask",
    "attention_bias",
    "past_key",
    "past_value",
    "past_sequence_length",
    "cache_indirection",
]
_INT_INPUTS = {"key_padding_mask", "past_sequence_length", "cache_indirection"}
_MHA_OUTPUTS = ["output", "present_key", "present_value", "qk"]


def _mha_model(feeds: dict[str, np.ndarray], outputs: list[int], **attrs: Any) -> onnx.ModelProto:
    ins = [n if n in feeds else "" for n in _MHA_INPUTS]
    while ins[-1] == "":
        ins.pop()
    outs = [_MHA_OUTPUTS[i] if i in outputs else "" for i in range(max(outputs) + 1)]
    node = h.make_node("MultiHeadAttention", ins, outs, domain=_MS, **attrs)
    g = h.make_graph(
        [node],
        "mha",
        [
            h.make_tensor_value_info(n, TP.INT32 if n in _INT_INPUTS else TP.FLOAT, v.shape)
            for n, v in feeds.items()
        ],
        [h.make_tensor_value_info(o, TP.FLOAT, None) for o in outs if o],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(_MS, 1)])
    m.ir_version = 8
    return m


def _mha_feeds(
    rng: np.random.Generator,
    *,
    batch: int,
    beams: int,
    seq: int,
    max_len: int,
    past: int | None,
    cross: bool = False,
    mask: bool = False,
    attention_bias: tuple[int, ...] | None = None,
    indirection: bool = True,
) -> dict[str, np.ndarray]:
    n, hs = 2, 4
    d = n * hs

    def f(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    feeds = {"query": f(batch, seq, d), "bias": f(3 * d)}
    if cross:
        feeds["key"], feeds["value"] = f(batch, n, 5, hs), f(batch, n, 5, hs)
        total = 5
    else:
        feeds["key"], feeds["value"] = f(batch, seq, d), f(batch, seq, d)
        feeds["past_key"], feeds["past_value"] = f(batch, n, max_len, hs), f(batch, n, max_len, hs)
        total = (past or 0) + seq
    if past is not None:
        feeds["past_sequence_length"] = np.array([past], np.int32)
    if indirection:
        shape = (batch // beams, beams, max_len)
        feeds["cache_indirection"] = rng.integers(0, beams, shape).astype(np.int32)
    if mask:
        m = rng.integers(0, 2, (batch, total)).astype(np.int32)
        m[:, -1] = 1
        feeds["key_padding_mask"] = m
    if attention_bias is not None:
        feeds["attention_bias"] = f(*attention_bias[:2], seq, total)
    return feeds


_CASES = {
    # a beam-search step: one token, a past read through the indirection
    "beam_step": dict(batch=4, beams=2, seq=1, max_len=6, past=3),
    "beam_step_three_beams": dict(batch=6, beams=3, seq=1, max_len=5, past=4),
    "beam_step_mask": dict(batch=4, beams=2, seq=1, max_len=6, past=3, mask=True),
    "beam_step_bias_broadcast": dict(
        batch=4, beams=2, seq=1, max_len=6, past=3, attention_bias=(1, 2)
    ),
    # the indirection is not read: first step, several tokens, or no indirection at all
    "first_step": dict(batch=4, beams=2, seq=1, max_len=6, past=0),
    "prompt": dict(batch=4, beams=2, seq=2, max_len=6, past=2),
    "shared_buffer_only": dict(batch=4, beams=2, seq=1, max_len=6, past=3, indirection=False),
    "cross": dict(batch=4, beams=2, seq=1, max_len=6, past=3, cross=True),
    "cross_first_step": dict(batch=4, beams=2, seq=1, max_len=6, past=0, cross=True),
    "appended_past": dict(batch=4, beams=2, seq=1, max_len=6, past=None),
}


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("case", sorted(_CASES))
def test_multi_head_attention_decoding(case, unidirectional) -> None:
    rng = np.random.default_rng(48)
    spec = _CASES[case]
    feeds = _mha_feeds(rng, **spec)  # type: ignore[arg-type]
    outputs = [0, 3] if spec.get("cross") else [0, 1, 2, 3]
    model = _mha_model(feeds, outputs, num_heads=2, unidirectional=unidirectional)
    want = ort_run(model, feeds)
    got, _ = anychip_run(model, feeds)
    # qk holds -10000 (mask) and the lowest float (causal): compare those relatively
    assert_same(got, want, rtol=1e-5, atol=1e-5)


def test_beam_step_reads_the_indirection() -> None:
    """The result follows the indirection: another beam's past changes the output."""
    rng = np.random.default_rng(7)
    feeds = _mha_feeds(rng, **_CASES["beam_step"])  # type: ignore[arg-type]
    model = _mha_model(feeds, [0, 1, 2], num_heads=2)
    sess = anychip.load(model, devices=["cpu"])
    a = sess.run(None, feeds)
    flipped = dict(feeds, cache_indirection=1 - feeds["cache_indirection"])
    b = sess.run(None, flipped)
    assert not np.allclose(a[0], b[0])
    assert_same(b, ort_run(model, flipped), rtol=1e-5, atol=1e-5)


def test_beam_step_with_a_batch_attention_bias_is_refused() -> None:
    rng = np.random.default_rng(8)
    feeds = _mha_feeds(rng, batch=4, beams=2, seq=1, max_len=6, past=3, attention_bias=(4, 2))
    sess = anychip.load(_mha_model(feeds, [0, 1, 2], num_heads=2), devices=["cpu"])
    with pytest.raises(anychip.AnychipError, match="per batch, not per beam"):
        sess.run(None, feeds)


@pytest.mark.parametrize("past, max_len", [(5, 6), (6, 6), (-1, 6)])
def test_shared_buffer_overflow_is_refused(past, max_len) -> None:
    rng = np.random.default_rng(9)
    feeds = _mha_feeds(rng, batch=2, beams=1, seq=2, max_len=max_len, past=0)
    feeds["past_sequence_length"] = np.array([past], np.int32)
    sess = anychip.load(_mha_model(feeds, [0, 1, 2], num_heads=2), devices=["cpu"])
    with pytest.raises(anychip.AnychipError, match="past_sequence_length"):
        sess.run(None, feeds)
