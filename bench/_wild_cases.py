"""Corpus cases made with onnxruntime's own tools, and old-exporter models (see wild_corpus.py).

Each generator yields ``(name, build, (rtol, atol))``; ``build()`` returns ``(model, feeds)``
and is only called when the case runs, so listing the corpus costs nothing.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from bench._wild_models import bert_encoder, bert_feeds, mlp, small_cnn

__all__ = [
    "quantized_cases",
    "transformer_cases",
    "old_exporter_cases",
    "OLD_EXPORTER_MODELS",
    "ort_saved_optimized",
]

Build = Callable[[], tuple[onnx.ModelProto, dict[str, Any]]]
_TIGHT = (1e-4, 1e-4)


def _images(seed: int, batch: int = 2, size: int = 16) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, size, size)).astype(np.float32)


def _quantize_static(
    model: onnx.ModelProto, fmt: str, act: str, per_channel: bool
) -> onnx.ModelProto:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    name = model.graph.input[0].name
    shape = [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(7)
            self.feeds = iter(
                [{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(4)]
            )

        def get_next(self) -> dict | None:
            return next(self.feeds, None)

    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "f.onnx"), os.path.join(d, "q.onnx")
        onnx.save(model, src)
        quantize_static(
            src,
            dst,
            Reader(),
            quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
            activation_type=QuantType.QUInt8 if act == "u8" else QuantType.QInt8,
            weight_type=QuantType.QInt8,
            per_channel=per_channel,
        )
        return onnx.load(dst)


def _quantize_dynamic(model: onnx.ModelProto, weight: str, per_channel: bool) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "f.onnx"), os.path.join(d, "q.onnx")
        onnx.save(model, src)
        wt = QuantType.QInt8 if weight == "s8" else QuantType.QUInt8
        quantize_dynamic(src, dst, weight_type=wt, per_channel=per_channel)
        return onnx.load(dst)


def quantized_cases(full: bool) -> Iterator[tuple[str, Build, tuple[float, float]]]:
    for fmt in ("qdq", "qoperator"):
        for act in ("u8", "s8"):
            for pc in (False, True):
                name = f"small_cnn {fmt} {act}s8{' per-channel' if pc else ''}"

                def build(fmt: str = fmt, act: str = act, pc: bool = pc) -> tuple:
                    return _quantize_static(small_cnn(), fmt, act, pc), {"x": _images(1)}

                yield name, build, _TIGHT
    for fmt in ("qdq", "qoperator"):  # static MatMul models: QLinearMatMul / QDQ MatMul
        for act in ("u8", "s8"):
            for pc in (False, True):

                def static_mlp(fmt: str = fmt, act: str = act, pc: bool = pc) -> tuple:
                    x = np.random.default_rng(5).standard_normal((16, 32)).astype(np.float32)
                    return _quantize_static(mlp(), fmt, act, pc), {"x": x}

                yield f"mlp {fmt} {act}s8{' per-channel' if pc else ''}", static_mlp, _TIGHT
    for weight in ("s8", "u8"):
        for pc in (False, True):

            def dyn(weight: str = weight, pc: bool = pc) -> tuple:
                x = np.random.default_rng(2).standard_normal((16, 32)).astype(np.float32)
                return _quantize_dynamic(mlp(), weight, pc), {"x": x}

            yield f"mlp dynamic {weight}{' per-channel' if pc else ''}", dyn, _TIGHT
    yield (
        "bert dynamic s8",
        lambda: (_quantize_dynamic(bert_encoder(), "s8", False), bert_feeds()),
        (1e-3, 1e-3),
    )
    if full:
        for fmt in ("qdq", "qoperator"):
            yield (
                f"small_cnn 64px {fmt} u8s8 per-channel",
                lambda fmt=fmt: (
                    _quantize_static(small_cnn(size=64), fmt, "u8", True),
                    {"x": _images(3, 8, 64)},
                ),
                _TIGHT,
            )


def ort_saved_optimized(model: onnx.ModelProto, level: str) -> onnx.ModelProto:
    """``model`` as onnxruntime saves it after its graph optimizations at ``level``
    (``extended`` writes com.microsoft fused ops; ``all`` adds its NCHWc layout ops)."""
    import onnxruntime as ort

    levels = {
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    with tempfile.TemporaryDirectory() as d:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = levels[level]
        opts.optimized_model_filepath = os.path.join(d, "o.onnx")
        ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return onnx.load(opts.optimized_model_filepath)


def _fused_bert(approximate: bool, **shape: int) -> onnx.ModelProto:
    """``bert_encoder`` through onnxruntime's transformer optimizer (Attention,
    EmbedLayerNormalization, SkipLayerNormalization, BiasGelu or FastGelu)."""
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    opts = FusionOptions("bert")
    opts.enable_gelu_approximation = approximate
    hidden, heads = shape.get("hidden", 32), shape.get("heads", 4)
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "b.onnx")
        onnx.save(bert_encoder(**shape), src)
        fused = optimizer.optimize_model(
            src, "bert", num_heads=heads, hidden_size=hidden, opt_level=0,
            optimization_options=opts,
        )  # fmt: skip
        return fused.model


def _quantized_fused_bert() -> onnx.ModelProto:
    """The fused BERT through quantize_dynamic: QAttention, QEmbedLayerNormalization."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = _fused_bert(False)
    if not any(op.domain == "com.microsoft" for op in model.opset_import):
        model.opset_import.append(h.make_opsetid("com.microsoft", 1))
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "f.onnx"), os.path.join(d, "q.onnx")
        onnx.save(model, src)
        extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}  # contrib outputs have no type
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8, extra_options=extra)
        return onnx.load(dst)


