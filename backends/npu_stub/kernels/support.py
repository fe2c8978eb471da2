"""What the NPU can run: its op set and the per-node constraints (``check_node``).

The NPU is a static-shape float32 machine (shape policy ``"static"``: the runtime compiles each
partition per concrete input signature, so symbolic dimensions are fine, an unknown rank is
not); every tensor it touches must be float32; inputs that only steer the compiler
(Reshape's shape, Clip's bounds) must be constants. Pools are 2-D; convolutions are 2-D or
1-D (the ``lower_conv1d`` pass makes the latter 2-D over a unit height). A node
that breaks a rule gets a one-line reason, shown in the placement report next to the device
that took the node instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anychip.backends.npu_stub.kernels.einsum_plan import plan_einsum
from anychip.ir.dtypes import DType
from anychip.opsets.schemas import ANYCHIP_DOMAIN

if TYPE_CHECKING:
    from anychip.ir.node import Node

__all__ = [
    "NPU_OPS",
    "NPU_CUSTOM_OPS",
    "INDEX_OPS",
    "COMPILE_TIME_INPUTS",
    "check_node",
    "opset_of",
]

#: ai.onnx operators the NPU compiles.
NPU_OPS = frozenset(
    {
        "Conv",
        "BatchNormalization",
        "Relu",
        "Clip",
        "Sigmoid",
        "HardSwish",
        "Add",
        "Mul",
        "Sum",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "MatMul",
        "Gemm",
        "Softmax",
        "Concat",
        "Reshape",
        "Flatten",
        "Transpose",
        "Sub",
        "Div",
        "Sqrt",
        "Tanh",
        "Erf",
        "Gelu",
        "LayerNormalization",
        "InstanceNormalization",
        *(
            "Shape Gather GatherElements Unsqueeze Squeeze Expand Cast Where Range And Or Not "
            "Equal Less Greater LessOrEqual GreaterOrEqual Max Min Slice Identity Neg "
            "ConstantOfShape GatherND CumSum Split Pow"
        ).split(),
        *"ReduceMean ReduceSum ReduceMax ReduceMin Pad Reciprocal".split(),
        *"Einsum ScatterND Resize".split(),
    }
)
#: Ops that also run on the NPU's index datapath (int64, int32, bool): the shape and mask
#: arithmetic of transformer exports. Under the static shape policy their shapes are concrete
#: when compiled (the runtime traces each signature), so e.g. Reshape reads its output shape,
#: not its shape input.
INDEX_OPS = frozenset(
    (
        "Shape Gather GatherElements Unsqueeze Squeeze Expand Cast Where Range And Or Not Equal "
        "Less Greater LessOrEqual GreaterOrEqual Max Min Slice Identity Neg ConstantOfShape "
        "Concat Reshape Flatten Transpose Add Sub Mul Div GatherND CumSum Split ScatterND"
    ).split()
)
_INDEX_DTYPES = frozenset({DType.INT64, DType.INT32, DType.BOOL})
#: Operators of the anychip domain that the NPU's own passes create.
NPU_CUSTOM_OPS = frozenset({"NpuConv", "NpuPool"})
#: Inputs read at compile time, by op: they must be constants and may be integers.
COMPILE_TIME_INPUTS = {
    "Clip": (1, 2),
    **{op: (1,) for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin")},
    "Pad": (1, 2, 3),
}

#: max and min are refused: onnxruntime's NaN handling there is its own (a NaN in the data
#: gives way to the update), not numpy's.
_SCATTER_REDUCTIONS = ("none", "add", "mul")
#: Inputs that steer the kernel and may have any dtype: Resize's roi, scales, sizes.
_STEERING = {("Resize", 1), ("Resize", 2), ("Resize", 3)}
_SPATIAL_2D = {"Conv", "NpuConv", "MaxPool", "AveragePool", "GlobalAveragePool", "NpuPool"}


def opset_of(node: Node) -> int:
    """The schema version in force for ``node`` (resolved by the session, else its opset)."""
    return int(node.meta.get("since") or node.version or 1)


def check_node(node: Node) -> str | None:
    """None when the NPU can compile ``node``, else the reason it cannot."""
    if node.domain == ANYCHIP_DOMAIN:
        if node.op_type not in NPU_CUSTOM_OPS:
            return f"op {node.qualified_op} not in the NPU op set"
    elif node.domain != "" or node.op_type not in NPU_OPS:
        return f"op {node.qualified_op} not in the NPU op set"
    fixed = COMPILE_TIME_INPUTS.get(node.op_type, ())
    for i, v in enumerate(node.inputs):
        if v is None:
            continue
        if (node.op_type, i) in _STEERING:
            continue  # Resize's roi, scales and sizes: any dtype (read as numbers, if at all)
        if i in fixed:
            if v.const is None:
                return f"{node.op_type} input {i} ({v.name}) must be a constant on the NPU"
            continue
        why = _check_tensor(v, f"input {i}", node.op_type)
        if why:
            return why
    for i, v in enumerate(node.outputs):
        if v is None:
            continue
        why = _check_tensor(v, f"output {i}", node.op_type)
        if why:
            return why
    return _check_attributes(node)


def _check_tensor(v, where: str, op: str) -> str | None:
    if not v.is_tensor:
        return f"{where} is not a tensor ({v.type_str()})"
    if v.shape is None:
        # Symbolic dimensions are fine: the NPU's shape policy is "static", so the runtime
        # compiles each partition per concrete input signature (core/compile/specialize.py).
        return f"unknown rank: {where} is {v.type_str()}"
    if v.dtype in _INDEX_DTYPES and op in INDEX_OPS:
        return None
    if v.dtype != DType.FLOAT:
        return f"dtype {v.dtype.name.lower()} not supported ({where}; the NPU computes float32)"
    return None


def _check_attributes(node: Node) -> str | None:
    op = node.op_type
    rank = len(node.inputs[0].shape) if node.inputs and node.inputs[0] is not None else 0
    if op in _SPATIAL_2D and rank != 4 and not (op == "Conv" and rank == 3):
        what = "1-D or 2-D" if op == "Conv" else "2-D"
        return f"only {what} {op} runs on the NPU; input 0 is {node.inputs[0].type_str()}"
    if op == "InstanceNormalization" and rank < 3:
        return f"InstanceNormalization needs rank >= 3, input 0 is {node.inputs[0].type_str()}"
    if node.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID", "SAME_UPPER"):
        return f"attribute auto_pad={node.attr('auto_pad')} not supported"
    if op == "MaxPool":
        if len([v for v in node.outputs if v is not None]) > 1:
            return "MaxPool's Indices output not supported"
    if op == "LayerNormalization":
        if len([v for v in node.outputs if v is not None]) > 1:
            return "LayerNormalization's Mean and InvStdDev outputs not supported"
        if node.attr("stash_type", 1) != 1:
            return "LayerNormalization with stash_type other than 1 (float32) not supported"
    if op in ("Add", "Sub", "Mul", "Neg") and node.outputs[0].dtype == DType.BOOL:
        return f"{op} over bool not supported"
    if op == "Einsum":
        plan = plan_einsum(str(node.attr("equation", "")), len(node.inputs))
        return plan if isinstance(plan, str) else None
    if op == "ScatterND" and node.attr("reduction", "none") not in _SCATTER_REDUCTIONS:
        return f"ScatterND reduction {node.attr('reduction')!r} not supported"
    if op == "Resize":
        return _check_resize(node)
    if op == "GatherND" and node.attr("batch_dims", 0):
        return "GatherND with batch_dims > 0 not supported"
    if op == "Pad" and node.attr("mode", "constant") not in ("constant", "reflect", "edge", "wrap"):
        return f"Pad mode {node.attr('mode')!r} not supported"
    if op == "Pad" and opset_of(node) < 11 and len(node.inputs) > 1:
        return "Pad with inputs before opset 11 not supported"
    if op == "BatchNormalization":
        if node.attr("training_mode", 0) or len([v for v in node.outputs if v is not None]) > 1:
            return "BatchNormalization in training mode not supported"
        if node.attr("spatial", 1) == 0:
            return "attribute spatial=0 of BatchNormalization not supported"
        if len(node.inputs[0].shape) < 2:
            return f"BatchNormalization needs rank >= 2, input 0 is {node.inputs[0].type_str()}"
    return None


def _check_resize(node: Node) -> str | None:
    from anychip.backends.npu_stub.kernels.op_resize import (
        RESIZE_COORDINATES,
        RESIZE_MODES,
        RESIZE_NEAREST,
    )

    if opset_of(node) < 11:
        return "Resize before opset 11 not supported"
    checks = (
        ("mode", "nearest", RESIZE_MODES),
        ("coordinate_transformation_mode", "half_pixel", RESIZE_COORDINATES),
        ("nearest_mode", "round_prefer_floor", RESIZE_NEAREST),
        ("keep_aspect_ratio_policy", "stretch", ("stretch",)),
    )
    for name, default, allowed in checks:
        value = node.attr(name, default)
        if value not in allowed:
            return f"Resize {name}={value!r} not supported (the NPU has {', '.join(allowed)})"
    if node.attr("antialias", 0):
        return "Resize with antialias=1 not supported"
    return None
