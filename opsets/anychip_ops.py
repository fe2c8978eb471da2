"""Operators of the ``anychip`` domain the fusion passes create (the CPU's own,
``backends/cpu/passes``, and the shared patterns of ``ir/passes/patterns``), registered through
the CPU plugin's ``anychip_register_ops``:

* ``FusedElementwise``: a chain of element-wise ops as one kernel; ``expr`` is the expression
  in ``anychip.codegen.expr``'s text form over inputs ``in0, in1, ...`` (numpy broadcasting);
  the output has the inputs' float type and their broadcast shape.
* ``FusedAttention``: ``softmax(Q @ Kt / scale [+ mask]) @ V`` over the last axis (``divide=0``:
  ``* scale``); ``Kt`` is K already transposed, as the MatMul it replaces read it.
* ``HeadsAttention``: ``FusedAttention`` with its heads' layout changes taken in: ``Q``, ``K``
  and ``V`` are reshaped by ``shape_q``, ``shape_k`` and ``shape_v`` (ONNX Reshape, each
  ``allowzero`` in ``allowzero[0:3]``) to rank 4 ``[B, S, heads, D]`` and permuted ``[0, 2, 1,
  3]`` (``K``: ``[0, 2, 3, 1]``), and the result is permuted ``[0, 2, 1, 3]`` and reshaped by
  ``shape_out`` (``allowzero[3]``): the exporters' multi-head split and merge. With ``parts``
  ``[count, q, k, v]`` the three inputs are one packed projection, cut on its last axis as a
  Split by ``split`` (none: equal parts) cuts it, Q, K and V its parts ``q``, ``k``, ``v``.
* ``ShapeMemo``: the graph ``body`` that reads only the shapes of its inputs; its outputs are
  kept per input signature.
* ``MatMulAdd``: ``Y = A @ B + C`` for an activation ``A`` of rank 3 or more, a constant 2-D
  ``B`` and a constant ``C`` of ``B``'s width along the last axis (a transformer's linear
  layer before its heads are split).
* ``QLinearMatMulAdd``: a quantized linear layer: the 8-bit result of a quantized product
  (``qdq=0``: ``QLinearMatMul``'s eight inputs; ``qdq=1``: ``DequantMatMul``'s four, then
  ``QuantizeLinear``'s scale and zero point), dequantized by the next two inputs, plus a bias
  (``qdq=0``: ``QLinearAdd``'s 8-bit bias with its scale and zero point; ``qdq=1``: a float
  constant), quantized by the last two: ``QLinearMatMul`` + ``QLinearAdd``, or QDQ's
  ``MatMul``, ``QuantizeLinear``, ``DequantizeLinear``, ``Add``, ``QuantizeLinear``.
* ``DynamicQuantMatMul``: ``DynamicQuantizeLinear(X)``'s codes times constant 8-bit ``B``
  (``MatMulInteger`` with both zero points), cast to float32, times ``f32(x_scale *
  B_scale)``, plus an optional float32 bias ``C``: onnxruntime's ``quantize_dynamic`` layer;
  ``X`` already quantized where ``X_scale`` and ``X_zero_point`` are given.
* ``ColumnProducts``: ``Y[:, j]`` is the product of the columns of a 2-D ``X`` that
  ``columns`` lists for output ``j`` (``lengths[j]`` of them, in order; none: 1), as
  ``ReduceProd(ArrayFeatureExtractor(X, cols), axes=[1])`` gives (skl2onnx's
  PolynomialFeatures).
* ``TreeEnsembleStack``: ``Concat([Reshape(S_i, shape) ...], axis)`` where ``S_i`` are the
  scores of the tree ensembles of the graph ``body`` (its outputs, in order) run on ``X``
  (skl2onnx's Bagging estimators).
* ``TreeEnsembleGroup``: the outputs of the graph ``body``'s tree ensembles run on ``X``
  (skl2onnx's AdaBoost estimators).
"""

from __future__ import annotations

from onnx import helper
from onnx.defs import OpSchema

from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["anychip_schemas"]

_T = [("T", ["tensor(float)", "tensor(double)"], "float tensors")]
_ANY = [
    f"tensor({t})"
    for t in "float double float16 bfloat16 int8 int16 int32 int64 uint8 uint16 uint32 uint64 "
    "bool string".split()
]