def transformer_cases(full: bool) -> Iterator[tuple[str, Build, tuple[float, float]]]:
    yield "bert fused (Attention, BiasGelu)", lambda: (_fused_bert(False), bert_feeds()), _TIGHT
    yield "bert fused (FastGelu)", lambda: (_fused_bert(True), bert_feeds()), _TIGHT
    yield (
        "bert ort-extended (FusedMatMul)",
        lambda: (ort_saved_optimized(bert_encoder(), "extended"), bert_feeds()),
        _TIGHT,
    )
    yield (
        "cnn ort-extended (FusedConv)",
        lambda: (ort_saved_optimized(small_cnn(), "extended"), {"x": _images(4)}),
        _TIGHT,
    )
    yield (
        "mlp ort-extended (FusedGemm)",
        lambda: (
            ort_saved_optimized(mlp(), "extended"),
            {"x": _images(5)[:, 0, :, :].reshape(-1, 32)},
        ),
        _TIGHT,
    )
    yield (
        "cnn ort-all (NCHWc layout)",
        lambda: (ort_saved_optimized(small_cnn(), "all"), {"x": _images(4)}),
        _TIGHT,
    )
    yield (
        "bert fused + dynamic s8 (QAttention)",
        lambda: (_quantized_fused_bert(), bert_feeds()),
        _TIGHT,
    )
    if full:
        big = {"layers": 4, "hidden": 128, "heads": 8, "seq": 64, "vocab": 500}
        yield (
            "bert-4x128 fused",
            lambda: (_fused_bert(False, **big), bert_feeds(batch=4, seq=64, vocab=500)),
            _TIGHT,
        )


# -- old exporters: what onnxruntime runs and onnx.checker refuses ---------------------------
_RNG_SEED = 19


def _io(name: str, shape: list) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, T.FLOAT, shape)


def _init_not_input() -> onnx.ModelProto:
    w = np.random.default_rng(_RNG_SEED).standard_normal((3, 3)).astype(np.float32)
    node = h.make_node("MatMul", ["x", "W"], ["y"])
    g = h.make_graph([node], "g", [_io("x", [2, 3])], [_io("y", [2, 3])], [nh.from_array(w, "W")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 7)], ir_version=3)


def _untyped() -> onnx.ModelProto:
    nodes = [h.make_node("Relu", ["x"], ["t"]), h.make_node("Abs", ["t"], ["y"])]
    g = h.make_graph(nodes, "g", [_io("x", [2, 3])], [])
    for name, where in (("t", g.value_info), ("y", g.output)):
        vi = onnx.ValueInfoProto()
        vi.name = name
        where.append(vi)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


def _no_shape_field() -> onnx.ModelProto:
    nodes = [h.make_node("Relu", ["x"], ["y"])]
    g = h.make_graph(nodes, "g", [_io("x", [2, 3])], [_io("y", [2, 3])])
    g.output[0].type.tensor_type.ClearField("shape")
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


def _ai_onnx_domain() -> onnx.ModelProto:
    node = h.make_node("Relu", ["x"], ["y"], domain="ai.onnx")
    g = h.make_graph([node], "g", [_io("x", [2, 3])], [_io("y", [2, 3])])
    return h.make_model(g, opset_imports=[h.make_opsetid("ai.onnx", 13)])


def _empty_name() -> onnx.ModelProto:
    g = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"])], "", [_io("x", [2, 3])], [_io("y", [2, 3])]
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


def _layer_norm_13() -> onnx.ModelProto:
    rng = np.random.default_rng(_RNG_SEED)
    inits = [nh.from_array(rng.standard_normal(3).astype(np.float32), n) for n in ("s", "b")]
    node = h.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-3)
    g = h.make_graph([node], "g", [_io("x", [2, 3])], [_io("y", [2, 3])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


def _negative_dim() -> onnx.ModelProto:
    g = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"])], "g", [_io("x", [-1, 3])], [_io("y", [-1, 3])]
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


def _wrong_output_shape() -> onnx.ModelProto:
    nodes = [h.make_node("Relu", ["x"], ["t"]), h.make_node("Abs", ["t"], ["y"])]
    huge = [100000, 100000, 64]
    g = h.make_graph(nodes, "g", [_io("x", [2, 3])], [_io("y", huge)], value_info=[_io("t", huge)])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


#: name -> (builder, the words of the warning anychip gives, None when it gives none)
OLD_EXPORTER_MODELS: dict[str, tuple[Callable[[], onnx.ModelProto], str | None]] = {
    "initializer not a graph input (IR 3)": (_init_not_input, "not listed as graph inputs"),
    "value_info and output without a type": (_untyped, "without a type"),
    "output type without a shape field": (_no_shape_field, None),
    "domain spelled ai.onnx": (_ai_onnx_domain, "ai.onnx"),
    "empty graph name": (_empty_name, "empty graph name"),
    "LayerNormalization at opset 13": (_layer_norm_13, "LayerNormalization"),
    "dim_value -1": (_negative_dim, None),
    "wrong declared output shape": (_wrong_output_shape, "declared"),
}


def old_exporter_cases(full: bool) -> Iterator[tuple[str, Build, tuple[float, float]]]:
    x = np.random.default_rng(_RNG_SEED).standard_normal((2, 3)).astype(np.float32)
    for name, (build, _) in OLD_EXPORTER_MODELS.items():
        yield name, lambda build=build: (build(), {"x": x}), _TIGHT
