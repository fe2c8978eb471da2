"""``com.microsoft`` GreedySearch: a GPT-2 style decoder subgraph run in a loop, one token a step.

What onnxruntime's CPU kernel does (decision 048), for ``model_type`` 0 (decoder only):

- the first step feeds the prompt: ``input_ids [B, S]``, ``position_ids`` counting the tokens
  that are not ``pad_token_id`` (0 on pads), ``attention_mask`` (given, else 1 where the token
  is not a pad) and every ``past_i`` empty (``[2, B, heads, 0, head_size]``, read from the
  subgraph's declared ``past_0``); ``init_decoder``, when given, runs this first step;
- each step takes the last position's logits, applies in order the repetition penalty (each
  token already in the sequence: a negative score times it, a positive one divided by it),
  ``no_repeat_ngram_size``, ``vocab_mask``, ``prefix_vocab_mask`` (first step only) and
  ``min_length`` (end-of-sequence at the lowest float while the sequence is shorter), then
  picks the highest score (the first on a tie);
- a row that produced ``eos_token_id`` is done: that token and every later one of the row are
  ``pad_token_id``; the loop ends at ``max_length`` or when every row is done;
- the next step feeds the new tokens ``[B, 1]``, the positions (the prompt's token count,
  then one more each step), the mask with a 1 appended and the presents as the pasts.

``sequences`` is ``[B, max_length]``; a loop that ended early leaves the rest of the row
unwritten in onnxruntime: anychip writes ``pad_token_id`` there. Encoder-decoder models
(``model_type`` 1, 2) and decoders with a shared past buffer (a ``past_sequence_length``
input) are refused with what to do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.core.run.program import KernelContext
from anychip.errors import KernelError
from anychip.ir.graph import Graph
from anychip.opsets.com_microsoft import MS_DOMAIN

__all__ = ["greedy_search", "process_logits"]

_LOWEST = np.finfo(np.float32).min


def _check_decoder(decoder: Graph, what: str) -> tuple[int, int]:
    """The past's ``(heads, head_size)`` of a GPT-2 style subgraph, or a KernelError."""
    names = [v.name for v in decoder.inputs]
    n_past = len(decoder.outputs) - 1
    if names[:3] != ["input_ids", "position_ids", "attention_mask"] or len(names) != 3 + n_past:
        raise KernelError(
            f"GreedySearch: the {what} subgraph takes {names}; anychip runs the GPT-2 form "
            "(input_ids, position_ids, attention_mask, past_0...) -> (logits, present_0...) "
            "without a shared past buffer; run this model with onnxruntime"
        )
    shape = decoder.inputs[3].shape if n_past else None
    if shape is None or len(shape) != 5 or not all(isinstance(d, int) for d in shape[2::2]):
        raise KernelError(
            f"GreedySearch: the {what} subgraph's past_0 must be declared "
            "[2, batch, heads, past_length, head_size] with heads and head_size numbers"
        )
    return int(shape[2]), int(shape[4])


