"""Spectral operators: DFT (opset 17: axis attribute; opset 20: axis input) and STFT.

Complex values travel as a trailing axis of size 2 (real, imaginary); real inputs have a
trailing axis of size 1. Transforms compute in complex128 through numpy.fft and are cast back
to the input's element type.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.ir.dtypes import DType

__all__ = ["dft_17", "dft_20", "stft"]

_TYPES = frozenset({DType.FLOAT16, DType.FLOAT, DType.DOUBLE, DType.BFLOAT16})


def _to_complex(x: np.ndarray, op: str) -> np.ndarray:
    # float32 inputs transform in complex64 (numpy.fft keeps single precision), others in
    # complex128.
    ct = np.complex64 if x.dtype == np.float32 else np.complex128
    if x.shape[-1] == 1:
        return x[..., 0].astype(ct)
    if x.shape[-1] == 2:
        c = np.empty(x.shape[:-1], dtype=ct)
        c.real = x[..., 0]
        c.imag = x[..., 1]
        return c
    raise KernelError(
        f"{op}: the last axis must have size 1 (real) or 2 (complex), got shape {list(x.shape)}"
    )


def _from_complex(c: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.stack([c.real, c.imag], axis=-1).astype(dtype)


def _scalar(x: Any) -> int:
    return int(np.asarray(x).reshape(-1)[0])


def _dft(x: np.ndarray, dft_length: Any, axis: int, inverse: int, onesided: int) -> np.ndarray:
    x = np.asarray(x)
    rank = x.ndim
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise KernelError(
            f"DFT: axis {axis} is invalid for rank {rank} (the last axis holds real/imag parts)"
        )
    axis = axis % rank
    complex_in = x.shape[-1] == 2
    c = _to_complex(x, "DFT")
    n = None if dft_length is None else _scalar(dft_length)
    if onesided and inverse:
        if not complex_in:
            raise KernelError("DFT: an inverse one-sided DFT (IRFFT) needs complex input")
        length = n if n is not None else 2 * (c.shape[axis] - 1)
        out = np.fft.irfft(c, n=length, axis=axis)
        return out[..., None].astype(x.dtype)
    length = n if n is not None else c.shape[axis]
    out = np.fft.ifft(c, n=length, axis=axis) if inverse else np.fft.fft(c, n=length, axis=axis)
    if onesided:
        out = np.take(out, np.arange(length // 2 + 1), axis=axis)
    return _from_complex(out, x.dtype)


@kernel("DFT", since=17, dtypes=_TYPES)
def dft_17(
    x: np.ndarray, dft_length: Any = None, *, axis: int = 1, inverse: int = 0, onesided: int = 0
) -> np.ndarray:
    return _dft(x, dft_length, axis, inverse, onesided)


@kernel("DFT", since=20, dtypes=_TYPES)
def dft_20(
    x: np.ndarray,
    dft_length: Any = None,
    axis: Any = None,
    *,
    inverse: int = 0,
    onesided: int = 0,
) -> np.ndarray:
    return _dft(x, dft_length, -2 if axis is None else _scalar(axis), inverse, onesided)


@kernel("STFT", since=17, dtypes=_TYPES)
def stft(
    signal: np.ndarray,
    frame_step: Any,
    window: Any = None,
    frame_length: Any = None,
    *,
    onesided: int = 1,
) -> np.ndarray:
    signal = np.asarray(signal)
    if signal.ndim != 3:
        raise KernelError(f"STFT: signal must be rank 3, got shape {list(signal.shape)}")
    c = _to_complex(signal, "STFT")  # (batch, length)
    length = c.shape[1]
    step = _scalar(frame_step)
    if window is not None:
        window = np.asarray(window).astype(np.float64)
    if frame_length is not None:
        flen = _scalar(frame_length)
        if window is not None and window.shape[0] != flen:
            raise KernelError(
                f"STFT: window length {window.shape[0]} differs from frame_length {flen}"
            )
    elif window is not None:
        flen = window.shape[0]
    else:
        flen = length
    if step <= 0 or flen <= 0 or flen > length:
        raise KernelError(
            f"STFT: need 0 < frame_length ({flen}) <= signal length ({length}) and a positive "
            f"frame_step ({step})"
        )
    frames = (length - flen) // step + 1
    idx = np.arange(frames)[:, None] * step + np.arange(flen)[None, :]
    framed = c[:, idx]  # (batch, frames, flen)
    if window is not None:
        framed = framed * window
    out = np.fft.fft(framed, axis=-1)
    if onesided:
        if signal.shape[-1] == 2:
            raise KernelError("STFT: onesided output needs a real signal; set onesided=0")
        out = out[..., : flen // 2 + 1]
    return _from_complex(out, signal.dtype)
