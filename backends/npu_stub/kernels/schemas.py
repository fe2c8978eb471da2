"""The NPU's own operators (domain ``anychip``), created by its passes and registered through
``anychip_register_ops``:

* ``NpuConv``: a 2-D convolution with explicit pads, an optional fused activation (``Relu`` or
  ``Clip`` with ``activation_params = [min, max]``) and a data ``layout`` (``NCHW`` or
  ``NHWC``; weights stay ``[M, C/group, KH, KW]`` either way).
* ``NpuPool``: 2-D pooling (``mode`` ``max``, ``average`` or ``global_average``) in a given
  ``layout``.
"""

from __future__ import annotations

from onnx import helper
from onnx.defs import OpSchema

from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["npu_schemas"]

_A = OpSchema.AttrType
_T = [("T", ["tensor(float)"], "float32 tensors")]


def _attr(name: str, value: object, doc: str) -> OpSchema.Attribute:
    return OpSchema.Attribute(name, helper.make_attribute(name, value), doc)


def _conv() -> OpSchema:
    return OpSchema(
        "NpuConv",
        ANYCHIP_DOMAIN,
        1,
        "2-D convolution with a fused activation, in NCHW or NHWC layout (NPU passes).",
        inputs=[
            OpSchema.FormalParameter("X", "T", "input, layout given by `layout`"),
            OpSchema.FormalParameter("W", "T", "weights [M, C/group, KH, KW]"),
            OpSchema.FormalParameter(
                "B", "T", "bias [M]", param_option=OpSchema.FormalParameterOption.Optional
            ),
        ],
        outputs=[OpSchema.FormalParameter("Y", "T", "output, same layout as X")],
        type_constraints=_T,
        attributes=[
            OpSchema.Attribute("kernel_shape", _A.INTS, "[KH, KW]"),
            OpSchema.Attribute("pads", _A.INTS, "[top, left, bottom, right]"),
            _attr("strides", [1, 1], "[SH, SW]"),
            _attr("dilations", [1, 1], "[DH, DW]"),
            _attr("group", 1, "number of groups"),
            _attr("activation", "", "'' (none), 'Relu' or 'Clip'"),
            OpSchema.Attribute("activation_params", _A.FLOATS, "Clip's [min, max]", required=False),
            _attr("layout", "NCHW", "'NCHW' or 'NHWC'"),
        ],
    )


def _pool() -> OpSchema:
    return OpSchema(
        "NpuPool",
        ANYCHIP_DOMAIN,
        1,
        "2-D max, average or global average pooling in NCHW or NHWC layout (NPU passes).",
        inputs=[OpSchema.FormalParameter("X", "T", "input, layout given by `layout`")],
        outputs=[OpSchema.FormalParameter("Y", "T", "output, same layout as X")],
        type_constraints=_T,
        attributes=[
            OpSchema.Attribute("mode", _A.STRING, "'max', 'average' or 'global_average'"),
            OpSchema.Attribute("kernel_shape", _A.INTS, "[KH, KW]", required=False),
            OpSchema.Attribute("pads", _A.INTS, "[top, left, bottom, right]", required=False),
            OpSchema.Attribute("strides", _A.INTS, "[SH, SW]", required=False),
            OpSchema.Attribute("dilations", _A.INTS, "[DH, DW]", required=False),
            _attr("ceil_mode", 0, "1: output size rounds up"),
            _attr("count_include_pad", 0, "1: average counts padding"),
            _attr("layout", "NCHW", "'NCHW' or 'NHWC'"),
        ],
    )


def npu_schemas() -> list[OpSchema]:
    """The schemas ``anychip_register_ops`` adds."""
    return [_conv(), _pool()]
