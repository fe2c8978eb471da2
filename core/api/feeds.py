"""Feeds in, outputs out: what ``Session.run`` checks before and after the steps run.

``Feeds`` checks a run's feeds against the model's inputs (names, dtypes, ranks, static
dimensions; an initializer-backed input takes its default when not fed) and selects the
requested outputs; ``detach`` makes sure no output aliases a feed or memory the session keeps.
Every refusal is an ``InputError`` naming the input and saying what to pass instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from anychip.errors import AnychipError, InputError
from anychip.ir.dtypes import DType
from anychip.ir.value import Value, format_shape

__all__ = ["IOInfo", "Feeds", "check_feed", "detach", "random_feeds"]


class IOInfo:
    """A model input or output: ``name``, ``dtype`` (DType), ``shape`` (ints, str or None),
    ``optional``."""

    __slots__ = ("name", "dtype", "shape", "type", "optional")

    def __init__(self, v: Value) -> None:
        self.name = v.name
        #: True when an initializer gives the input a default (old ONNX models list weights
        #: among the inputs); a feed then overrides it.
        self.optional = v.const is not None
        self.dtype = v.dtype
        self.shape = list(v.shape) if v.shape is not None else None
        self.type = v.type_str()

    @property
    def numpy_dtype(self) -> np.dtype | None:
        return self.dtype.numpy if self.dtype else None

    def __repr__(self) -> str:
        return f"IOInfo({self.name!r}, {self.type})"


class Feeds:
    """The checks of one model's inputs and outputs."""

    def __init__(self, inputs: Sequence[Value], outputs: Sequence[Value]) -> None:
        self._inputs = list(inputs)
        self._names = [v.name for v in self._inputs]
        self._known = frozenset(self._names)
        self._defaults = {v.name: v.const for v in self._inputs if v.const is not None}
        self.output_names = [v.name for v in outputs]
        self._all = tuple(range(len(self.output_names)))
        self._fast = [(v, _accepts(v)) for v in self._inputs]
        #: Per input ``(name, dtype, shape or None, rank, static dims)`` when every input has
        #: a declared tensor type: a dict feeding each input once with an array of its dtype
        #: and shape is checked by one pass over it (a full static shape is one comparison);
        #: anything else takes ``check``'s full path and its messages.
        self._quick: tuple[tuple[str, np.dtype, tuple | None, int, tuple], ...] | None = None
        if all(a is not None for _, a in self._fast):
            self._quick = tuple(
                (v.name, a[0], _static(v), a[1], a[2]) for v, a in self._fast if a is not None
            )

    def select(self, output_names: Sequence[str] | None) -> list[int]:
        """The indices of the requested outputs (all for None)."""
        if output_names is None:
            return list(self._all)
        if isinstance(output_names, str):
            raise InputError(
                f"output_names must be a list of names, not the string "
                f"{output_names!r}; write [{output_names!r}]"
            )
        idx = []
        for name in output_names:
            if name not in self.output_names:
                raise InputError(
                    f"unknown output {name!r}; the model's outputs are {self.output_names}"
                )
            idx.append(self.output_names.index(name))
        return idx

    def check(self, feeds: Mapping[str, Any]) -> list[Any]:
        """The arrays to run with, in graph input order; raises ``InputError`` on bad feeds."""
        out = self.quick(feeds)
        return self._check(feeds) if out is None else out

    def quick(self, feeds: Any) -> list[Any] | None:
        """``check``'s answer for the common request, a dict feeding each input once with a
        numpy array of its declared dtype and shape (then no ``DeviceValue`` or device array
        either); None for anything else, which ``check`` looks at in full."""
        quick = self._quick
        if quick is not None and type(feeds) is dict and len(feeds) == len(quick):
            # As many feeds as inputs, each found: no unknown name among them either.
            out = []
            get = feeds.get
            for name, want, static, rank, dims in quick:
                x = get(name)
                if type(x) is not np.ndarray or not (x.dtype is want or x.dtype == want):
                    break
                shape = x.shape
                if shape != static and (
                    static is not None or len(shape) != rank or any(shape[i] != d for i, d in dims)
                ):
                    break
                out.append(x)
            else:
                return out
        return None

    def _check(self, feeds: Mapping[str, Any]) -> list[Any]:
        """``check``'s full path: every refusal with its message."""
        if type(feeds) is not dict and not isinstance(feeds, Mapping):
            raise InputError(
                f"feeds must be a dict of input name -> array, got {type(feeds).__name__}"
            )
        names, known = self._names, self._known
        for k in feeds:
            if k not in known:
                raise InputError(f"unknown input {k!r}; the model's inputs are {names}")
        out = []
        for v, accepts in self._fast:
            x = feeds.get(v.name, _MISSING)
            if x is _MISSING:
                if v.name in self._defaults:
                    out.append(self._defaults[v.name])
                    continue
                raise InputError(
                    f"missing input {v.name!r} ({v.type_str()}); the model's inputs are {names}"
                )
            if (
                accepts is not None
                and type(x) is np.ndarray
                and (x.dtype is accepts[0] or x.dtype == accepts[0])
            ):
                # The common feed: an array of the declared dtype; rank and static dimensions
                # checked here, anything else goes through check_feed and its messages.
                shape = x.shape
                if len(shape) == accepts[1] and all(shape[i] == d for i, d in accepts[2]):
                    out.append(x)
                    continue
            out.append(check_feed(v, x))
        return out


