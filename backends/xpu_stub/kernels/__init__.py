"""ONNX kernels of the XPU: thin wrappers that turn node attributes into C kernel launches.

Shape-like inputs (Reshape's shape, Slice's starts/ends, Reduce axes) are small int64 device
tensors; they are read back to the host to build the launch arguments, as a real driver would
read them before launching.
"""

from __future__ import annotations

from anychip.backends.xpu_stub.driver import launch as K
from anychip.core.plugin.claims import Constraint
from anychip.core.plugin.kernels import KernelTable
from anychip.ir.dtypes import DType

__all__ = ["XPU_KERNELS"]

XPU_KERNELS = KernelTable("xpu")
kernel = XPU_KERNELS.register
F32 = {DType.FLOAT}
F32_I64 = {DType.FLOAT, DType.INT64}


def _ints(t) -> list[int]:
    return [] if t is None else [int(v) for v in t.numpy().reshape(-1)]


def _unary(op: str):
    def fn(x, out=None):
        return K.xpu_unary(op, x, out=out)

    fn.__name__ = f"xpu_{op.lower()}"
    return fn


for _op in sorted(K.UNARY_OPS - {"Gelu"}):
    kernel(_op, since=6, dtypes=F32_I64 if _op in ("Relu", "Neg", "Abs") else F32)(_unary(_op))


@kernel("Gelu", since=20, dtypes=F32)
def gelu(x, *, approximate="none", out=None):
    return K.xpu_unary("Gelu", x, approximate=approximate, out=out)


def _binary(op: str):
    def fn(a, b, out=None):
        return K.xpu_binary(op, a, b, out)

    fn.__name__ = f"xpu_{op.lower()}"
    return fn


def _present(node) -> list:
    return [v for v in node.inputs if v is not None]


def _equal_dtypes(node) -> bool:
    a, b = ([v.dtype for v in _present(node)] + [None, None])[:2]
    return not (a and b and a != b)


#: What the C kernels take, declared: two inputs (Max/Min/Sum are variadic in ONNX) of one dtype.
BINARY_CONSTRAINTS = (
    Constraint("two inputs only (the XPU kernel takes 2)", lambda n: len(_present(n)) == 2),
    Constraint("inputs of one dtype (the XPU does not convert)", _equal_dtypes),
)
for _op in sorted(K.BINARY_OPS):
    kernel(
        _op,
        since=7 if _op not in ("Max", "Min") else 8,
        dtypes=F32_I64,
        constraints=BINARY_CONSTRAINTS,
    )(_binary(_op))


@kernel("MatMul", since=1, dtypes=F32_I64)
def matmul(a, b, out=None):
    return K.xpu_matmul(a, b, out)


@kernel("Gemm", since=7, dtypes=F32)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    return K.xpu_gemm(a, b, c, transA=transA, transB=transB, alpha=alpha, beta=beta)


@kernel("Softmax", since=1, dtypes=F32)
def softmax_v1(x, *, axis=1, out=None):
    return K.xpu_softmax(x, axis, coerce_2d=True, out=out)


@kernel("Softmax", since=13, dtypes=F32)
def softmax(x, *, axis=-1, out=None):
    return K.xpu_softmax(x, axis, out=out)


@kernel("LogSoftmax", since=1, dtypes=F32)
def log_softmax_v1(x, *, axis=1):
    return K.xpu_softmax(x, axis, log=True, coerce_2d=True)


@kernel("LogSoftmax", since=13, dtypes=F32)
def log_softmax(x, *, axis=-1):
    return K.xpu_softmax(x, axis, log=True)


@kernel(
    "LayerNormalization",
    since=17,
    dtypes=F32,
    constraints=[
        Constraint(
            "Y only: no Mean or InvStdDev outputs (the XPU gives Y only)",
            lambda n: all(v is None for v in n.outputs[1:]),
        )
    ],
)
def layer_norm(x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1, out=None):
    return K.xpu_layer_norm(x, scale, bias, axis, epsilon, out)


def _reduce_attr(op: str):
    def fn(x, *, axes=None, keepdims=1):
        return K.xpu_reduce(op, x, axes, bool(keepdims))

    return fn


def _reduce_input(op: str):
    def fn(x, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        return K.xpu_reduce(
            op, x, _ints(axes), bool(keepdims), noop_with_empty_axes=bool(noop_with_empty_axes)
        )

    return fn


for _op in sorted(K.REDUCE_OPS):
    _moved = 13 if _op == "ReduceSum" else 18
    _types = F32 if _op == "ReduceMean" else F32_I64
    kernel(_op, since=1, dtypes=_types)(_reduce_attr(_op))
    kernel(_op, since=_moved, dtypes=_types)(_reduce_input(_op))


@kernel("Transpose", since=1)
def transpose(x, *, perm=None, out=None):
    return K.xpu_transpose(x, perm, out)


@kernel("Concat", since=4)
def concat(*xs, axis):
    return K.xpu_concat(list(xs), axis)


@kernel("Slice", since=1)
def slice_v1(x, *, starts, ends, axes=None):
    return K.xpu_slice(x, starts, ends, axes)


@kernel("Slice", since=10)
def slice_(x, starts, ends, axes=None, steps=None):
    return K.xpu_slice(
        x,
        _ints(starts),
        _ints(ends),
        _ints(axes) if axes is not None else None,
        _ints(steps) if steps is not None else None,
    )


@kernel("Reshape", since=5)
def reshape(x, shape, *, allowzero=0):
    return K.xpu_reshape(x, _ints(shape), allowzero=bool(allowzero))


@kernel("Expand", since=8)
def expand(x, shape):
    return K.xpu_expand(x, _ints(shape))


@kernel("FusedAttention", domain="anychip", since=1, dtypes=F32)
def fused_attention(q, kt, v, mask=None, *, scale, divide=1):
    from anychip.backends.xpu_stub.driver.launch_attention import xpu_attention

    return xpu_attention(q, kt, v, mask, scale=scale, divide=divide)
