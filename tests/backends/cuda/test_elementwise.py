"""The fused element-wise emitter: the chain's checks, the source text, and NVRTC compiling
every op's CUDA expression to PTX without a GPU (the nvidia-cuda-nvrtc-cu12 wheel is in the
test extra; the PTX is not run here)."""

from __future__ import annotations

import pytest

from anychip.backends.cuda import nvrtc
from anychip.backends.cuda.elementwise import OPS, Chain, Step, elementwise_parts, raw_source
from anychip.errors import KernelError


def _every_op(dtype: str) -> Chain:
    """One chain using every op once: unary ops on the last value, binary ones with input 1."""
    steps, last = [], 0
    for op, (arity, _, _) in sorted(OPS.items()):
        args = (last,) if arity == 1 else (last, 1)
        steps.append(Step(op, args, (("alpha", 0.5),) if op == "LeakyRelu" else ()))
        last = 2 + len(steps) - 1
    return Chain(2, tuple(steps), (last, 0), dtype)


def test_source_of_a_gelu_chain():
    chain = Chain(
        2, (Step("Add", (0, 1)), Step("Gelu", (2,)), Step("Clip", (3,), (("min", -1.0),))), (4, 2)
    )
    src = raw_source(chain, "k")
    head = (
        'extern "C" __global__ void k(const T* __restrict__ x0, const T* __restrict__ x1, '
        "T* __restrict__ y0, T* __restrict__ y1, const long long n)"
    )
    assert head in src
    assert "C v2 = v0 + v1;" in src
    assert "C v3 = ((C)0.5 * v2 * ((C)1 + erf(v2 * (C)0.70710678118654752)));" in src
    assert "C v4 = fmin(fmax(v3, ((C)-1.0)), ((C)1e308 * (C)1e308));" in src
    assert "y0[i] = (T)(v4);" in src and "y1[i] = (T)(v2);" in src


def test_elementwise_parts_compute_half_in_float():
    ins, outs, body = elementwise_parts(Chain(1, (Step("Relu", (0,)),), (1,), "float16"))
    assert (ins, outs) == ("T x0", "T y0")
    assert body.splitlines() == [
        "typedef float C;",
        "C v0 = (C)(x0);",
        "C v1 = (v0 < (C)0 ? (C)0 : v0);",
        "y0 = (T)(v1);",
    ]


@pytest.mark.parametrize(
    "chain, error",
    [
        (lambda: Chain(1, (Step("Conv", (0,)),), (1,)), "no CUDA expression for Conv"),
        (lambda: Chain(1, (Step("Add", (0,)),), (1,)), "Add takes 2 operand"),
        (lambda: Chain(1, (Step("Relu", (1,)),), (1,)), "reads an operand not yet computed"),
        (lambda: Chain(1, (Step("Relu", (0,)),), (2,)), "not operands of the chain"),
        (lambda: Chain(1, (), (0,), "int32"), "not int32"),
    ],
)
def test_bad_chains_are_refused(chain, error):
    with pytest.raises(KernelError, match=error):
        chain()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nvrtc_compiles_every_op_without_a_gpu(dtype):
    ptx = nvrtc.compile_ptx(raw_source(_every_op(dtype), "every_op"))
    assert ".visible .entry every_op(" in ptx
    loads = [ln for ln in ptx.splitlines() if "ld.global" in ln]
    suffix = dtype.replace("float", ".f")  # the two operands load as float32 or float64
    assert len(loads) >= 2 and all(ln.split()[0].endswith(suffix) for ln in loads[:2])


def test_nvrtc_reports_a_compile_error():
    with pytest.raises(KernelError, match="NVRTC could not compile"):
        nvrtc.compile_ptx('extern "C" __global__ void k() { undefined_thing(); }')
