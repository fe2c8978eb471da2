"""``com.microsoft`` BeamSearch: a decoder subgraph run in a loop over ``num_beams`` beams.

What onnxruntime's CPU kernel does (decision 056), for T5-style encoder-decoders
(``model_type`` 1) and GPT-2 style decoders (``model_type`` 0):

- **T5**: the ``encoder`` runs once on the prompt ``input_ids [B, S]``, its attention mask (given,
  else 0 on the left padding only: a pad after the first real token counts) and, in the old
  form (three inputs), ``decoder_input_ids [B, 1]`` of ``decoder_start_token_id``. Its outputs
  are ``(logits, encoder_hidden_states, present self k/v per layer, present cross k/v per
  layer)`` (old form) or the cross k/v only (new form). The sequences start as the start token;
  the encoder's logits, when it has them, choose the first token (unless ``max_length`` is 2).
  The decoder takes ``input_ids`` (the new tokens ``[B*W, 1]``, or the whole sequences when it
  declares ``input_ids`` of another length than 1 or the encoder has no logits), optionally
  ``encoder_input_ids``, ``encoder_attention_mask``, optionally ``encoder_hidden_states``, the
  self pasts, then the cross pasts; every batch row is repeated ``W`` times. Each step the
  self presents become the pasts, reordered by the beams chosen; the cross pasts stay.
- **GPT-2**: the prompt, its positions and mask repeated ``W`` times, the pasts empty, as in
  GreedySearch (``op_contrib_greedy_search.py``); each step the presents, reordered along
  their batch axis, become the pasts.
- **A step** (``_Beams.step``): the last position's logits, their float32 log-softmax (the
  CPU's LogSoftmax kernel, within an ulp of onnxruntime's), the logits processors
  (``process_logits``: repetition penalty, no-repeat n-grams, vocab mask, prefix mask on the
  first step, min length), each beam's running score added, then the
  ``2 W`` best of each batch over ``W * V`` (the first on a tie). The scorer walks them in
  order: an end-of-sequence among the first ``W`` adds the beam (without the eos) to the
  batch's finished hypotheses at ``score / length ** length_penalty``; other tokens fill the
  ``W`` beams of the next step. A batch is done when it holds ``W`` hypotheses and, without
  ``early_stopping``, none can improve (onnxruntime reads the best next score at offset
  ``batch * W`` of the ``[B, 2 W]`` candidates, not ``batch * 2 W``: kept). The loop stops at
  ``max_length`` or when every batch is done; open beams then join the hypotheses with their
  running scores, and the best ``num_return_sequences`` are returned, padded with
  ``pad_token_id``.

Outputs: ``sequences [B, R, max_length]`` (int32), ``sequences_scores [B, R]``, ``scores
[max_length - S, B, W, V]`` (each step's processed scores with the beam scores added; steps
after an early stop are left unwritten by onnxruntime: zeros here). Refused with what to do:
decoders with a shared past buffer (``past_sequence_length``), float16 subgraphs,
``decoder_input_ids`` (Whisper's input), a ``vocab_size`` other than the logits'.
``logits_processor`` is read by Whisper only: ignored, as onnxruntime does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._libm import powf
from anychip.backends.cpu.kernels.op_contrib_greedy_search import (
    _check_decoder,
    _first_feeds,
    _Rules,
    _scalar,
    process_logits,
)
from anychip.backends.cpu.kernels.op_softmax import log_softmax
from anychip.backends.cpu.table import kernel
from anychip.core.run.program import KernelContext
from anychip.errors import KernelError
from anychip.ir.graph import Graph
from anychip.opsets.com_microsoft import MS_DOMAIN

__all__ = ["beam_search"]

_OP = "BeamSearch"


class _Hypotheses:
    """One batch's finished beams, best first (onnxruntime's ``BeamHypotheses``)."""

    def __init__(self, size: int, length_penalty: float) -> None:
        self.size, self.penalty = size, np.float32(length_penalty)
        self.items: list[tuple[np.float32, np.ndarray]] = []
        self.done = False

    def _score(self, total: float, length: int) -> np.float32:
        return np.float32(np.float32(total) / powf(float(length), float(self.penalty)))

    def add(self, tokens: np.ndarray, total: float) -> None:
        score = self._score(total, len(tokens))
        if len(self.items) == self.size:
            if score <= self.items[-1][0]:
                return
            self.items.pop()
        at = len(self.items)
        while at > 0 and score > self.items[at - 1][0]:
            at -= 1
        self.items.insert(at, (score, tokens.copy()))

    def can_improve(self, best: float, length: int) -> bool:
        return bool(self.items[-1][0] < self._score(best, length))


class _Beams:
    """The beam state between steps: sequences ``[B*W, L]``, running scores, the scorer."""

    def __init__(self, batch: int, beams: int, first: np.ndarray, a: dict[str, Any]) -> None:
        self.b, self.w = batch, beams
        self.sequences = first.astype(np.int32)
        scores = np.zeros((batch, beams), np.float32)
        scores[:, 1:] = np.float32(-1e9)  # the first step draws from beam 0 only
        self.scores: np.ndarray = scores.reshape(-1)
        self.hyps = [_Hypotheses(beams, a["length_penalty"]) for _ in range(batch)]
        self.indices = np.arange(batch * beams)
        self.tokens = self.sequences[:, -1]
        self.a, self.step_no = a, 0
        self.recorded: list[np.ndarray] = []

    def done(self) -> bool:
        return all(h.done for h in self.hyps)

    def step(self, logits: np.ndarray) -> None:
        """One token for every beam from the subgraph's ``logits [rows, length, V]``."""
        a, b, w = self.a, self.b, self.w
        logits = np.asarray(logits)
        if logits.ndim != 3 or logits.shape[0] not in (b, b * w):
            raise KernelError(
                f"{_OP}: logits of shape {list(logits.shape)}; expected [batch * num_beams "
                f"({b * w}) or batch ({b}), length, vocab]"
            )
        if logits.dtype != np.float32:
            raise KernelError(
                f"{_OP}: the subgraphs compute in {logits.dtype}; anychip's BeamSearch takes "
                "float32 subgraphs only: export the model in float32 or run it with onnxruntime"
            )
        v = logits.shape[2]
        if a["vocab_size"] not in (-1, 0, v):
            raise KernelError(
                f"{_OP}: vocab_size {a['vocab_size']} differs from the logits' {v}: drop the "
                "attribute or make it match the decoder's output"
            )
        if self.step_no == 0:
            _check_masks(a["rules"], v)
        last = logits[:, -1, :]
        if last.shape[0] != b * w:
            last = np.repeat(last, w, axis=0)
        self.step_no += 1
        scores = process_logits(log_softmax(last), self.sequences, self.step_no, **a["rules"])
        scores += self.scores[:, None]
        if a["record"]:
            self.recorded.append(scores.copy())
        flat = scores.reshape(b, w * v)
        order = np.argsort(-flat, axis=1, kind="stable")[:, : 2 * w]
        top = np.take_along_axis(flat, order, axis=1)
        self._score(top, (order % v).astype(np.int32), (order // v).astype(np.int32))
        self.sequences = np.concatenate(
            [self.sequences[self.indices], self.tokens[:, None]], axis=1
        ).astype(np.int32)

    def _score(self, top: np.ndarray, tokens: np.ndarray, beams: np.ndarray) -> None:
        """onnxruntime's ``BeamSearchScorer::Process`` on the ``2 W`` candidates per batch."""
        b, w, eos = self.b, self.w, self.a["eos"]
        length = self.sequences.shape[1]
        scores = np.zeros(b * w, np.float32)
        nxt = np.full(b * w, self.a["pad"], np.int32)
        idx = np.zeros(b * w, np.int64)
        flat_top = top.reshape(-1)
        for i, hyp in enumerate(self.hyps):
            if hyp.done:
                continue
            filled = 0
            for j in range(2 * w):
                tok, row = int(tokens[i, j]), i * w + int(beams[i, j])
                if eos >= 0 and tok == eos:
                    if j >= w:
                        continue
                    hyp.add(self.sequences[row], float(top[i, j]))
                else:
                    k = i * w + filled
                    scores[k], nxt[k], idx[k] = top[i, j], tok, row
                    filled += 1
                if filled == w:
                    break
            if len(hyp.items) < w:
                continue
            if not self.a["early_stopping"]:
                best = float(flat_top[i * w : i * w + 2 * w].max())
                if hyp.can_improve(best, length):
                    continue
            hyp.done = True
        self.scores, self.tokens, self.indices = scores, nxt, idx

    def finish(self, total: int, returned: int, want_scores: bool) -> tuple[Any, ...]:
        """``sequences``, ``sequences_scores`` and ``scores`` as onnxruntime fills them."""
        b, w = self.b, self.w
        for i, hyp in enumerate(self.hyps):
            if not hyp.done:
                for r in range(i * w, (i + 1) * w):
                    hyp.add(self.sequences[r], float(self.scores[r]))
        seqs = np.full((b, returned, total), self.a["pad"], np.int32)
        best = np.zeros((b, returned), np.float32)
        for i, hyp in enumerate(self.hyps):
            for k, (score, tokens) in enumerate(hyp.items[:returned]):
                seqs[i, k, : len(tokens)] = tokens
                best[i, k] = score
        steps = total - self.a["prompt_length"]
        per_step = np.zeros((steps, b, w, self.recorded[0].shape[1] if self.recorded else 0))
        for t, rec in enumerate(self.recorded[:steps]):
            per_step[t] = rec.reshape(b, w, -1)
        return seqs, best, per_step.astype(np.float32) if want_scores else None


def _check_masks(rules: dict[str, Any], v: int) -> None:
    """onnxruntime's checks of ``vocab_mask [V]`` and ``prefix_vocab_mask [B, V]``."""
    mask, prefix = rules["vocab_mask"], rules["prefix_vocab_mask"]
    if mask is not None and np.shape(mask) != (v,):
        raise KernelError(
            f"{_OP}: vocab_mask must be [vocab_size] ([{v}]), got {list(np.shape(mask))}"
        )
    if prefix is not None and np.shape(prefix)[1] != v:
        raise KernelError(
            f"{_OP}: prefix_vocab_mask must be [batch, vocab_size], got "
            f"{np.shape(prefix)[1]} tokens per row for a vocabulary of {v}"
        )


def _encoder_mask(ids: np.ndarray, mask: np.ndarray | None, pad: int) -> np.ndarray:
    """The encoder's attention mask: given, else 0 on the left padding only."""
    if mask is not None:
        return np.asarray(mask, np.int32)
    seen = np.cumsum(ids != pad, axis=1) > 0
    return seen.astype(np.int32)


def _t5_layout(decoder: Graph) -> tuple[bool, bool, int, bool]:
    """``(takes encoder_input_ids, takes encoder_hidden_states, layers, sequence as input)``
    of a T5 decoder subgraph, or a KernelError naming what differs."""
    names = [v.name for v in decoder.inputs]
    has_ids = len(names) > 1 and names[1] == "encoder_input_ids"
    mask_at = 1 + has_ids
    has_hidden = len(names) > mask_at + 1 and names[mask_at + 1] == "encoder_hidden_states"
    first_past = mask_at + 1 + has_hidden
    n_past = len(names) - first_past
    if names[:1] != ["input_ids"] or names[mask_at : mask_at + 1] != ["encoder_attention_mask"]:
        raise KernelError(
            f"{_OP}: the decoder subgraph takes {names}; anychip runs onnxruntime's T5 form "
            "(input_ids, [encoder_input_ids], encoder_attention_mask, [encoder_hidden_states], "
            "past self k/v..., past cross k/v...): run this model with onnxruntime"
        )
    if n_past < 4 or n_past % 4:
        raise KernelError(
            f"{_OP}: the decoder subgraph has {n_past} inputs after its encoder inputs, not "
            "4 per layer: a decoder with a shared past buffer (past_sequence_length, "
            "cache_indirection) is not supported on the CPU; export it without the shared "
            "buffer or run it with onnxruntime"
        )
    if len(decoder.outputs) != 1 + n_past // 2 or decoder.outputs[0].name != "logits":
        raise KernelError(
            f"{_OP}: the decoder subgraph must output (logits, present self k/v per layer), "
            f"got {[v.name for v in decoder.outputs]}"
        )
    shape = decoder.inputs[0].shape
    one = shape is not None and len(shape) == 2 and shape[1] == 1
    return has_ids, has_hidden, n_past // 4, not one


def _run_t5(ctx: KernelContext, ids: np.ndarray, mask: Any, n: dict[str, Any]) -> _Beams:
    """The encoder once, then the decoder in the loop (onnxruntime's ``BeamSearchT5``)."""
    encoder, decoder, a = n["encoder"], n["decoder"], n["a"]
    b, w, total = ids.shape[0], n["beams"], n["total"]
    if encoder is None:
        raise KernelError(f"{_OP}: model_type 1 (encoder-decoder) needs the encoder attribute")
    start = n["start"]
    enc_names = [v.name for v in encoder.inputs]
    old = len(enc_names) == 3
    if enc_names[:2] != ["encoder_input_ids", "encoder_attention_mask"] or len(enc_names) > 3:
        raise KernelError(
            f"{_OP}: the encoder subgraph takes {enc_names}; onnxruntime's T5 form is "
            "(encoder_input_ids, encoder_attention_mask[, decoder_input_ids])"
        )
    if start < 0:
        raise KernelError(
            f"{_OP}: model_type 1 needs decoder_start_token_id (>= 0): the decoder's "
            "sequences start with it"
        )
    has_ids, has_hidden, layers, whole = _t5_layout(decoder)
    enc_mask = _encoder_mask(ids, mask, a["pad"])
    first = np.full((b, 1), start, np.int32)
    feeds = [ids, enc_mask] + ([first] if old else [])
    enc = ctx.run_graph(encoder, feeds)
    beams = _Beams(b, w, np.repeat(first, w, axis=0), a)
    with_logits = old
    expected = 2 + 4 * layers if old else 2 * layers
    if len(enc) != expected:
        raise KernelError(
            f"{_OP}: the encoder subgraph has {len(enc)} outputs; the decoder's {layers} "
            f"layers need {expected}"
        )
    if with_logits and total < 3:
        raise KernelError(
            f"{_OP}: max_length {total} with an encoder that outputs logits: onnxruntime "
            "feeds the decoder tokens it never chose; use max_length >= 3"
        )
    length = 1
    if with_logits:
        beams.step(enc[0])
        length += 1

    def rep(x: Any) -> np.ndarray:
        return np.repeat(np.asarray(x), w, axis=0)

    fixed = ([rep(ids)] if has_ids else []) + [rep(enc_mask)]
    if has_hidden:
        if not old:
            raise KernelError(
                f"{_OP}: the decoder takes encoder_hidden_states but the encoder does not "
                "output them (it has 2 inputs)"
            )
        fixed.append(rep(enc[1]))
    if old:
        self_past = [rep(x) for x in enc[2 : 2 + 2 * layers]]
        cross = [rep(x) for x in enc[2 + 2 * layers :]]
    else:
        cross = [rep(x) for x in enc]
        self_past = [np.zeros((b * w, c.shape[1], 0, c.shape[3]), c.dtype) for c in cross]
    use_whole = whole or not with_logits
    tokens = beams.sequences if use_whole else beams.tokens[:, None]
    while length < total:
        outs = ctx.run_graph(decoder, [tokens, *fixed, *self_past, *cross])
        beams.step(outs[0])
        if beams.done():
            break
        length += 1
        tokens = beams.sequences if whole else beams.tokens[:, None]
        self_past = [np.asarray(p)[beams.indices] for p in outs[1:]]
    return beams


def _run_gpt(ctx: KernelContext, ids: np.ndarray, mask: Any, n: dict[str, Any]) -> _Beams:
    """The GPT-2 loop (onnxruntime's ``BeamSearchGpt``): GreedySearch's feeds, per beam."""
    decoder, init = n["decoder"], n["init_decoder"]
    w, total = n["beams"], n["total"]
    heads, head_size = _check_decoder(_OP, decoder, "decoder")
    if init is not None:
        _check_decoder(_OP, init, "init_decoder")
    positions, att, next_pos = _first_feeds(ids, mask, n["a"]["pad"])
    ids, positions, att = (np.repeat(x, w, axis=0) for x in (ids, positions, att))
    next_pos = np.repeat(next_pos, w)
    past_dtype = decoder.inputs[3].dtype.numpy if decoder.inputs[3].dtype else np.float32
    pasts = [np.zeros((2, ids.shape[0], heads, 0, head_size), past_dtype)] * (
        len(decoder.outputs) - 1
    )
    beams = _Beams(ids.shape[0] // w, w, ids, n["a"])
    tokens, length, first = ids, ids.shape[1], True
    while length < total:
        graph = init if first and init is not None else decoder
        outs = ctx.run_graph(graph, [tokens, positions, att, *pasts])
        beams.step(outs[0])
        if beams.done():
            break
        length += 1
        tokens = beams.tokens[:, None]
        if not first:
            next_pos = next_pos + 1
        first = False
        positions = next_pos[:, None].astype(np.int32)
        att = np.concatenate([att, np.ones((att.shape[0], 1), np.int32)], axis=1)
        pasts = [np.asarray(p)[:, beams.indices] for p in outs[1:]]
    return beams


@kernel("BeamSearch", domain=MS_DOMAIN, since=1, context=True)
def beam_search(
    ctx: KernelContext,
    input_ids: np.ndarray,
    max_length: np.ndarray,
    min_length: np.ndarray | None = None,
    num_beams: np.ndarray | None = None,
    num_return_sequences: np.ndarray | None = None,
    length_penalty: np.ndarray | None = None,
    repetition_penalty: np.ndarray | None = None,
    vocab_mask: np.ndarray | None = None,
    prefix_vocab_mask: np.ndarray | None = None,
    attention_mask: np.ndarray | None = None,
    decoder_input_ids: np.ndarray | None = None,
    logits_processor: np.ndarray | None = None,
    *,
    decoder: Graph,
    eos_token_id: int,
    pad_token_id: int,
    encoder: Graph | None = None,
    init_decoder: Graph | None = None,
    model_type: int = 0,
    no_repeat_ngram_size: int = 0,
    decoder_start_token_id: int = -1,
    vocab_size: int = -1,
    early_stopping: int = 0,
) -> tuple[Any, ...]:
    """Beam search over a T5 encoder-decoder or a GPT-2 decoder: ``sequences [B, R, max_length]``
    (int32), ``sequences_scores [B, R]``, ``scores [max_length - S, B, W, V]``."""
    if model_type not in (0, 1):
        raise KernelError(
            f"{_OP}: model_type {model_type} is not supported on the CPU (0: GPT-2, 1: T5); "
            "run this model with onnxruntime"
        )
    if decoder_input_ids is not None:
        raise KernelError(
            f"{_OP}: decoder_input_ids is Whisper's input (onnxruntime's T5 and GPT-2 beam "
            "searches do not read it); drop it from the node"
        )
    if eos_token_id < 0 or pad_token_id < 0:
        raise KernelError(f"{_OP}: eos_token_id and pad_token_id must be >= 0")
    ids = np.asarray(input_ids)
    if ids.ndim != 2 or ids.dtype.kind not in "iu":
        raise KernelError(
            f"{_OP}: input_ids must be [batch, length] integers, got {ids.dtype} {list(ids.shape)}"
        )
    ids = ids.astype(np.int32)
    total = int(_scalar(_OP, max_length, "max_length", 0))
    prompt = ids.shape[1] if model_type == 0 else 1
    if not prompt < total <= 4096:
        raise KernelError(
            f"{_OP}: max_length ({total}) must be greater than the decoder's start length "
            f"({prompt}) and at most 4096"
        )
    beams = int(_scalar(_OP, num_beams, "num_beams", 1))
    returned = int(_scalar(_OP, num_return_sequences, "num_return_sequences", 1))
    if not 1 <= returned <= beams <= 128:
        raise KernelError(
            f"{_OP}: need 1 <= num_return_sequences ({returned}) <= num_beams ({beams}) <= 128"
        )
    if prefix_vocab_mask is not None and (
        np.ndim(prefix_vocab_mask) != 2 or np.shape(prefix_vocab_mask)[0] != ids.shape[0]
    ):
        raise KernelError(
            f"{_OP}: prefix_vocab_mask must be [batch ({ids.shape[0]}), vocab_size], got "
            f"{list(np.shape(prefix_vocab_mask))}"
        )
    rules = _Rules(
        _OP,
        min_length,
        repetition_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size,
        vocab_mask=vocab_mask,
        prefix_vocab_mask=None
        if prefix_vocab_mask is None
        else np.repeat(np.asarray(prefix_vocab_mask), beams, axis=0),
        eos_token_id=eos_token_id,
    )
    if rules.kw["min_length"] >= total:
        raise KernelError(f"{_OP}: min_length must be smaller than max_length ({total})")
    a = {
        "rules": rules.kw,
        "eos": eos_token_id,
        "pad": pad_token_id,
        "length_penalty": _scalar(_OP, length_penalty, "length_penalty", 1.0),
        "early_stopping": early_stopping == 1,
        "vocab_size": vocab_size,
        "record": ctx.num_outputs > 2 and ctx.outputs_used[2],
        "prompt_length": prompt,
    }
    n = {
        "decoder": decoder,
        "encoder": encoder,
        "init_decoder": init_decoder,
        "beams": beams,
        "total": total,
        "start": decoder_start_token_id,
        "a": a,
    }
    run = _run_t5 if model_type == 1 else _run_gpt
    state = run(ctx, ids, attention_mask, n)
    outs = state.finish(total, returned, bool(a["record"]))
    return outs[: max(ctx.num_outputs, 1)]
