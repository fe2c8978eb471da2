"""The ``com.microsoft`` operators that onnxruntime's transformer optimizer and quantizer emit.

Schemas follow onnxruntime's documented contrib-op specs (``docs/ContribOperators.md``): the
same input order, optional inputs and attribute defaults, all at ``since_version`` 1 (the
only version of these ops). They are registered by the CPU plugin through
``anychip_register_ops`` like any plugin domain, so the importer accepts the domain and the
kernel call fills attribute defaults from them. Type constraints are loose (every tensor
type): the kernels check what they need. GreedySearch and Sampling run their decoder
subgraph in a loop (decision 048), BeamSearch runs it with onnxruntime's beam scorer (decision
056).
"""

from __future__ import annotations

from typing import Any

from onnx import helper
from onnx.defs import OpSchema

__all__ = ["MS_DOMAIN", "com_microsoft_schemas"]

MS_DOMAIN = "com.microsoft"

_A = OpSchema.AttrType
_OPT = OpSchema.FormalParameterOption.Optional
_VAR = OpSchema.FormalParameterOption.Variadic
_TYPES = [
    f"tensor({t})"
    for t in (
        "float",
        "float16",
        "bfloat16",
        "double",
        "int8",
        "uint8",
        "int16",
        "uint16",
        "int32",
        "int64",
        "int4",
        "uint4",
        "bool",
    )
]

