"""Models and helpers shared by the NPU tests: small graphs built with onnx.helper."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

from anychip.backends.npu_stub.backend import NpuBackend
from anychip.core.plugin.host import get_registry
from anychip.ir.graph import Graph
from anychip.ir.onnx import import_model


def _init(name: str, arr: np.ndarray) -> onnx.TensorProto:
    return nh.from_array(np.asarray(arr, dtype=np.float32), name)


def convnet(middle: list[onnx.NodeProto] | None = None, batch: int | None = 2) -> onnx.ModelProto:
    """Conv-BN-Relu-MaxPool-Conv-Relu-Add-GlobalAveragePool-Flatten-Gemm-Softmax.

    ``middle`` nodes are spliced between the pool (``p1``) and the second conv, reading ``p1``
    and writing ``m``.
    """
    rng = np.random.default_rng(0)
    inits = [
        _init("w1", rng.standard_normal((8, 3, 3, 3)) * 0.3),
        _init("b1", rng.standard_normal(8) * 0.1),
        _init("s1", rng.random(8) + 0.5),
        _init("o1", rng.standard_normal(8) * 0.1),
        _init("m1", rng.standard_normal(8) * 0.1),
        _init("v1", rng.random(8) + 0.5),
        _init("w2", rng.standard_normal((8, 8, 3, 3)) * 0.2),
        _init("b2", rng.standard_normal(8) * 0.1),
        _init("wg", rng.standard_normal((5, 8)) * 0.3),
        _init("bg", rng.standard_normal(5) * 0.1),
    ]
    first = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        h.make_node("BatchNormalization", ["c1", "s1", "o1", "m1", "v1"], ["bn1"], name="bn1"),
        h.make_node("Relu", ["bn1"], ["r1"], name="relu1"),
        h.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
    ]
    mid = middle or [h.make_node("Relu", ["p1"], ["m"], name="mid")]
    last = [
        h.make_node("Conv", ["m", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        h.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        h.make_node("Add", ["r2", "p1"], ["a2"], name="add2"),
        h.make_node("GlobalAveragePool", ["a2"], ["g"], name="gap"),
        h.make_node("Flatten", ["g"], ["f"], name="flat"),
        h.make_node("Gemm", ["f", "wg", "bg"], ["z"], transB=1, name="fc"),
        h.make_node("Softmax", ["z"], ["y"], axis=1, name="softmax"),
    ]
    x = h.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])
    y = h.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 5])
    graph = h.make_graph(first + mid + last, "convnet", [x], [y], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def single_op(
    op: str,
    inputs: list[np.ndarray],
    *,
    consts: dict[int, np.ndarray] | None = None,
    opset: int = 17,
    **attributes,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model; inputs listed in ``consts`` (by position) become initializers."""
    consts = consts or {}
    names, feeds, infos, inits = [], {}, [], []
    for i, arr in enumerate(inputs):
        name = f"in{i}"
        names.append(name)
        if i in consts:
            inits.append(nh.from_array(consts[i], name))
        else:
            feeds[name] = arr
            infos.append(h.make_tensor_value_info(name, TensorProto.FLOAT, list(arr.shape)))
    node = h.make_node(op, names, ["out"], **attributes)
    out = h.make_tensor_value_info("out", TensorProto.FLOAT, None)
    model = h.make_model(
        h.make_graph([node], op.lower(), infos, [out], inits),
        opset_imports=[h.make_opsetid("", opset)],
    )
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    return model, feeds


def ir_graph(model: onnx.ModelProto) -> Graph:
    """The model imported into the IR (shapes inferred), ready for the NPU passes/compiler."""
    return import_model(model, custom_schemas=get_registry().schemas).graph


def run_on_npu(graph: Graph, feeds: dict[str, np.ndarray], **options) -> list[np.ndarray]:
    """Compile ``graph`` on a fresh NPU and run it: copies in, runs, copies out.

    Every call also checks the compiled artifact: the executable written as bytes and loaded
    back (``load_compiled``: kernels rebuilt from the stored nodes and packed weights) gives
    the same bits, so each kernel test covers the NPU's serialized format too."""
    npu = NpuBackend().configure(memory=16 << 20, **options)
    compiled = npu.compile(graph)
    ins = [npu.to_device(feeds[v.name]) for v in graph.inputs]
    outs = [npu.to_host(t) for t in compiled.run(ins)]
    data = compiled.serialize()
    assert data is not None, "the NPU writes every partition it compiles"
    loaded = npu.load_compiled(data)
    again = [npu.to_host(t) for t in loaded.run(ins)]
    for a, b in zip(outs, again, strict=True):
        np.testing.assert_array_equal(a, b)  # bit for bit (NaN where NaN)
    assert loaded.info == compiled.info
    return outs


@pytest.fixture
def x() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
