"""The nine light CNNs that ship with onnx, with seeded random weights.

onnx's ``backend/test/data/light`` models build every weight with ``ConstantOfShape`` (all
0.02), so every class scores the same and any two runtimes "agree" whatever they compute.
``light_model(name, seed)`` replaces each such fill with a seeded random initializer drawn for
the role it plays (He-normal Conv/Gemm weights, small biases, BatchNormalization scales in
[0.3, 0.7) and variances in [0.5, 1.5)), so activations stay near 1 and a comparison of
outputs means something. The shapes come from onnx's shape inference with data propagation.
"""

from __future__ import annotations

import os
from collections import defaultdict
from math import prod

import numpy as np

from anychip.errors import ModelError

__all__ = ["LIGHT_MODELS", "light_model", "light_model_path"]

LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)


def light_model_path(name: str) -> str:
    """The path of onnx's bundled ``light_<name>.onnx`` (weights as constant fills)."""
    import onnx

    if name not in LIGHT_MODELS:
        raise ModelError(f"unknown light model {name!r}; choose one of {', '.join(LIGHT_MODELS)}")
    folder = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    return os.path.join(folder, f"light_{name}.onnx")


def light_model(name: str, seed: int = 0) -> object:
    """``light_<name>`` as an ``onnx.ModelProto`` whose weights are seeded random values."""
    import onnx
    from onnx import helper, numpy_helper, shape_inference

    model = onnx.load(light_model_path(name))
    inferred = shape_inference.infer_shapes(model, data_prop=True)
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in list(inferred.graph.value_info) + list(inferred.graph.output)
    }
    consumers: dict[str, list[tuple[object, int]]] = defaultdict(list)
    for node in model.graph.node:
        for i, name_in in enumerate(node.input):
            consumers[name_in].append((node, i))
    rng = np.random.default_rng(seed)
    kept = []
    for node in model.graph.node:
        if node.op_type != "ConstantOfShape":
            kept.append(node)
            continue
        out = node.output[0]
        shape = shapes.get(out)
        if not shape or any(d <= 0 for d in shape):
            raise ModelError(f"{name}: the shape of {out!r} is not known after shape inference")
        uses = consumers.get(out, [])
        array = _draw(rng, tuple(shape), uses[0] if uses else None)
        model.graph.initializer.append(numpy_helper.from_array(array, out))
    del model.graph.node[:]
    model.graph.node.extend(kept)
    _drop_unused_initializers(model)
    if model.ir_version < 4:
        # Before IR 4 every initializer must also be a graph input.
        listed = {i.name for i in model.graph.input}
        for init in model.graph.initializer:
            if init.name not in listed:
                model.graph.input.append(
                    helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
                )
    return model


def _drop_unused_initializers(model: object) -> None:
    """Remove the shape constants the fills read (and their input entries)."""
    used = {name for node in model.graph.node for name in node.input}
    unused = {i.name for i in model.graph.initializer if i.name not in used}
    kept = [i for i in model.graph.initializer if i.name not in unused]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    inputs = [i for i in model.graph.input if i.name not in unused]
    del model.graph.input[:]
    model.graph.input.extend(inputs)


def _draw(rng: np.random.Generator, shape: tuple[int, ...], use: tuple | None) -> np.ndarray:
    """Random values for a weight of ``shape`` read as input ``use = (node, index)``."""
    op, index = (use[0].op_type, use[1]) if use is not None else ("", -1)
    if op == "Conv" and index == 1:
        fan_in = prod(shape[1:])
        return _normal(rng, shape, np.sqrt(2.0 / fan_in))
    if op == "Gemm" and index == 1:
        trans_b = any(a.name == "transB" and a.i for a in use[0].attribute)
        fan_in = shape[1] if trans_b else shape[0]
        return _normal(rng, shape, np.sqrt(1.0 / fan_in))
    if op in ("Conv", "Gemm") and index == 2:
        return _normal(rng, shape, 0.1)
    if op == "BatchNormalization" and index in (2, 3):
        return _normal(rng, shape, 0.1)
    if op == "BatchNormalization" and index == 1:
        # A scale below 1 keeps deep residual stacks (ResNet-50, ShuffleNet) near unit scale:
        # the statistics are random, so BatchNormalization does not normalize here.
        return _uniform(rng, shape, 0.3, 0.7)
    # BatchNormalization scale and variance, and scales applied through other ops.
    return _uniform(rng, shape, 0.5, 1.5)


def _normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    out = rng.standard_normal(shape, dtype=np.float32)  # float32 directly: VGG's 548 MB
    out *= np.float32(std)
    return out


def _uniform(
    rng: np.random.Generator, shape: tuple[int, ...], low: float, high: float
) -> np.ndarray:
    out = rng.random(shape, dtype=np.float32)
    out *= np.float32(high - low)
    out += np.float32(low)
    return out
