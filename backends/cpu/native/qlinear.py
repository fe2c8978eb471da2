"""8-bit products and their requantization in one C call: ``QLinearMatMul``, ``QGemm``,
``MatMulInteger`` and ``DequantMatMul`` (the QDQ fusion), and the element-wise quantized ops
around them (``QuantizeLinear``, ``DequantizeLinear``, ``DynamicQuantizeLinear``,
``QLinearAdd``, ``QLinearMul``), per tensor, from generated C (``qlinear_c.py``, built by
``codegen/build.py``).

Why: the quantized models people run are small (a 16 x 32 MLP), where numpy's path spent
about 50 us per product on scalar arithmetic of scales and zero points, and the oneDNN int8
path 38 us, mostly Python around its 4 us primitive (decision 053 has the figures). Here a product
``(A - za) @ (B - zb)`` is summed exactly in 32-bit integers (wrapping modulo 2**32 where the
true sum leaves int32, as ONNX allows) from weights centered once per node into int16
(``centered``), and each row's sums are requantized while still in cache.

Numerics are those of the numpy kernels they replace, operation for operation (IEEE float32
or float64 as noted per mode, ``-ffp-contract=off``, ``nearbyint`` in the default rounding
mode: half to even), so a C call and the numpy path give the same bits; the tests check that.

Modes of ``ac_qmm`` (``acc`` the exact integer sum, ``c`` an int32 bias per column):

* 0, int32: ``acc`` (``MatMulInteger``);
* 1, float32: ``f32(acc + c) * f32(smul * scale[j]) (+ bias[j])`` (``QGemm`` without
  ``y_scale``, ``DequantMatMul``: ``smul`` 1, which changes no bit; the dynamic product of
  ``DynamicQuantMatMul``: ``smul`` the activations' scale);
* 2, 8-bit through float32: ``clip(rint(f32(acc + c) * scale[j] / ys) + yzp)`` (``QGemm``);
* 3, 8-bit through float64: ``clip(rint(f64(acc) * f64(scale[j]) / ys) + yzp)``
  (``QLinearMatMul``).

Every function returns None where it does not apply (no compiler, ``ANYCHIP_NATIVE=0``,
other dtypes or forms) and the caller keeps its numpy path.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from anychip.backends.cpu.native.qlinear_c import CDEF, SOURCE
from anychip.backends.cpu.replay import record as _replay
from anychip.codegen.build import loader

__all__ = [
    "available",
    "centered",
    "Product",
    "quantize",
    "dequantize",
    "dynamic_quantize",
    "qbinary",
    "lookup",
    "MAX_K",
]

#: The longest reduction summed here (a product that long belongs to oneDNN anyway; the C's
#: sums wrap modulo 2**32 at any length, as ONNX allows).
MAX_K = 1 << 16

_lib, forget = loader(SOURCE, CDEF, "ac_qmm")
_U8, _S8 = np.dtype(np.uint8), np.dtype(np.int8)
_F32, _I32 = np.dtype(np.float32), np.dtype(np.int32)
_RANGE = {_U8: (0.0, 255.0), _S8: (-128.0, 127.0)}


_ENV_DATA = getattr(os.environ, "_data", None)
_NATIVE = os.environ.encodekey("ANYCHIP_NATIVE") if _ENV_DATA is not None else None
_OFF = os.environ.encodevalue("0") if _ENV_DATA is not None else None


def _get() -> Any | None:
    # from the environment mapping's own dict: os.environ.get costs 0.75 us (codegen/build.py)
    off = (
        _ENV_DATA.get(_NATIVE) == _OFF
        if _ENV_DATA is not None
        else (os.environ.get("ANYCHIP_NATIVE") == "0")
    )
    return None if off else _lib()


def available() -> bool:
    """Whether the C here is built (a compiler, ``ANYCHIP_NATIVE`` not 0)."""
    return _get() is not None


def _is8(a: np.ndarray) -> bool:
    return a.dtype in _RANGE


def _ptr(ffi: Any, a: np.ndarray, kind: str = "uint8_t[]", write: bool = False) -> Any:
    return ffi.from_buffer(kind, a, require_writable=write)


def centered(b: np.ndarray, zb: np.ndarray | None, trans_b: bool = False) -> np.ndarray | None:
    """``b - zb`` (``b.T - zb`` with ``trans_b``) as C-contiguous int16 ``[K, N]``, ``zb``
    common or per column; None for other forms (8-bit 2-D ``b`` only)."""
    if not _is8(b) or b.ndim != 2:
        return None
    w = (b.T if trans_b else b).astype(np.int16)
    n = w.shape[1]
    if zb is not None:
        z = np.asarray(zb)
        if z.dtype.kind not in "iu" or z.size not in (1, n):
            return None
        w -= z.astype(np.int16).reshape(1, -1) if z.size == n else z.astype(np.int16).reshape(())
    return np.ascontiguousarray(w)


class Product:
    """The product of 8-bit ``a [..., M, K]`` by centered weights ``bc [K, N]``
    (``centered``), or by a given exact int32 product ``raw [M', N]`` (oneDNN's, for large
    sizes), with the epilogue of ``mode`` (module docstring): ``scale`` float32 ``[N]`` or
    one value, ``c`` int32 ``[N]``, ``bias`` float32 ``[N]``, 8-bit results of ``out_dtype``.
    ``then_add`` (modes 2 and 3): ``(bias2, ds, dz, s2, z2)``: each 8-bit result ``q``
    dequantized, ``(q - dz) * ds``, plus ``bias2`` float32 ``[N]``, quantized again,
    ``clip(rint(w / s2) + z2)`` to ``z2``'s type, all in float32 (``QLinearAdd`` after
    ``QLinearMatMul``; QDQ's ``DequantizeLinear``, ``Add``, ``QuantizeLinear``).

    Made once per node while its constants stay the same (kernels keep it), so a call
    converts nothing but ``a`` and its zero point: about 2 us of Python around the C.
    """

    __slots__ = ("n", "k", "mode", "dtype", "keep", "args", "lib", "sealable")

    def __init__(
        self,
        bc: np.ndarray | None,
        n: int,
        mode: int,
        *,
        scale: np.ndarray | float | None = None,
        c: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        ys: float = 1.0,
        yzp: np.ndarray | None = None,
        out_dtype: np.dtype | None = None,
        then_add: tuple | None = None,
    ) -> None:
        self.lib = lib = _get()
        #: whether a call may seal its node: the values held here came from constants of the
        #: graph (``kernels/_qproduct.product_of`` says), so a replay's call is right
        self.sealable = True
        self.n, self.mode, self.k = n, mode, -1 if bc is None else bc.shape[0]
        self.dtype = {0: _I32, 1: _F32}.get(mode, np.dtype(out_dtype or _U8))
        sc = np.ones(1, _F32) if scale is None else np.ascontiguousarray(scale, _F32).reshape(-1)
        if bias is not None:
            bias = np.ascontiguousarray(bias, _F32).reshape(-1)
        if c is not None:
            c = np.ascontiguousarray(c, _I32).reshape(-1)
        ok = lib is not None and sc.size in (1, n) and self.dtype in (_I32, _F32, *_RANGE)
        ok = ok and (c is None or c.size == n) and (bias is None or bias.size == n)
        ok = ok and (bc is None or (bc.dtype == np.int16 and bc.shape[1] == n))
        bias2, p2 = None, None
        if then_add is not None and ok:
            bias2 = np.ascontiguousarray(then_add[0], _F32).reshape(-1)
            z2 = np.asarray(then_add[4])
            ok = mode in (2, 3) and bias2.size == n and z2.dtype in _RANGE and z2.size == 1
            if ok:
                ds, dz, s2 = (float(np.asarray(v).item()) for v in then_add[1:4])
                p2 = np.array([ds, dz, s2, float(z2.item()), *_RANGE[z2.dtype]], _F32)
        if not ok:
            self.lib = None
            return
        ffi, c_lib, _ = lib
        packed = None
        if bc is not None:  # the C's packed layout (ac_qpack)
            packed = np.zeros(max(1, c_lib.ac_qpack_size(bc.shape[0], n)), np.int16)
            bc = np.ascontiguousarray(bc)
            dst = _ptr(ffi, packed, "int16_t[]", True)
            c_lib.ac_qpack(bc.shape[0], n, _ptr(ffi, bc, "int16_t[]"), dst)
        self.keep = (packed, sc, c, bias, bias2, p2)  # what the pointers below point into
        lo, hi = _RANGE.get(self.dtype, (0.0, 0.0))
        if then_add is not None:
            self.dtype = np.asarray(then_add[4]).dtype
        z = 0.0 if yzp is None else float(np.asarray(yzp).item())
        self.args = (
            ffi.NULL if packed is None else _ptr(ffi, packed, "int16_t[]"),
            ffi.NULL if c is None else _ptr(ffi, c, "int32_t[]"),
            _ptr(ffi, sc, "float[]"), int(sc.size > 1),
            ffi.NULL if bias is None else _ptr(ffi, bias, "float[]"), float(ys), z, lo, hi,
            ffi.NULL if bias2 is None else _ptr(ffi, bias2, "float[]"),
            ffi.NULL if p2 is None else _ptr(ffi, p2, "float[]"),
        )  # fmt: skip

    def __call__(
        self,
        a: np.ndarray,
        za: np.ndarray | None,
        raw: np.ndarray | None = None,
        dyn: tuple[np.ndarray, np.ndarray | None] | None = None,
        seal: bool = False,
    ) -> np.ndarray | None:
        """The result for ``a`` (zero point ``za``: one value or one per row), or None;
        ``dyn``: ``DynamicQuantizeLinear``'s float32 scale and uint8 zero point of ``a``
        (mode 1 scales by ``f32(x_scale * scale[j])``), read by the C at each call. The
        C's call is noted for a replay (``replay/record.py``) where ``raw`` is None and the
        zero point is one value (read by the C at each call), and with ``seal`` the running
        instruction sealed (its caller does nothing else)."""
        lib = self.lib
        if lib is None or a.dtype not in _RANGE or a.ndim < 2:
            return None
        k, n = a.shape[-1], self.n
        m = a.size // k if k else 0
        if m == 0 or k == 0 or (raw is None and (k != self.k or k > MAX_K)):
            return None
        if raw is not None and (raw.dtype != _I32 or raw.shape[-1] != n or raw.size != m * n):
            return None
        ffi, c_lib, _ = lib
        rows = smul_p = za_p = ffi.NULL
        if dyn is not None:  # DynamicQuantizeLinear's scale and zero point, read by the C
            if dyn[0].dtype != _F32 or dyn[0].size != 1 or za is not None:
                return None
            smul_p, za = _ptr(ffi, np.ascontiguousarray(dyn[0]), "float[]"), dyn[1]
        if za is not None:
            if za.size == 1 and za.dtype == a.dtype:  # ONNX: a's type
                za_p = _ptr(ffi, np.ascontiguousarray(za))
            elif za.size == m and za.dtype.kind in "iu":
                rows = _ptr(ffi, np.ascontiguousarray(za, _I32), "int32_t[]")
            else:
                return None
        bc, c, sc, cols, bias, ys, yzp, lo, hi, bias2, p2 = self.args
        if raw is None:
            out = _replay.empty(a.shape[:-1] + (n,), self.dtype)
            a_p, raw_p = _ptr(ffi, _replay.contiguous(a)), ffi.NULL
        else:
            out = np.empty(a.shape[:-1] + (n,), self.dtype)
            a_p, raw_p = ffi.NULL, _ptr(ffi, np.ascontiguousarray(raw), "int32_t[]")
        args = (
            m, k, n, a_p, int(a.dtype == _S8), rows, 0, bc if raw is None else ffi.NULL, raw_p,
            c, self.mode, sc, cols, bias, ys, yzp, lo, hi, bias2, p2, 1.0, smul_p, za_p,
            _ptr(ffi, out, write=True),
        )  # fmt: skip
        if c_lib.ac_qmm(*args) < 0:
            return None
        if raw is None and rows == ffi.NULL and _replay.ACTIVE:
            _replay.note(_checked, (c_lib.ac_qmm, args))
            if seal and self.sealable:
                _replay.seal()
        return out


def _checked(fn: Any, args: tuple) -> None:
    """``fn(*args)`` for a replay, raising where the C declined (a NaN, no memory)."""
    if fn(*args):
        raise FloatingPointError(f"{fn} declined its arguments on a replay")


def _value(v: np.ndarray | None) -> float:
    """A scale or zero point of one value as a Python float (0 for none)."""
    return 0.0 if v is None else float(v.item())


def _per_tensor(*params: np.ndarray | None) -> bool:
    return all(p is None or (isinstance(p, np.ndarray) and p.size == 1) for p in params)


def _note(fn: Any, args: tuple, seal: bool) -> None:
    """``fn(*args)`` (just run) noted for a replay; with ``seal`` the instruction sealed."""
    if _replay.ACTIVE:
        _replay.note(fn, args)
        if seal:
            _replay.seal()


def _quant_call(fn: Any, count: int, x: Any, s: np.ndarray, zp: Any, lo: float, hi: float,
                y: Any) -> None:  # fmt: skip
    # scale and zero point read from their arrays at each call: a replay's new values
    if fn(count, x, _value(s), _value(zp), lo, hi, y):
        raise FloatingPointError("QuantizeLinear: a NaN input (numpy's path says what then)")


def quantize(
    x: np.ndarray, s: np.ndarray, zp: np.ndarray | None, seal: bool = False
) -> np.ndarray | None:
    """``QuantizeLinear`` of float32 ``x`` per tensor (one float32 scale, an 8-bit zero point
    or none: uint8); None elsewhere or where ``x`` holds a NaN. Noted for a replay (and the
    instruction sealed with ``seal``)."""
    lib = _get()
    if lib is None or x.dtype != _F32 or not _per_tensor(s, zp) or s.dtype != _F32:
        return None
    dt = _U8 if zp is None else zp.dtype
    if dt not in _RANGE:
        return None
    ffi, c_lib, _ = lib
    out = _replay.empty(x.shape, dt)
    lo, hi = _RANGE[dt]
    xc = _replay.contiguous(x)
    args = (
        c_lib.ac_quant,
        xc.size,
        _ptr(ffi, xc, "float[]"),
        s,
        zp,
        lo,
        hi,
        _ptr(ffi, out, write=True),
    )
    try:
        _quant_call(*args)
    except FloatingPointError:
        return None
    _note(_quant_call, args, seal)
    return out


def _dequant_call(fn: Any, count: int, x: Any, sgn: int, zp: Any, s: np.ndarray, y: Any) -> None:
    fn(count, x, sgn, _value(zp), _value(s), y)


def dequantize(
    x: np.ndarray, s: np.ndarray, zp: np.ndarray | None, seal: bool = False
) -> np.ndarray | None:
    """``DequantizeLinear`` of 8-bit ``x`` per tensor to float32; None for other forms."""
    lib = _get()
    if lib is None or x.dtype not in _RANGE or not _per_tensor(s, zp) or s.dtype != _F32:
        return None
    ffi, c_lib, _ = lib
    xc = _replay.contiguous(x)
    out = _replay.empty(x.shape, _F32)
    y = _ptr(ffi, out, "float[]", True)
    args = (c_lib.ac_dequant, xc.size, _ptr(ffi, xc), int(x.dtype == _S8), zp, s, y)
    _dequant_call(*args)
    _note(_dequant_call, args, seal)
    return out


def dynamic_quantize(
    x: np.ndarray, seal: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``DynamicQuantizeLinear`` of float32 ``x``; None elsewhere or where ``x`` holds a NaN."""
    lib = _get()
    if lib is None or x.dtype != _F32:
        return None
    ffi, c_lib, _ = lib
    xc = _replay.contiguous(x)
    y = _replay.empty(x.shape, _U8)
    scale, zp = _replay.empty((), _F32), _replay.empty((), _U8)
    args = (
        xc.size, _ptr(ffi, xc, "float[]"), _ptr(ffi, y, write=True),
        _ptr(ffi, scale, "float[]", True), _ptr(ffi, zp, write=True),
    )  # fmt: skip
    if c_lib.ac_dynq(*args):
        return None
    _note(_checked, (c_lib.ac_dynq, args), seal)
    return y, scale, zp