def _first_feeds(
    input_ids: np.ndarray, attention_mask: np.ndarray | None, pad: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The prompt's position ids and attention mask, and each row's token count."""
    real = input_ids != pad
    positions = np.where(real, np.cumsum(real, axis=1) - 1, 0).astype(np.int32)
    if attention_mask is None:
        mask = real.astype(np.int32)
    else:
        mask = np.asarray(attention_mask, np.int32)
    return positions, mask, real.sum(axis=1).astype(np.int32)


def process_logits(
    scores: np.ndarray,
    sequences: np.ndarray,
    step: int,
    *,
    repetition_penalty: float,
    no_repeat_ngram_size: int,
    vocab_mask: np.ndarray | None,
    prefix_vocab_mask: np.ndarray | None,
    min_length: int,
    eos_token_id: int,
) -> np.ndarray:
    """onnxruntime's logits processors, in its order, on ``scores [B, V]`` (float32) given
    the ``sequences [B, L]`` so far; ``step`` counts from 1."""
    scores = scores.astype(np.float32, copy=True)
    rows = np.arange(scores.shape[0])
    if repetition_penalty != 1.0:
        for r in rows:
            ids = np.unique(sequences[r])
            s = scores[r, ids]
            scores[r, ids] = np.where(s < 0, s * repetition_penalty, s / repetition_penalty)
    n = no_repeat_ngram_size
    if n > 0 and n <= sequences.shape[1]:
        for r in rows:
            seq = sequences[r]
            prefix = seq[len(seq) - (n - 1) :]
            for j in range(len(seq) - n + 1):
                if n == 1 or np.array_equal(seq[j : j + n - 1], prefix):
                    scores[r, seq[j + n - 1]] = _LOWEST
    if vocab_mask is not None:
        scores[:, np.asarray(vocab_mask).reshape(-1) == 0] = _LOWEST
    if prefix_vocab_mask is not None and step == 1:
        scores[np.asarray(prefix_vocab_mask) == 0] = _LOWEST
    if sequences.shape[1] < min_length and 0 <= eos_token_id < scores.shape[1]:
        scores[:, eos_token_id] = _LOWEST
    return scores


def _scalar(x: Any, what: str, default: float) -> float:
    if x is None:
        return default
    a = np.asarray(x)
    if a.size != 1:
        raise KernelError(f"GreedySearch: {what} must hold one value, got shape {list(a.shape)}")
    return float(a.reshape(-1)[0])


@kernel("GreedySearch", domain=MS_DOMAIN, since=1, context=True)
def greedy_search(
    ctx: KernelContext,
    input_ids: np.ndarray,
    max_length: np.ndarray,
    min_length: np.ndarray | None = None,
    repetition_penalty: np.ndarray | None = None,
    vocab_mask: np.ndarray | None = None,
    prefix_vocab_mask: np.ndarray | None = None,
    attention_mask: np.ndarray | None = None,
    *,
    decoder: Graph,
    eos_token_id: int,
    pad_token_id: int,
    init_decoder: Graph | None = None,
    encoder: Graph | None = None,
    model_type: int = 0,
    no_repeat_ngram_size: int = 0,
    decoder_start_token_id: int = -1,
    vocab_size: int = -1,
) -> np.ndarray:
    """Greedy decoding of a GPT-2 style decoder: ``sequences [B, max_length]`` (int32)."""
    if model_type != 0 or encoder is not None:
        raise KernelError(
            f"GreedySearch: model_type {model_type} (an encoder-decoder) is not supported on "
            "the CPU, only decoder-only models (model_type 0); run this model with onnxruntime"
        )
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise KernelError(f"GreedySearch: input_ids must be [batch, length], got {ids.shape}")
    b, s = ids.shape
    total = int(_scalar(max_length, "max_length", 0))
    if total <= s:
        raise KernelError(
            f"GreedySearch: max_length ({total}) must be greater than the prompt's length ({s})"
        )
    heads, head_size = _check_decoder(decoder, "decoder")
    if init_decoder is not None:
        _check_decoder(init_decoder, "init_decoder")
    rules = dict(
        repetition_penalty=_scalar(repetition_penalty, "repetition_penalty", 1.0),
        no_repeat_ngram_size=no_repeat_ngram_size,
        vocab_mask=vocab_mask,
        prefix_vocab_mask=prefix_vocab_mask,
        min_length=int(_scalar(min_length, "min_length", 0)),
        eos_token_id=eos_token_id,
    )
    if rules["repetition_penalty"] <= 0:  # type: ignore[operator]
        raise KernelError("GreedySearch: repetition_penalty must be greater than 0")
    positions, mask, next_positions = _first_feeds(
        ids.astype(np.int32), attention_mask, pad_token_id
    )
    past_dtype = decoder.inputs[3].dtype.numpy if decoder.inputs[3].dtype else np.float32
    n_past = len(decoder.outputs) - 1
    pasts = [np.zeros((2, b, heads, 0, head_size), past_dtype)] * n_past
    sequences = ids.astype(np.int32)
    tokens, done, step = sequences, np.zeros(b, bool), 0
    while sequences.shape[1] < total:
        step += 1
        graph = init_decoder if step == 1 and init_decoder is not None else decoder
        outs = ctx.run_graph(graph, [tokens, positions, mask, *pasts])
        logits = np.asarray(outs[0])
        if logits.ndim != 3:
            raise KernelError(f"GreedySearch: logits of shape {list(logits.shape)}, not 3-D")
        scores = process_logits(logits[:, -1, :], sequences, step, **rules)  # type: ignore[arg-type]
        nxt = np.argmax(scores, axis=1).astype(np.int32)
        done |= nxt == eos_token_id
        nxt[done] = pad_token_id
        sequences = np.concatenate([sequences, nxt[:, None]], axis=1)
        if done.all():
            break
        tokens = nxt[:, None]
        if step > 1:
            next_positions = next_positions + 1
        positions = next_positions[:, None].astype(np.int32)
        mask = np.concatenate([mask, np.ones((b, 1), np.int32)], axis=1)
        pasts = list(outs[1:])
    out = np.full((b, total), pad_token_id, np.int32)
    out[:, : sequences.shape[1]] = sequences
    return out
