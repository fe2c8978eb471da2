"""float16 on OpenCL only where the device reports ``cl_khr_fp16``: the claim logic with a
device-info stand-in, PoCL (no fp16) claiming no float16 node, and the half sources of every
family that claims float16 checked by clang's OpenCL C front end (libclang, in the test extra):
no errors with the pragma, errors without it."""

from __future__ import annotations

import clang.cindex as ci
import pytest
from onnx import TensorProto, helper

from anychip.backends.opencl.backend import OpenClBackend
from anychip.backends.opencl.driver.programs import full_source
from anychip.backends.opencl.kernels import (
    KERNELS,
    op_elementwise,
    op_matmul,
    op_normalization,
    op_pool,
    op_reduce,
)
from anychip.core.plugin.host import get_registry
from anychip.ir.dtypes import DType
from anychip.ir.onnx import import_model

FAMILIES = {
    "unary": op_elementwise._unary_source,
    "binary": op_elementwise._binary_source,
    "reduce": op_reduce._source,
    "norm": op_normalization._source,
    "pool": op_pool._source,
    "gemm": op_matmul.source,
}


class _Info:
    """What ``OpenClBackend`` reads of a device, for a device that is not here."""

    def __init__(self, fp16: bool) -> None:
        self.index, self.type, self.key = 0, "gpu", "stand-in"
        self.fp16, self.fp64 = fp16, False
        self.global_mem, self.compute_units, self.clock_mhz = 8 << 30, 32, 1500


class _StandIn(OpenClBackend):
    def __init__(self, fp16: bool) -> None:
        super().__init__("opencl:standin", 0)
        self._info = _Info(fp16)

    @property
    def info(self):
        return self._info

    def _available(self) -> tuple[bool, str]:
        return True, ""


def _node(op: str, dtype: int, n_in: int = 2, domain: str = ""):
    """One node of a loaded model, its values typed ``dtype``."""
    names = [f"x{i}" for i in range(n_in)]
    shapes = {2: [[4, 8], [8, 4]], 1: [[4, 8]], 3: [[2, 4, 8], [2, 8, 4], [2, 4, 8]]}[n_in]
    ins = [helper.make_tensor_value_info(n, dtype, s) for n, s in zip(names, shapes)]
    node = helper.make_node(op, names, ["y"], domain=domain)
    if op == "FusedAttention":
        node.attribute.append(helper.make_attribute("scale", 2.0))
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("y", dtype, None)])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("anychip", 1)]
    proto = helper.make_model(g, opset_imports=opsets).SerializeToString()
    (n,) = import_model(proto, custom_schemas=get_registry().schemas).graph.nodes
    return n


@pytest.mark.parametrize("fp16", [True, False])
def test_float16_is_claimed_only_when_the_device_reports_it(fp16):
    b = _StandIn(fp16)
    assert (DType.FLOAT16 in b.device.dtypes) is fp16
    assert DType.FLOAT in b.device.dtypes and DType.DOUBLE not in b.device.dtypes
    for op, n_in in (("MatMul", 2), ("Relu", 1), ("Add", 2)):
        why = b.supports(_node(op, TensorProto.FLOAT16, n_in), KERNELS)
        assert (why is None) is fp16, why
        assert b.supports(_node(op, TensorProto.FLOAT, n_in), KERNELS) is None
    # FusedAttention computes float and double only, whatever the device reports
    att = _node("FusedAttention", TensorProto.FLOAT16, 3, domain="anychip")
    assert b.supports(att, KERNELS) is not None


def test_pocl_claims_no_float16(cl_device):
    assert not cl_device.info.fp16
    backend = get_registry().backends["opencl"]
    assert DType.FLOAT16 not in backend.device.dtypes
    why = backend.supports(_node("MatMul", TensorProto.FLOAT16))
    assert why is not None and "f16" in why


def _stub() -> str:
    """The few declarations of clang's OpenCL base header the sources use (the libclang wheel
    ships no headers; ``-fdeclare-opencl-builtins`` declares the built-in functions)."""
    out = [
        "typedef unsigned char uchar; typedef unsigned short ushort;",
        "typedef unsigned int uint; typedef unsigned long ulong;",
        "typedef uint cl_mem_fence_flags;",
        "#define INFINITY __builtin_inff()",
        "#define CLK_LOCAL_MEM_FENCE 1",
        "#define CLK_GLOBAL_MEM_FENCE 2",
    ]
    for t in ("char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "float",
              "double", "half"):  # fmt: skip
        out += [f"typedef {t} {t}{n} __attribute__((ext_vector_type({n})));" for n in (2, 4, 8)]
    return "\n".join(out) + "\n"


def _errors(src: str) -> list[str]:
    args = ["-x", "cl", "-cl-std=CL1.2", "--target=spir64", "-cl-no-stdinc"]
    args += ["-Xclang", "-fdeclare-opencl-builtins"]
    tu = ci.Index.create().parse("k.cl", args=args, unsaved_files=[("k.cl", src)])
    return [d.spelling for d in tu.diagnostics if d.severity >= ci.Diagnostic.Error]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_half_source_compiles_with_the_pragma_and_not_without(family):
    src = full_source("half", FAMILIES[family])
    pragma, rest = src.split("\n", 1)
    assert pragma == "#pragma OPENCL EXTENSION cl_khr_fp16 : enable"
    assert "typedef half T;" in rest and "typedef half8 T8;" in rest
    assert _errors(pragma + "\n" + _stub() + rest) == []
    without = _errors(_stub() + rest)
    assert any("cl_khr_fp16" in e or "half" in e for e in without), without