def _qbin_call(fn: Any, op: int, a: tuple, b: tuple, sc: Any, zc: Any, lo: float, hi: float,
               y: Any) -> None:  # fmt: skip
    (n, ap, asg, sa, za), (nb, bp, bsg, sb, zb) = a, b
    v = _value
    fn(op, n, ap, asg, v(sa), v(za), nb, bp, bsg, v(sb), v(zb), v(sc), v(zc), lo, hi, y)


def qbinary(
    op: int,
    a: np.ndarray,
    sa: np.ndarray,
    za: np.ndarray | None,
    b: np.ndarray,
    sb: np.ndarray,
    zb: np.ndarray | None,
    sc: np.ndarray,
    zc: np.ndarray | None,
    seal: bool = False,
) -> np.ndarray | None:
    """``QLinearAdd`` (op 0) or ``QLinearMul`` (op 1) per tensor, where one input's shape is
    the other's trailing dimensions (a bias, one value, the same shape); None elsewhere."""
    lib = _get()
    if lib is None or a.dtype not in _RANGE or b.dtype not in _RANGE:
        return None
    if not _per_tensor(sa, za, sb, zb, sc, zc) or not sa.dtype == sb.dtype == sc.dtype == _F32:
        return None
    dt = a.dtype if zc is None else zc.dtype  # the first input's type without one
    if dt not in _RANGE:
        return None
    if a.size < b.size:  # the bigger one first: + and * are commutative in IEEE arithmetic
        a, sa, za, b, sb, zb = b, sb, zb, a, sa, za
    if a.shape != b.shape and b.size != 1:
        tail = b.shape[_lead_ones(b.shape) :]
        if len(tail) > a.ndim or a.shape[a.ndim - len(tail) :] != tail or b.ndim > a.ndim:
            return None
    if b.size == 0 or b.ndim > a.ndim:
        return None
    ffi, c_lib, _ = lib
    ac, bc = _replay.contiguous(a), _replay.contiguous(b)
    out = _replay.empty(a.shape, dt)
    lo, hi = _RANGE[dt]
    args = (
        c_lib.ac_qbin, op, (ac.size, _ptr(ffi, ac), int(a.dtype == _S8), sa, za),
        (bc.size, _ptr(ffi, bc), int(b.dtype == _S8), sb, zb), sc, zc, lo, hi,
        _ptr(ffi, out, write=True),
    )  # fmt: skip
    _qbin_call(*args)
    _note(_qbin_call, args, seal)
    return out


def lookup(x: np.ndarray, table: np.ndarray, seal: bool = False) -> np.ndarray | None:
    """``table[x - min]`` for 8-bit ``x`` and a 256-entry 8-bit ``table`` (the quantized
    unary ops' tables); None for other forms."""
    lib = _get()
    if lib is None or x.dtype not in _RANGE or table.dtype not in _RANGE or table.size != 256:
        return None
    ffi, c_lib, _ = lib
    xc = _replay.contiguous(x)
    out = _replay.empty(x.shape, table.dtype)
    args = (
        xc.size,
        _ptr(ffi, xc),
        int(x.dtype == _S8),
        _ptr(ffi, table),
        _ptr(ffi, out, write=True),
    )
    c_lib.ac_lut(*args)
    _note(c_lib.ac_lut, args, seal)
    return out


def _lead_ones(shape: tuple[int, ...]) -> int:
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return i