# name: (inputs, outputs, attributes). An input or output ending in "?" is optional, in "*"
# variadic. An attribute is (name, default) or (name, AttrType) when it has no default.
_QPARAMS = ["X", "X_scale", "X_zero_point?", "Y_scale", "Y_zero_point?"]
_POOL_ATTRS = [
    ("auto_pad", "NOTSET"),
    ("ceil_mode", 0),
    ("channels_last", 0),
    ("count_include_pad", 0),
    ("kernel_shape", _A.INTS),
    ("pads", _A.INTS),
    ("strides", _A.INTS),
]
_LN_ATTRS = [("axis", -1), ("epsilon", 1e-5), ("stash_type", 1)]
_SPECS: dict[str, tuple[list[str], list[str], list[tuple[str, Any]]]] = {
    "Gelu": (["X"], ["Y"], []),
    "FastGelu": (["X", "bias?"], ["Y"], []),
    "BiasGelu": (["A", "B"], ["C"], []),
    "QuickGelu": (["X"], ["Y"], [("alpha", 1.702)]),
    "FusedMatMul": (
        ["A", "B"],
        ["Y"],
        [("alpha", 1.0), ("transA", 0), ("transB", 0), ("transBatchA", 0), ("transBatchB", 0)],
    ),
    "FusedGemm": (
        ["A", "B", "C?"],
        ["Y"],
        [
            ("alpha", 1.0),
            ("beta", 1.0),
            ("transA", 0),
            ("transB", 0),
            ("activation", _A.STRING),
            ("activation_alpha", _A.FLOAT),
            ("activation_beta", _A.FLOAT),
            ("activation_gamma", _A.FLOAT),
        ],
    ),
    "FusedConv": (
        ["X", "W", "B?", "Z?"],
        ["Y"],
        [
            ("auto_pad", "NOTSET"),
            ("dilations", _A.INTS),
            ("group", 1),
            ("kernel_shape", _A.INTS),
            ("pads", _A.INTS),
            ("strides", _A.INTS),
            ("activation", _A.STRING),
            ("activation_params", _A.FLOATS),
        ],
    ),
    "LayerNormalization": (["X", "Scale", "B?"], ["Y", "Mean?", "InvStdDev?"], _LN_ATTRS),
    "SimplifiedLayerNormalization": (["X", "scale"], ["Y", "inv_std_var?"], _LN_ATTRS),
    "SkipLayerNormalization": (
        ["input", "skip", "gamma", "beta?", "bias?"],
        ["output", "mean?", "inv_std_var?", "input_skip_bias_sum?"],
        [("epsilon", 1e-12)],
    ),
    "SkipSimplifiedLayerNormalization": (
        ["input", "skip", "gamma", "bias?"],
        ["output", "mean?", "inv_std_var?", "input_skip_bias_sum?"],
        [("epsilon", 1e-12)],
    ),
    "EmbedLayerNormalization": (
        [
            "input_ids",
            "segment_ids?",
            "word_embedding",
            "position_embedding",
            "segment_embedding?",
            "gamma",
            "beta",
            "mask?",
            "position_ids?",
        ],
        ["output", "mask_index?", "embedding_sum?"],
        [("epsilon", 1e-12), ("mask_index_type", 1)],
    ),
    "Attention": (
        [
            "input",
            "weights",
            "bias?",
            "mask_index?",
            "past?",
            "attention_bias?",
            "past_sequence_length?",
        ],
        ["output", "present?"],
        [
            ("num_heads", _A.INT),
            ("qkv_hidden_sizes", _A.INTS),
            ("unidirectional", 0),
            ("mask_filter_value", -10000.0),
            ("scale", 0.0),
            ("do_rotary", 0),
            ("past_present_share_buffer", 0),
            ("rotary_embedding_dim", 0),
        ],
    ),
    "MultiHeadAttention": (
        [
            "query",
            "key?",
            "value?",
            "bias?",
            "key_padding_mask?",
            "attention_bias?",
            "past_key?",
            "past_value?",
            "past_sequence_length?",
            "cache_indirection?",
        ],
        ["output", "present_key?", "present_value?", "qk?"],
        [
            ("num_heads", _A.INT),
            ("unidirectional", 0),
            ("mask_filter_value", -10000.0),
            ("scale", 0.0),
        ],
    ),
    "QAttention": (
        ["input", "weight", "bias", "input_scale", "weight_scale", "mask_index?"]
        + ["input_zero_point?", "weight_zero_point?", "past?"],
        ["output", "present?"],
        [
            ("num_heads", _A.INT),
            ("unidirectional", 0),
            ("do_rotary", 0),
            ("past_present_share_buffer", 0),
            ("mask_filter_value", -10000.0),
            ("scale", 0.0),
        ],
    ),
    "QEmbedLayerNormalization": (
        ["input_ids", "segment_ids?", "word_embedding_quant", "position_embedding_quant"]
        + ["segment_embedding?", "gamma_quant", "beta_quant", "mask?", "word_embedding_scale"]
        + ["position_embedding_scale", "segment_embedding_scale?", "gamma_scale", "beta_scale"]
        + ["word_embedding_zero_point", "position_embedding_zero_point"]
        + ["segment_embedding_zero_point?", "gamma_zero_point", "beta_zero_point"],
        ["layernorm_out", "mask_index_out"],
        [("epsilon", 1e-12)],
    ),
    "QuantizeLinear": (["x", "y_scale", "y_zero_point?"], ["y"], [("axis", 1)]),
    "DequantizeLinear": (["x", "x_scale", "x_zero_point?"], ["y"], [("axis", 1)]),
    "QLinearAdd": (
        ["A", "A_scale", "A_zero_point?", "B", "B_scale", "B_zero_point?"]
        + ["C_scale", "C_zero_point?"],
        ["C"],
        [],
    ),
    "QLinearMul": (
        ["A", "A_scale", "A_zero_point?", "B", "B_scale", "B_zero_point?"]
        + ["C_scale", "C_zero_point?"],
        ["C"],
        [],
    ),
    "QLinearSigmoid": (_QPARAMS, ["Y"], []),
    "QLinearLeakyRelu": (_QPARAMS, ["Y"], [("alpha", 0.01)]),
    "QLinearSoftmax": (_QPARAMS, ["Y"], [("axis", -1), ("opset", _A.INT)]),
    "QLinearGlobalAveragePool": (_QPARAMS, ["Y"], [("channels_last", 0)]),
    "QLinearAveragePool": (_QPARAMS, ["Y"], _POOL_ATTRS),
    "QLinearConcat": (["Y_scale", "Y_zero_point", "inputs*"], ["Y"], [("axis", _A.INT)]),
    "MatMulNBits": (
        ["A", "B", "scales", "zero_points?", "g_idx?", "bias?"],
        ["Y"],
        [("K", _A.INT), ("N", _A.INT), ("accuracy_level", 0), ("bits", 4)]
        + [("block_size", _A.INT)],
    ),
    "QGemm": (
        ["A", "a_scale", "a_zero_point", "B", "b_scale", "b_zero_point", "C?"]
        + ["y_scale?", "y_zero_point?"],
        ["Y"],
        [("alpha", 1.0), ("transA", 0), ("transB", 0)],
    ),
    # a decoder subgraph run in a loop (backends/cpu/kernels/op_contrib_greedy_search.py)
    "GreedySearch": (
        ["input_ids", "max_length", "min_length?", "repetition_penalty?", "vocab_mask?"]
        + ["prefix_vocab_mask?", "attention_mask?"],
        ["sequences"],
        [("decoder", _A.GRAPH), ("encoder", _A.GRAPH), ("init_decoder", _A.GRAPH)]
        + [("eos_token_id", _A.INT), ("pad_token_id", _A.INT), ("decoder_start_token_id", -1)]
        + [("model_type", 0), ("no_repeat_ngram_size", 0), ("vocab_size", -1)],
    ),
    # backends/cpu/kernels/op_contrib_beam_search.py
    "BeamSearch": (
        ["input_ids", "max_length", "min_length?", "num_beams", "num_return_sequences"]
        + ["length_penalty?", "repetition_penalty?", "vocab_mask?", "prefix_vocab_mask?"]
        + ["attention_mask?", "decoder_input_ids?", "logits_processor?"],
        ["sequences", "sequences_scores?", "scores?"],
        [("decoder", _A.GRAPH), ("encoder", _A.GRAPH), ("init_decoder", _A.GRAPH)]
        + [("eos_token_id", _A.INT), ("pad_token_id", _A.INT), ("decoder_start_token_id", -1)]
        + [("model_type", 0), ("no_repeat_ngram_size", 0), ("vocab_size", -1)]
        + [("early_stopping", 0)],
    ),
    "Sampling": (
        ["input_ids", "max_length", "min_length?", "repetition_penalty?", "vocab_mask?"]
        + ["prefix_vocab_mask?", "attention_mask?", "presence_mask?", "seed?"],
        ["sequences", "filtered_logits?"],
        [("decoder", _A.GRAPH), ("encoder", _A.GRAPH), ("init_decoder", _A.GRAPH)]
        + [("eos_token_id", _A.INT), ("pad_token_id", _A.INT), ("decoder_start_token_id", -1)]
        + [("model_type", 0), ("no_repeat_ngram_size", 0), ("vocab_size", -1)]
        + [("temperature", 1.0), ("top_p", 0.0), ("filter_value", float("-inf"))]
        + [("min_tokens_to_keep", 0), ("presence_penalty", 0.0), ("custom", 0)],
    ),
}


