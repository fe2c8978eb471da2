"""Where onnxruntime's CPU kernels differ from ONNX's reference: declared, with the reason.

Found by the conformance kit (``anychip conformance --device ort:cpu``: onnx's node cases,
onnxruntime 1.32 on x86-64); each entry is one case family the CPU provider gets wrong or
refuses at run time, while anychip's CPU passes it. A conditional one is a declared constraint
on the op's claims (placement gives such nodes to another device, naming the reason; the kit
counts them refused as declared); a whole op is left unclaimed (``UNCLAIMED``), refused with
its reason. They apply to ``CPUExecutionProvider``: other providers are judged by their own
runs. See docs/perf/ort.md for the counts.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from anychip.core.plugin.claims import Constraint
from anychip.ir.dtypes import DType

if TYPE_CHECKING:
    from anychip.ir.node import Node
    from anychip.ir.value import Value

__all__ = ["UNCLAIMED", "constraints"]

CPU = "CPUExecutionProvider"

#: (domain, op) -> why the CPU provider does not claim it at all.
UNCLAIMED = {
    ("", "DFT"): "onnxruntime's DFT leaves float32 rounding (1e-4) where ONNX's reference has 0",
    ("", "STFT"): "onnxruntime's STFT leaves float32 rounding (1e-5) where ONNX's reference has 0",
}
#: Sequence and optional ops: their values are no tensors, which partitions do not carry.
_NOT_TENSOR_OPS = ("Sequence", "Optional", "SplitToSequence", "ConcatFromSequence")


def not_tensor_op(op: str) -> bool:
    """Whether ``op`` works on sequences or optionals (left to anychip's CPU)."""
    return op.startswith(_NOT_TENSOR_OPS)


def _present(node: Node, i: int) -> Value | None:
    return node.inputs[i] if i < len(node.inputs) else None


def _const(v: Value | None) -> object:
    return None if v is None else v.const


def _inference_mode(node: Node) -> bool:
    training = _present(node, 2)
    if training is None:
        return True
    value = _const(training)
    return value is not None and not bool(value)


def _upsampling_or_plain(node: Node) -> bool:
    if node.attr("coordinate_transformation_mode", "half_pixel") not in ("align_corners",):
        return True
    if node.attr("mode", "nearest") == "nearest":
        return True
    scales, sizes, x = _const(_present(node, 2)), _const(_present(node, 3)), node.inputs[0]
    if scales is not None and len(scales):
        return bool((scales >= 1).all())
    if sizes is not None and x.shape is not None and all(isinstance(d, int) for d in x.shape):
        axes = node.attr("axes")
        dims = [x.shape[a] for a in axes] if axes else list(x.shape)
        return len(dims) == len(sizes) and all(s >= d for s, d in zip(sizes, dims))
    return False


def _one_weight_zero_point(node: Node) -> bool:
    zp = _present(node, 3)
    if zp is None:
        return True
    shape = zp.shape
    return shape is not None and all(isinstance(d, int) for d in shape) and math.prod(shape) == 1


def _not_empty_bool(node: Node) -> bool:
    x = node.inputs[0]
    if x is None or x.dtype != DType.BOOL:
        return True
    return x.shape is not None and all(isinstance(d, int) and d > 0 for d in x.shape)


def _no_causal_scores(node: Node) -> bool:
    scores = node.outputs[3] if len(node.outputs) > 3 else None
    return not (node.attr("is_causal", 0) and scores is not None)


def _no_padded_kv_with_mask(node: Node) -> bool:
    return _present(node, 6) is None or _present(node, 3) is None


def _not_causal_fp16(node: Node) -> bool:
    q = node.inputs[0]
    return not (node.attr("is_causal", 0) and q is not None and q.dtype == DType.FLOAT16)


_SUB_BYTE_INTS = {DType.INT4, DType.UINT4, DType.INT2, DType.UINT2}


def _not_to_sub_byte_int(node: Node) -> bool:
    y = node.outputs[0] if node.outputs else None
    return y is None or y.dtype not in _SUB_BYTE_INTS


_SATURATE = Constraint(
    "not to a 4- or 2-bit integer (onnxruntime wraps what ONNX saturates)", _not_to_sub_byte_int
)


@functools.cache
def _locale_works(locale: str) -> bool:
    """Whether onnxruntime can make a StringNormalizer of ``locale`` (it needs the C++ locale
    installed on this machine)."""
    import onnxruntime
    from onnx import TensorProto, helper

    node = helper.make_node(
        "StringNormalizer", ["x"], ["y"], locale=locale, case_change_action="LOWER"
    )
    graph = helper.make_graph(
        [node],
        "locale",
        [helper.make_tensor_value_info("x", TensorProto.STRING, [1])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    model.ir_version = 8
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4  # a missing locale is the answer, not an error to print
    try:
        onnxruntime.InferenceSession(model.SerializeToString(), options, providers=[CPU])
    except Exception:  # the reason is the constraint's own: the locale is missing
        return False
    return True


def _locale_installed(node: Node) -> bool:
    return _locale_works(str(node.attr("locale", "en_US.UTF-8") or "en_US.UTF-8"))


_RNN = Constraint.attribute(
    "layout", lambda v, _: not v, "layout 0 only (onnxruntime's CPU RNNs refuse layout=1)"
)
_CPU: dict[tuple[str, str], tuple[Constraint, ...]] = {
    ("", "RNN"): (_RNN,),
    ("", "GRU"): (_RNN,),
    ("", "LSTM"): (_RNN,),
    ("", "Dropout"): (
        Constraint(
            "inference mode only (onnxruntime's random masks are not the reference's)",
            _inference_mode,
        ),
    ),
    ("", "Resize"): (
        Constraint(
            "align_corners with linear or cubic only when upsampling is known (onnxruntime's "
            "downsampling differs from ONNX's reference)",
            _upsampling_or_plain,
        ),
    ),
    ("", "MaxUnpool"): (
        Constraint(
            "no output_shape input (onnxruntime places the values elsewhere)",
            lambda n: _present(n, 2) is None,
        ),
    ),
    ("", "ConvInteger"): (
        Constraint("one weight zero point (per-tensor quantization)", _one_weight_zero_point),
    ),
    ("", "ReduceMax"): (Constraint("bool over a non-empty set of known shape", _not_empty_bool),),
    ("", "ReduceMin"): (Constraint("bool over a non-empty set of known shape", _not_empty_bool),),
    ("", "Attention"): (
        Constraint("qk_matmul_output not read with is_causal", _no_causal_scores),
        Constraint("nonpad_kv_seqlen not together with attn_mask", _no_padded_kv_with_mask),
        Constraint(
            "float16 causal attention (onnxruntime rounds it beyond ONNX's tolerance)",
            _not_causal_fp16,
        ),
    ),
    ("", "Cast"): (_SATURATE,),
    ("", "CastLike"): (_SATURATE,),
    ("", "StringNormalizer"): (
        Constraint("the locale it names is installed for onnxruntime", _locale_installed),
    ),
}


def constraints(ep: str, domain: str, op: str) -> tuple[Constraint, ...]:
    """The declared deviations of provider ``ep`` for ``domain::op`` (none for most)."""
    if ep != CPU:
        return ()
    return _CPU.get((domain, op), ())
