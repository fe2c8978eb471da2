"""The conditions under which OpenVINO computes an op right, as declared constraints.

Each constraint was found by the conformance kit on ``openvino:cpu`` (OpenVINO 2026.4): a case
OpenVINO refused or computed wrong, and the attribute or input that makes the difference (the
case is named beside each). Placement gives a node that does not meet one to the next device
with the reason; the kit counts such a case as refused-as-declared.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.core.plugin.claims import Constraint
from anychip.ir.dtypes import DType

if TYPE_CHECKING:
    from anychip.ir.node import Node

__all__ = ["ALL", "BY_OP", "read"]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def _present(node: Node, index: int) -> bool:
    return len(node.inputs) > index and node.inputs[index] is not None


def _tensors_only(node: Node) -> bool:
    """Tensors of known element type, where read (an unused output may stay untyped:
    inception_v1's Dropout-9 mask)."""
    ins = [v for v in node.inputs if v is not None]
    outs = [v for v in node.outputs if v is not None]
    return all(v.is_tensor and v.dtype for v in ins) and all(
        v.is_tensor and (v.dtype or not read(v)) for v in outs
    )


def read(value: Any) -> bool:
    """Whether a node's output is read by another node or is an output of its graph."""
    graph = value.producer.graph if value.producer is not None else None
    return bool(value.uses) or (graph is not None and value in graph.outputs)


def _not_window(node: Node) -> bool:
    # test_attention_local_window*, test_attention_bidirectional_window: OpenVINO ignores them
    left, right = node.attr("left_window_size", -1), node.attr("right_window_size", -1)
    return (left is None or left < 0) and (right is None or right < 0)


def _causal_without_cache(node: Node) -> bool:
    # test_attention_4d_with_past_and_present_qk_matmul_bias_*_mask_causal: with a KV cache
    # OpenVINO aligns the causal mask to the cache's start, ONNX to its end
    return not node.attr("is_causal", 0) or not _present(node, 4)


def _unsigned(node: Node) -> bool:
    # test_bitshift_*_int8/int32_*: signed shifts (ONNX 27) differ at negatives and widths
    x = node.inputs[0]
    return x is not None and x.dtype in (DType.UINT8, DType.UINT16, DType.UINT32, DType.UINT64)


def _constant_training_mode(node: Node) -> bool:
    # test_training_dropout*: "Non-constant training_mode input is not supported"
    return not _present(node, 2) or node.inputs[2].const is not None


def _rank4(node: Node) -> bool:
    # test_gridsample_volumetric_*: "GridSample is only supported for 4D"
    x = node.inputs[0]
    return x is not None and x.shape is not None and len(x.shape) == 4


def _fmod_for_floats(node: Node) -> bool:
    # test_mod_float32_mixed_sign_fmod_0 (ONNX 28): fmod=0 on floats does not convert
    x = node.inputs[0]
    return bool(node.attr("fmod", 0)) or x is None or not x.dtype.is_float


def _ceil_without_dropped_window(node: Node) -> bool:
    """test_maxpool_2d_ceil_output_size_reduce_by_one: ONNX drops a last window that would
    start in the end padding, OpenVINO keeps it. Where shapes are static and no window is
    dropped, ceil mode agrees."""
    if not node.attr("ceil_mode", 0):
        return True
    x = node.inputs[0]
    kernel = node.attr("kernel_shape")
    if (
        x is None
        or x.shape is None
        or kernel is None
        or node.attr("auto_pad", "NOTSET")
        not in (
            "NOTSET",
            b"NOTSET",
        )
    ):
        return False
    spatial = x.shape[2:]
    if not all(isinstance(d, int) for d in spatial):
        return False
    n = len(kernel)
    strides = node.attr("strides") or [1] * n
    dilations = node.attr("dilations") or [1] * n
    pads = node.attr("pads") or [0] * (2 * n)
    for i, size in enumerate(spatial):
        span = dilations[i] * (kernel[i] - 1) + 1
        out = math.ceil((size + pads[i] + pads[i + n] - span) / strides[i]) + 1
        if (out - 1) * strides[i] >= size + pads[i]:
            return False
    return True


def _even_zero_point(slot: int) -> Any:
    """OpenVINO adds the zero point before it rounds ties to even, ONNX after: the two agree
    where the zero point is even (test_quantizelinear_uint16's 32767; an int8 zero point of 3
    turns 0.5 into 4 where ONNX gives 3). Holds for an absent or constant, even zero point."""

    def holds(node: Node) -> bool:
        if not _present(node, slot):
            return True
        zp = node.inputs[slot].const
        return zp is not None and bool((np.asarray(zp).astype(np.int64) % 2 == 0).all())

    return holds


def _blocked_with_zero_point(node: Node) -> bool:
    # test_quantizelinear_blocked_symmetric: blocks without a zero point do not convert
    return not node.attr("block_size", 0) or _present(node, 2)


def _resize_supported(node: Node) -> bool:
    """test_resize_*_antialias, *_exclude_outside, *_half_pixel_symmetric and
    test_resize_downsample_scales_*_align_corners differ or do not convert; align_corners
    agrees where constant scales or sizes do not shrink."""
    if node.attr("antialias", 0) or node.attr("exclude_outside", 0):
        return False
    mode = _text(node.attr("coordinate_transformation_mode", "half_pixel"))
    if mode == "half_pixel_symmetric":
        return False
    if mode != "align_corners":
        return True
    scales = node.inputs[2] if _present(node, 2) else None
    sizes = node.inputs[3] if _present(node, 3) else None
    if scales is not None and scales.const is not None and scales.const.size:
        return bool((scales.const >= 1).all())
    x = node.inputs[0]
    if sizes is not None and sizes.const is not None and x is not None and x.shape is not None:
        dims = x.shape[-len(sizes.const) :]
        return all(isinstance(d, int) and s >= d for s, d in zip(sizes.const.tolist(), dims))
    return False


def _layout0(node: Node) -> bool:
    # test_lstm_batchwise, test_gru_batchwise, test_simple_rnn_batchwise
    return not node.attr("layout", 0)


def _no_peepholes(node: Node) -> bool:
    # test_lstm_with_peepholes
    return not _present(node, 7)


def _dcr(node: Node) -> bool:
    # test_spacetodepth_crd_mode_example (ONNX 28's mode attribute)
    return _text(node.attr("mode", "DCR")).upper() == "DCR"


#: Every claim carries these.
def _unique(node: Node) -> bool:
    # test_unique_not_sorted_without_axis in its 1-output form (the kit's derived variant):
    # OpenVINO 2026.4 gave [2, 0, 0, 0] for [2, 1, 3, 4]; the 4-output form is right
    outs = [v for v in node.outputs if v is not None]
    return bool(node.attr("sorted", 1)) or len(outs) == 4


def _softmax_axis_last(node: Node) -> bool:
    # issue 47, tests/reliability (opset_models "softmax_11"): before opset 13 Softmax
    # normalizes over the flattened dimensions from the axis on; OpenVINO 2026.4 got a
    # Softmax-11 on axis 1 of a 4-D input wrong (0.89 off), right on the last axis
    since = int(node.meta.get("since") or node.version or 13)
    x = node.inputs[0] if node.inputs else None
    if since >= 13 or x is None or x.shape is None:
        return since >= 13
    axis = int(node.attr("axis", 1))
    return axis in (-1, len(x.shape) - 1)


ALL = (Constraint("tensors only (no sequences, optionals or maps)", _tensors_only),)
_POOL = Constraint(
    "ceil_mode only where no last window starts in the padding (static shapes)",
    _ceil_without_dropped_window,
)
_RNN = Constraint("layout 0 (sequence first) only", _layout0)
#: op -> its constraints.
BY_OP: dict[str, tuple[Constraint, ...]] = {
    "Attention": (
        Constraint("no sliding window (left/right_window_size)", _not_window),
        Constraint("is_causal only without a KV cache (past_key)", _causal_without_cache),
    ),
    "BitShift": (Constraint("unsigned integers only", _unsigned),),
    "Dropout": (Constraint("training_mode absent or constant", _constant_training_mode),),
    "GridSample": (Constraint("4-D input only", _rank4),),
    "Mod": (Constraint("fmod=1 for floating-point inputs", _fmod_for_floats),),
    "MaxPool": (_POOL,),
    "AveragePool": (_POOL,),
    "QuantizeLinear": (
        Constraint("zero point absent or constant and even", _even_zero_point(2)),
        Constraint("block_size only with a zero point", _blocked_with_zero_point),
    ),
    "QLinearConv": (Constraint("y_zero_point absent or constant and even", _even_zero_point(7)),),
    "QLinearMatMul": (Constraint("y_zero_point absent or constant and even", _even_zero_point(7)),),
    "Resize": (
        Constraint(
            "no antialias, exclude_outside or half_pixel_symmetric; align_corners only with "
            "constant scales or sizes that do not shrink",
            _resize_supported,
        ),
    ),
    "GRU": (_RNN,),
    "RNN": (_RNN,),
    "LSTM": (_RNN, Constraint("no peepholes (input P)", _no_peepholes)),
    "SpaceToDepth": (Constraint("mode DCR only", _dcr),),
    "Softmax": (Constraint("before opset 13, the last axis only", _softmax_axis_last),),
    "Unique": (
        Constraint("sorted=1, or all four outputs written (sorted=0 alone miscomputes)", _unique),
    ),
}