def _param(i: int, spec: str) -> OpSchema.FormalParameter:
    name = spec.rstrip("?*")
    option = _OPT if spec.endswith("?") else _VAR if spec.endswith("*") else None
    kwargs: dict[str, Any] = {}
    if option is not None:
        kwargs["param_option"] = option
    if option is _VAR:
        kwargs["is_homogeneous"] = False
    return OpSchema.FormalParameter(name, f"T{i}", "", **kwargs)


def _attribute(name: str, default: Any) -> OpSchema.Attribute:
    if isinstance(default, OpSchema.AttrType):
        return OpSchema.Attribute(name, default, "", required=False)
    return OpSchema.Attribute(name, helper.make_attribute(name, default), "")


def _schema(name: str) -> OpSchema:
    inputs, outputs, attrs = _SPECS[name]
    ins = [_param(i, s) for i, s in enumerate(inputs)]
    outs = [_param(len(inputs) + i, s) for i, s in enumerate(outputs)]
    constraints = [(f"T{i}", _TYPES, "") for i in range(len(inputs) + len(outputs))]
    return OpSchema(
        name,
        MS_DOMAIN,
        1,
        f"onnxruntime contrib op {name} (see onnxruntime's ContribOperators.md).",
        inputs=ins,
        outputs=outs,
        type_constraints=constraints,
        attributes=[_attribute(n, d) for n, d in attrs],
    )


def com_microsoft_schemas() -> list[OpSchema]:
    """Every ``com.microsoft`` schema anychip implements."""
    return [_schema(name) for name in _SPECS]
