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

from collections.abc import Callable
from typing import Any

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.core.run.program import KernelContext
from anychip.errors import KernelError
from anychip.ir.graph import Graph
from anychip.opsets.com_microsoft import MS_DOMAIN

__all__ = ["greedy_search", "sampling", "process_logits"]

_LOWEST = np.finfo(np.float32).min


def _check_decoder(op: str, decoder: Graph, what: str) -> tuple[int, int]:
    """The past's ``(heads, head_size)`` of a GPT-2 style subgraph, or a KernelError."""
    names = [v.name for v in decoder.inputs]
    n_past = len(decoder.outputs) - 1
    if names[:3] != ["input_ids", "position_ids", "attention_mask"] or len(names) != 3 + n_past:
        raise KernelError(
            f"{op}: the {what} subgraph takes {names}; anychip runs the GPT-2 form "
            "(input_ids, position_ids, attention_mask, past_0...) -> (logits, present_0...) "
            "without a shared past buffer; run this model with onnxruntime"
        )
    shape = decoder.inputs[3].shape if n_past else None
    if shape is None or len(shape) != 5 or not all(isinstance(d, int) for d in shape[2::2]):
        raise KernelError(
            f"{op}: the {what} subgraph's past_0 must be declared "
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
    temperature: float = 1.0,
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
    if temperature > 0 and temperature != 1.0:
        scores /= np.float32(temperature)
    return scores


def _scalar(op: str, x: Any, what: str, default: float) -> float:
    if x is None:
        return default
    a = np.asarray(x)
    if a.size != 1:
        raise KernelError(f"{op}: {what} must hold one value, got shape {list(a.shape)}")
    return float(a.reshape(-1)[0])


class _Rules:
    """The logits processors' settings of one run (``process_logits``' keywords)."""

    def __init__(self, op: str, min_length: Any, repetition_penalty: Any, **kw: Any) -> None:
        self.kw = dict(
            repetition_penalty=_scalar(op, repetition_penalty, "repetition_penalty", 1.0),
            min_length=int(_scalar(op, min_length, "min_length", 0)),
            **kw,
        )
        if self.kw["repetition_penalty"] <= 0:
            raise KernelError(f"{op}: repetition_penalty must be greater than 0")


def _generate(
    ctx: KernelContext,
    op: str,
    input_ids: np.ndarray,
    max_length: np.ndarray,
    attention_mask: np.ndarray | None,
    rules: _Rules,
    choose: Callable[[np.ndarray], np.ndarray],
    *,
    decoder: Graph,
    init_decoder: Graph | None,
    encoder: Graph | None,
    model_type: int,
    eos_token_id: int,
    pad_token_id: int,
) -> np.ndarray:
    """The decoding loop GreedySearch and Sampling share; ``choose`` picks each row's next
    token from its processed scores ``[B, V]``."""
    if model_type != 0 or encoder is not None:
        raise KernelError(
            f"{op}: model_type {model_type} (an encoder-decoder) is not supported on the CPU, "
            "only decoder-only models (model_type 0); run this model with onnxruntime"
        )
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise KernelError(f"{op}: input_ids must be [batch, length], got {list(ids.shape)}")
    b, s = ids.shape
    total = int(_scalar(op, max_length, "max_length", 0))
    if total <= s:
        raise KernelError(
            f"{op}: max_length ({total}) must be greater than the prompt's length ({s})"
        )
    heads, head_size = _check_decoder(op, decoder, "decoder")
    if init_decoder is not None:
        _check_decoder(op, init_decoder, "init_decoder")
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
            raise KernelError(f"{op}: logits of shape {list(logits.shape)}, not 3-D")
        scores = process_logits(logits[:, -1, :], sequences, step, **rules.kw)
        nxt = choose(scores).astype(np.int32)
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
    rules = _Rules(
        "GreedySearch",
        min_length,
        repetition_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size,
        vocab_mask=vocab_mask,
        prefix_vocab_mask=prefix_vocab_mask,
        eos_token_id=eos_token_id,
    )
    return _generate(
        ctx,
        "GreedySearch",
        input_ids,
        max_length,
        attention_mask,
        rules,
        lambda scores: np.argmax(scores, axis=1),
        decoder=decoder,
        init_decoder=init_decoder,
        encoder=encoder,
        model_type=model_type,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )


class _MinStdRand0:
    """libstdc++'s ``std::default_random_engine`` (``minstd_rand0``) and its
    ``uniform_real_distribution<double>(0, 1)``: onnxruntime's sampler draws from them."""

    _M = 2147483647
    _RANGE = 2147483646.0  # max - min + 1

    def __init__(self, seed: int) -> None:
        s = seed % self._M
        self.x = s if s else 1

    def uniform(self) -> float:
        """``generate_canonical<double, 53>``: two draws of 31 bits."""
        total, scale = 0.0, 1.0
        for _ in range(2):
            self.x = self.x * 16807 % self._M
            total += float(self.x - 1) * scale
            scale *= self._RANGE
        u = total / scale
        return u if u < 1.0 else float(np.nextafter(1.0, 0.0))


def _softmax32(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(), dtype=np.float32)
    return (e / e.sum(dtype=np.float32)).astype(np.float32)


def _top_p(row: np.ndarray, top_p: float, filter_value: float, keep: int, custom: int) -> None:
    """onnxruntime's nucleus filter, in place on one row of scores: tokens sorted by score,
    their softmax summed along the order, and the tokens past the bound set to
    ``filter_value`` (ascending, the low tail whose mass stays within ``1 - top_p``; with
    ``custom``, descending, every token after the mass first exceeds ``top_p``)."""
    v = row.shape[0]
    order = np.argsort(-row if custom else row, kind="stable")
    cum = np.cumsum(_softmax32(row[order]), dtype=np.float32)
    p = np.float32(top_p)
    if custom:
        cut = [j + 1 for j in range(v - 1) if cum[j] > p]
    else:
        cut = [j for j in range(v - keep) if cum[j] <= np.float32(1) - p]
    row[order[cut]] = np.float32(filter_value)


def _multinomial(row: np.ndarray, engine: _MinStdRand0) -> int:
    """onnxruntime's Multinomial on one row of logits (non-finite ones weigh nothing)."""
    finite = np.isfinite(row)
    if not finite.any():
        raise KernelError(
            "Sampling: every token was filtered out (top_p, min_tokens_to_keep, vocab_mask); "
            "raise top_p (0 keeps only rounding noise) or min_tokens_to_keep"
        )
    top = float(row[finite].max())
    weights = np.where(finite, np.exp(row.astype(np.float64) - top), 0.0)
    cdf = np.cumsum(weights)
    return int(np.searchsorted(cdf, engine.uniform() * cdf[-1], side="right"))


@kernel("Sampling", domain=MS_DOMAIN, since=1, context=True)
def sampling(
    ctx: KernelContext,
    input_ids: np.ndarray,
    max_length: np.ndarray,
    min_length: np.ndarray | None = None,
    repetition_penalty: np.ndarray | None = None,
    vocab_mask: np.ndarray | None = None,
    prefix_vocab_mask: np.ndarray | None = None,
    attention_mask: np.ndarray | None = None,
    presence_mask: np.ndarray | None = None,
    seed: np.ndarray | None = None,
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
    temperature: float = 1.0,
    top_p: float = 0.0,
    filter_value: float = float("-inf"),
    min_tokens_to_keep: int = 0,
    presence_penalty: float = 0.0,
    custom: int = 0,
) -> np.ndarray:
    """Greedy search's loop with each token drawn from the nucleus (``top_p``) of the
    processed scores, from onnxruntime's random engine seeded with ``seed`` (default 0)."""
    if ctx.num_outputs > 1 and ctx.outputs_used[1]:
        raise KernelError(
            "Sampling: the filtered_logits output is a debug output of onnxruntime builds "
            "with DEBUG_GENERATION; anychip does not produce it: drop it from the node"
        )
    if presence_mask is not None and presence_penalty != 0.0:
        raise KernelError(
            "Sampling: presence_mask with a presence_penalty is not supported: onnxruntime's "
            "CPU kernel subtracts the whole penalty from the first score only (its loop does "
            "not advance), and anychip refuses rather than differ; set presence_penalty to 0 "
            "or drop presence_mask"
        )
    first = int(_scalar("Sampling", seed, "seed", 0))
    if first < 0:
        raise KernelError(f"Sampling: seed must be >= 0, got {first}")
    engine = _MinStdRand0(first)
    rules = _Rules(
        "Sampling",
        min_length,
        repetition_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size,
        vocab_mask=vocab_mask,
        prefix_vocab_mask=prefix_vocab_mask,
        eos_token_id=eos_token_id,
        temperature=temperature,
    )

    def choose(scores: np.ndarray) -> np.ndarray:
        picked = np.empty(scores.shape[0], np.int32)
        for r, row in enumerate(scores):
            _top_p(row, top_p, filter_value, min_tokens_to_keep, custom)
            picked[r] = _multinomial(row, engine)
        return picked

    return _generate(
        ctx,
        "Sampling",
        input_ids,
        max_length,
        attention_mask,
        rules,
        choose,
        decoder=decoder,
        init_decoder=init_decoder,
        encoder=encoder,
        model_type=model_type,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
