"""String operators over numpy object arrays of Python ``str``.

RegexFullMatch's spec names RE2 syntax; Python's ``re`` accepts the RE2 subset models use
(it also accepts backreferences and lookarounds, which RE2 would reject).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError, ModelError

__all__ = ["string_concat", "string_normalizer", "string_split", "regex_full_match"]


def _as_str(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _strings(x: Any) -> np.ndarray:
    a = np.asarray(x, dtype=object)
    return np.vectorize(_as_str, otypes=[object])(a) if a.size else a


@kernel("StringConcat", since=20)
def string_concat(x: Any, y: Any) -> np.ndarray:
    a, b = _strings(x), _strings(y)
    try:
        return np.asarray(np.add(a, b), dtype=object)
    except ValueError as e:
        raise KernelError(
            f"StringConcat: shapes {list(a.shape)} and {list(b.shape)} do not broadcast"
        ) from e


@kernel("StringNormalizer", since=10)
def string_normalizer(
    x: Any,
    *,
    case_change_action: str = "NONE",
    is_case_sensitive: int = 0,
    locale: str | None = None,
    stopwords: Sequence[str] | None = None,
) -> np.ndarray:
    a = _strings(x)
    if not (a.ndim == 1 or (a.ndim == 2 and a.shape[0] == 1)):
        raise KernelError(
            f"StringNormalizer: input must have shape [C] or [1, C], got {list(a.shape)}"
        )
    action = case_change_action.upper()
    if action not in ("NONE", "LOWER", "UPPER"):
        raise ModelError(
            f"StringNormalizer: case_change_action must be LOWER, UPPER or NONE, got "
            f"{case_change_action!r}"
        )
    words = list(a.reshape(-1))
    if stopwords:
        if is_case_sensitive:
            stop = set(stopwords)
            words = [w for w in words if w not in stop]
        else:
            stop = {s.casefold() for s in stopwords}
            words = [w for w in words if w.casefold() not in stop]
    if action == "LOWER":
        words = [w.lower() for w in words]
    elif action == "UPPER":
        words = [w.upper() for w in words]
    if not words:
        words = [""]
    out = np.array(words, dtype=object)
    return out.reshape(1, -1) if a.ndim == 2 else out


def _split_one(s: str, delimiter: str | None, maxsplit: int | None) -> list[str]:
    limit = -1 if maxsplit is None else maxsplit
    if not delimiter:
        return s.split(None, limit)
    return s.split(delimiter, limit)


@kernel("StringSplit", since=20)
def string_split(
    x: Any, *, delimiter: str | None = None, maxsplit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    a = _strings(x)
    parts = [_split_one(s, delimiter, maxsplit) for s in a.reshape(-1)]
    width = max((len(p) for p in parts), default=0)
    out = np.full((len(parts), width), "", dtype=object)
    for i, p in enumerate(parts):
        out[i, : len(p)] = p
    counts = np.array([len(p) for p in parts], dtype=np.int64).reshape(a.shape)
    return out.reshape(*a.shape, width), counts


@kernel("RegexFullMatch", since=20)
def regex_full_match(x: Any, *, pattern: str | None = None) -> np.ndarray:
    if pattern is None:
        raise ModelError("RegexFullMatch: the pattern attribute is required")
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise ModelError(f"RegexFullMatch: invalid pattern {pattern!r}: {e}") from e
    a = _strings(x)
    flat = [rx.fullmatch(s) is not None for s in a.reshape(-1)]
    return np.array(flat, dtype=bool).reshape(a.shape)