def _fused_elementwise() -> OpSchema:
    return OpSchema(
        "FusedElementwise",
        ANYCHIP_DOMAIN,
        1,
        "A fused chain of element-wise ops (anychip.codegen): Y = expr(X...).",
        inputs=[
            OpSchema.FormalParameter(
                "X",
                "T",
                "inputs in0, in1, ...",
                param_option=OpSchema.FormalParameterOption.Variadic,
            )
        ],
        outputs=[OpSchema.FormalParameter("Y", "T", "the broadcast result")],
        type_constraints=_T,
        attributes=[OpSchema.Attribute("expr", OpSchema.AttrType.STRING, "the expression")],
    )


def _fused_attention() -> OpSchema:
    opt = OpSchema.FormalParameterOption.Optional
    return OpSchema(
        "FusedAttention",
        ANYCHIP_DOMAIN,
        1,
        "Scaled dot-product attention: softmax(Q @ Kt / scale + mask) @ V (last axis).",
        inputs=[
            OpSchema.FormalParameter("Q", "T", "queries [..., S, D]"),
            OpSchema.FormalParameter("Kt", "T", "keys, transposed [..., D, S_kv]"),
            OpSchema.FormalParameter("V", "T", "values [..., S_kv, D_v]"),
            OpSchema.FormalParameter("mask", "T", "added to the scores", param_option=opt),
        ],
        outputs=[OpSchema.FormalParameter("Y", "T", "[..., S, D_v]")],
        type_constraints=_T,
        attributes=[
            OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, "the scores' divisor"),
            OpSchema.Attribute(
                "divide", helper.make_attribute("divide", 1), "0: multiply by scale instead"
            ),
        ],
    )


def _heads_attention() -> OpSchema:
    opt = OpSchema.FormalParameterOption.Optional
    i64 = [("I", ["tensor(int64)"], "shapes")]
    shapes = [
        OpSchema.FormalParameter(name, "I", f"Reshape target of {what}")
        for name, what in (
            ("shape_q", "Q"),
            ("shape_k", "K"),
            ("shape_v", "V"),
            ("shape_out", "the merged heads"),
        )
    ]
    return OpSchema(
        "HeadsAttention",
        ANYCHIP_DOMAIN,
        1,
        "Multi-head attention with the heads' split and merge taken in: "
        "Reshape(Transpose(FusedAttention(Transpose(Reshape(Q)), ...)), shape_out).",
        inputs=[
            OpSchema.FormalParameter("Q", "T", "queries, heads not split"),
            OpSchema.FormalParameter("K", "T", "keys, heads not split"),
            OpSchema.FormalParameter("V", "T", "values, heads not split"),
        ]
        + shapes
        + [OpSchema.FormalParameter("mask", "T", "added to the scores", param_option=opt)],
        outputs=[OpSchema.FormalParameter("Y", "T", "the heads merged, reshaped by shape_out")],
        type_constraints=_T + i64,
        attributes=[
            OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, "the scores' divisor"),
            OpSchema.Attribute(
                "divide", helper.make_attribute("divide", 1), "0: multiply by scale instead"
            ),
            OpSchema.Attribute(
                "allowzero",
                helper.make_attribute("allowzero", [0, 0, 0, 0]),
                "each Reshape's allowzero: Q, K, V, the output",
            ),
            OpSchema.Attribute(
                "split",
                helper.make_attribute("split", [], attr_type=OpSchema.AttrType.INTS),
                "with parts: the sizes a Split cuts the packed last axis into (none: equal)",
            ),
            OpSchema.Attribute(
                "parts",
                helper.make_attribute("parts", [], attr_type=OpSchema.AttrType.INTS),
                "[count, q, k, v]: Q, K and V are parts q, k and v of count cut from Q's "
                "last axis (the three inputs are one packed tensor); none: whole inputs",
            ),
        ],
    )


def _shape_memo() -> OpSchema:
    var = OpSchema.FormalParameterOption.Variadic
    return OpSchema(
        "ShapeMemo",
        ANYCHIP_DOMAIN,
        1,
        "Outputs of `body` (which reads only its inputs' shapes), kept per input signature.",
        inputs=[
            OpSchema.FormalParameter("X", "T", "inputs", param_option=var, is_homogeneous=False)
        ],
        outputs=[
            OpSchema.FormalParameter("Y", "U", "outputs", param_option=var, is_homogeneous=False)
        ],
        type_constraints=[
            ("T", _ANY, "any tensor"),
            ("U", _ANY, "any tensor"),
        ],
        attributes=[OpSchema.Attribute("body", OpSchema.AttrType.GRAPH, "the shape subgraph")],
    )


