"""Operators of the ``anychip`` domain the CPU's fusion passes create
(``backends/cpu/passes``), registered through the CPU plugin's ``anychip_register_ops``:

* ``FusedElementwise``: a chain of element-wise ops as one kernel; ``expr`` is the expression
  in ``anychip.codegen.expr``'s text form over inputs ``in0, in1, ...`` (numpy broadcasting);
  the output has the inputs' float type and their broadcast shape.
"""

from __future__ import annotations

from onnx.defs import OpSchema

from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["anychip_schemas"]

_T = [("T", ["tensor(float)", "tensor(double)"], "float tensors")]


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


def anychip_schemas() -> list[OpSchema]:
    """The schemas the CPU plugin adds."""
    return [_fused_elementwise()]