_MISSING = object()


def _accepts(v: Value) -> tuple[np.dtype, int, tuple[tuple[int, int], ...]] | None:
    """What a feed of ``v`` passes without ``check_feed``: ``(dtype, rank, ((axis, size), ...))``
    of its static dimensions; None when every feed takes the full check (no declared type or
    shape, strings, non-tensors)."""
    if not v.is_tensor or not v.dtype or v.shape is None or v.dtype == DType.STRING:
        return None
    try:
        want = np.dtype(v.dtype.numpy)
    except AnychipError:
        return None
    dims = tuple((i, d) for i, d in enumerate(v.shape) if isinstance(d, int))
    return want, len(v.shape), dims


def _static(v: Value) -> tuple[int, ...] | None:
    """``v``'s shape as a tuple when every dimension is a number, else None."""
    shape = v.shape
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(shape)


def check_feed(v: Value, x: Any) -> Any:
    """``x`` as the array input ``v`` takes, or ``InputError`` saying what is wrong."""
    if not v.is_tensor:
        return x
    if not isinstance(x, np.ndarray):
        if isinstance(x, (np.generic, int, float, bool, list, tuple)):
            x = np.asarray(x)
            if v.dtype and x.dtype != v.dtype.numpy and x.dtype.kind == v.dtype.numpy.kind:
                x = x.astype(v.dtype.numpy)
        else:
            raise InputError(
                f"input {v.name!r} expects a numpy array ({v.type_str()}), got {type(x).__name__}"
            )
    if v.dtype:
        want = v.dtype.numpy
        ok = x.dtype == want or (v.dtype == DType.STRING and x.dtype.kind in "OUS")
        if not ok:
            raise InputError(
                f"input {v.name!r} expects dtype {want} ({v.type_str()}), got "
                f"{x.dtype}; convert it with .astype(np.{want})"
            )
        if v.dtype == DType.STRING and x.dtype.kind != "O":
            x = x.astype(object)
    if v.shape is not None:
        if x.ndim != len(v.shape):
            raise InputError(
                f"input {v.name!r} expects rank {len(v.shape)} "
                f"{format_shape(v.shape)}, got rank {x.ndim} with shape "
                f"{list(x.shape)}"
            )
        for i, (want_d, got_d) in enumerate(zip(v.shape, x.shape)):
            if isinstance(want_d, int) and want_d != got_d:
                raise InputError(
                    f"input {v.name!r} expects shape {format_shape(v.shape)}, got "
                    f"{list(x.shape)} (dimension {i} is {got_d}, expected "
                    f"{want_d})"
                )
    return x


def detach(out: Any, feeds: Mapping[str, Any]) -> Any:
    """Outputs never alias a feed or a constant the session keeps."""
    if type(out) is np.ndarray or isinstance(out, np.ndarray):
        flags = out.flags
        if not flags.owndata or not flags.writeable:
            return out.copy()
        for f in feeds.values():
            if out is f:
                return out.copy()
    return out


def random_feeds(sess: object, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of the declared shapes (symbolic dimensions become 1)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in sess.inputs:  # type: ignore[attr-defined]
        if info.optional:
            continue
        if info.shape is None or not info.dtype:
            raise InputError(
                f"input {info.name!r} has no declared shape or type; give it "
                "in the feeds (on the command line: --input name=file.npy)"
            )
        shape = [d if isinstance(d, int) else 1 for d in info.shape]
        dt = info.dtype.numpy
        if dt.kind == "f" or dt.kind == "V":
            arr = rng.random(shape, dtype=np.float32).astype(dt)
        elif dt.kind in "iu":
            arr = rng.integers(0, 10, size=shape).astype(dt)
        elif dt.kind == "b":
            arr = rng.random(shape) > 0.5
        else:
            raise InputError(
                f"cannot make a random value for input {info.name!r} of type "
                f"{info.type}; give it in the feeds "
                "(on the command line: --input name=file.npy)"
            )
        feeds[info.name] = arr
    return feeds