def _column_products() -> OpSchema:
    ints = OpSchema.AttrType.INTS
    return OpSchema(
        "ColumnProducts",
        ANYCHIP_DOMAIN,
        1,
        "Y[:, j] = product of X[:, c] over the columns c listed for output j.",
        inputs=[OpSchema.FormalParameter("X", "N", "[rows, features]")],
        outputs=[OpSchema.FormalParameter("Y", "N", "[rows, len(lengths)]")],
        type_constraints=[
            (
                "N",
                ["tensor(float)", "tensor(double)", "tensor(int64)", "tensor(int32)"],
                "numeric tensors",
            )
        ],
        attributes=[
            OpSchema.Attribute("columns", ints, "the column lists, end to end"),
            OpSchema.Attribute("lengths", ints, "how many columns each output multiplies"),
        ],
    )


def _tree_ensemble_stack() -> OpSchema:
    return OpSchema(
        "TreeEnsembleStack",
        ANYCHIP_DOMAIN,
        1,
        "Concat([Reshape(S_i, shape) for the body's scores S_i of X], axis).",
        inputs=[OpSchema.FormalParameter("X", "T", "[rows, features]")],
        outputs=[OpSchema.FormalParameter("Y", "T", "the scores stacked")],
        type_constraints=_T,
        attributes=[
            OpSchema.Attribute("body", OpSchema.AttrType.GRAPH, "the tree ensembles"),
            OpSchema.Attribute("shape", OpSchema.AttrType.INTS, "each score's Reshape target"),
            OpSchema.Attribute("axis", OpSchema.AttrType.INT, "the Concat axis"),
        ],
    )


def _tree_ensemble_group() -> OpSchema:
    var = OpSchema.FormalParameterOption.Variadic
    return OpSchema(
        "TreeEnsembleGroup",
        ANYCHIP_DOMAIN,
        1,
        "The outputs of the body's tree ensembles, all run on X.",
        inputs=[OpSchema.FormalParameter("X", "T", "[rows, features]")],
        outputs=[
            OpSchema.FormalParameter("Y", "U", "outputs", param_option=var, is_homogeneous=False)
        ],
        type_constraints=_T
        + [
            (
                "U",
                ["tensor(float)", "tensor(double)", "tensor(int64)", "tensor(string)"],
                "scores and labels",
            )
        ],
        attributes=[OpSchema.Attribute("body", OpSchema.AttrType.GRAPH, "the tree ensembles")],
    )


def _matmul_add() -> OpSchema:
    return OpSchema(
        "MatMulAdd",
        ANYCHIP_DOMAIN,
        1,
        "Y = A @ B + C (MatMul, then Add broadcasting C along the last axis).",
        inputs=[
            OpSchema.FormalParameter("A", "T", "activations [..., K]"),
            OpSchema.FormalParameter("B", "T", "weights [K, N]"),
            OpSchema.FormalParameter("C", "T", "bias of N elements, along the last axis"),
        ],
        outputs=[OpSchema.FormalParameter("Y", "T", "[..., N]")],
        type_constraints=_T,
    )


def _dequant_matmul() -> OpSchema:
    opt = OpSchema.FormalParameterOption.Optional
    return OpSchema(
        "DequantMatMul",
        ANYCHIP_DOMAIN,
        1,
        "Y = DequantizeLinear(A, A_scale, A_zero_point) @ B (+ C), B a constant that "
        "DequantizeLinear made from 8-bit weights (their integers kept in B's metadata): "
        "the product runs in integers, scaled once (the CPU's fusion of QDQ MatMul/Gemm).",
        inputs=[
            OpSchema.FormalParameter("A", "Q", "8-bit activations [..., K]"),
            OpSchema.FormalParameter("A_scale", "tensor(float)", "A's scale (one value)"),
            OpSchema.FormalParameter("A_zero_point", "Q", "A's zero point (one value)"),
            OpSchema.FormalParameter("B", "tensor(float)", "the dequantized weights"),
            OpSchema.FormalParameter(
                "C", "tensor(float)", "bias along the last axis", param_option=opt
            ),
        ],
        outputs=[OpSchema.FormalParameter("Y", "tensor(float)", "[..., N]")],
        type_constraints=[("Q", ["tensor(uint8)", "tensor(int8)"], "8-bit integers")],
        attributes=[
            OpSchema.Attribute("transB", helper.make_attribute("transB", 0), "B is [N, K]"),
        ],
    )


def _qlinear_matmul_add() -> OpSchema:
    return OpSchema(
        "QLinearMatMulAdd",
        ANYCHIP_DOMAIN,
        1,
        "A quantized linear layer (QLinearMatMul + QLinearAdd, or QDQ's MatMul, Q, DQ, Add, "
        "Q), its requantizations in one kernel; the module docstring lists the inputs.",
        inputs=[
            OpSchema.FormalParameter(
                "X",
                "T",
                "the inputs of the ops it replaces, in order",
                param_option=OpSchema.FormalParameterOption.Variadic,
                is_homogeneous=False,
            )
        ],  # fmt: skip
        outputs=[OpSchema.FormalParameter("Y", "Q", "8-bit [..., N]")],
        type_constraints=[
            ("T", ["tensor(float)", "tensor(uint8)", "tensor(int8)"], "8-bit or float"),
            ("Q", ["tensor(uint8)", "tensor(int8)"], "8-bit integers"),
        ],
        attributes=[
            OpSchema.Attribute("qdq", helper.make_attribute("qdq", 0), "the form"),
            OpSchema.Attribute("transB", helper.make_attribute("transB", 0), "B is [N, K]"),
        ],
    )


def _dynamic_quant_matmul() -> OpSchema:
    opt = OpSchema.FormalParameterOption.Optional
    return OpSchema(
        "DynamicQuantMatMul",
        ANYCHIP_DOMAIN,
        1,
        "Y = f32(MatMulInteger(DynamicQuantizeLinear(X), B)) * (x_scale * B_scale) (+ C).",
        inputs=[
            OpSchema.FormalParameter("X", "T", "float32 activations [..., K], or their codes"),
            OpSchema.FormalParameter("B", "Q", "8-bit weights [K, N]"),
            OpSchema.FormalParameter("B_zero_point", "Q", "one or [N]", param_option=opt),
            OpSchema.FormalParameter("B_scale", "tensor(float)", "one or [N]"),
            OpSchema.FormalParameter("C", "tensor(float)", "bias [N]", param_option=opt),
            OpSchema.FormalParameter(
                "X_scale", "tensor(float)", "X's scale (X quantized)", param_option=opt
            ),
            OpSchema.FormalParameter(
                "X_zero_point", "tensor(uint8)", "X's zero point (X quantized)", param_option=opt
            ),
        ],
        outputs=[OpSchema.FormalParameter("Y", "tensor(float)", "[..., N]")],
        type_constraints=[
            ("Q", ["tensor(uint8)", "tensor(int8)"], "8-bit integers"),
            ("T", ["tensor(float)", "tensor(uint8)"], "float32, or DynamicQuantizeLinear's codes"),
        ],
    )


def _transpose_view() -> OpSchema:
    return OpSchema(
        "TransposeView",
        ANYCHIP_DOMAIN,
        1,
        "Transpose as a view of the input (no copy), for readers that take strided input.",
        inputs=[OpSchema.FormalParameter("data", "T", "any tensor")],
        outputs=[OpSchema.FormalParameter("transposed", "T", "data with axes permuted")],
        type_constraints=_T,
        attributes=[OpSchema.Attribute("perm", OpSchema.AttrType.INTS, "the permutation")],
    )


def _channel_shuffle() -> OpSchema:
    return OpSchema(
        "ChannelShuffle",
        ANYCHIP_DOMAIN,
        1,
        "ShuffleNet's channel shuffle: Y[:, j] = X[:, (j % group) * (C / group) + j // group] "
        "(Reshape to [N, group, C / group, ...], Transpose of axes 1 and 2, Reshape back).",
        inputs=[OpSchema.FormalParameter("X", "T", "[N, C, ...], C a multiple of group")],
        outputs=[OpSchema.FormalParameter("Y", "T", "X's shape")],
        type_constraints=_T,
        attributes=[OpSchema.Attribute("group", OpSchema.AttrType.INT, "the groups mixed")],
    )


def anychip_schemas() -> list[OpSchema]:
    """The schemas the CPU plugin adds."""
    return [
        _fused_elementwise(),
        _fused_attention(),
        _heads_attention(),
        _shape_memo(),
        _column_products(),
        _tree_ensemble_stack(),
        _tree_ensemble_group(),
        _matmul_add(),
        _dequant_matmul(),
        _qlinear_matmul_add(),
        _dynamic_quant_matmul(),
        _transpose_view(),
        _channel_shuffle(),
    ]
