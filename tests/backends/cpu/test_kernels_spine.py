"""The CPU backend's "spine" kernels against the onnx package's conformance node cases.

Every bundled ``onnx.backend.test`` node case whose graph uses only the spine ops is one test.
Cases run through ``anychip.load`` (the real session path) when it exists, otherwise through
a small direct interpreter in this file that resolves schemas, fills attribute defaults, looks
kernels up in ``CPU_KERNELS`` and calls them, exactly as the runtime contract describes.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnx
import onnx.backend.test.loader as loader
import pytest
from onnx import numpy_helper

from anychip.backends.cpu.kernels import load_all
from anychip.backends.cpu.table import CPU_KERNELS
from anychip.ir.dtypes import DType
from anychip.opsets.schemas import attribute_defaults, resolve
from tests.node_cases import assert_outputs_close, node_cases, run_case

SPINE_OPS = frozenset(
    "Add Sub Mul Div Pow Sum Mean Max Min Neg Abs Sqrt Exp Log Reciprocal Erf Tanh Sigmoid Relu "
    "LeakyRelu Elu Selu Clip Gelu HardSigmoid HardSwish Softplus Floor Ceil Equal Greater "
    "GreaterOrEqual Less LessOrEqual Not And Or Xor Where MatMul Gemm Conv BatchNormalization "
    "MaxPool AveragePool GlobalAveragePool GlobalMaxPool LRN Dropout Softmax LogSoftmax "
    "LayerNormalization Gather Reshape Transpose Concat Slice Split Shape Size Cast CastLike "
    "Expand Unsqueeze Squeeze Flatten Identity Constant ConstantOfShape Range Tile Pad ReduceMean "
    "ReduceSum ReduceMax ReduceMin ReduceProd ReduceSumSquare ReduceL1 ReduceL2 ReduceLogSum "
    "ReduceLogSumExp".split()
)


class _Case:
    """An in-memory conformance case (the onnx wheel may generate node cases without files)."""

    def __init__(
        self, name: str, model: onnx.ModelProto, data_sets: list, rtol: float, atol: float
    ) -> None:
        self.name = name
        self.model = model
        self.data_sets = data_sets
        self.rtol = rtol
        self.atol = atol

    def __repr__(self) -> str:
        return self.name


def _graph_ops(g: onnx.GraphProto) -> set[str]:
    return {n.op_type for n in g.node}


@functools.lru_cache(maxsize=1)
def _spine_cases() -> tuple[Any, ...]:
    """File-backed cases from ``node_cases``, else the loader's in-memory ones."""
    on_disk = node_cases(SPINE_OPS)
    if on_disk:
        return tuple(on_disk)
    out = []
    for c in loader.load_model_tests(kind="node"):
        if c.model is not None and _graph_ops(c.model.graph) <= SPINE_OPS:
            sets = [
                ([_to_numpy(v) for v in ins], [_to_numpy(v) for v in outs])
                for ins, outs in c.data_sets
            ]
            out.append(_Case(c.name, c.model, sets, c.rtol, c.atol))
    return tuple(out)


def _to_numpy(value: Any) -> Any:
    """Generated cases keep some tensors (4-bit, float8) as TensorProto: decode them."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return value


def _session_ready() -> bool:
    try:
        import anychip
    except ImportError:
        return False
    return callable(getattr(anychip, "load", None))


class _Ctx:
    """The slice of ``KernelContext`` the direct interpreter provides."""

    def __init__(self, num_outputs: int, node: onnx.NodeProto) -> None:
        self.num_outputs = num_outputs
        self.node = node


def _attr_value(a: onnx.AttributeProto) -> Any:
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode() for x in v]
    return v


def run_direct(model: onnx.ModelProto, inputs: list[Any]) -> list[Any]:
    """Interpret ``model`` node by node with the CPU kernels (no session)."""
    load_all()
    g = model.graph
    opsets = {o.domain: o.version for o in model.opset_import}
    env: dict[str, Any] = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    env.update(zip([i.name for i in g.input], inputs))
    for n in g.node:
        schema = resolve(n.op_type, n.domain, opsets.get(n.domain, opsets.get("", 1)))
        attrs = dict(attribute_defaults(schema))
        attrs.update({a.name: _attr_value(a) for a in n.attribute})
        args = [env[name] if name else None for name in n.input]
        while args and args[-1] is None:
            args.pop()
        dtype = None
        if args and isinstance(args[0], np.ndarray):
            dtype = DType.from_numpy(args[0].dtype)
        match = CPU_KERNELS.lookup(n.domain, n.op_type, schema.since_version, dtype)
        assert match, match.reason
        k = match.kernel
        if k.context:
            res = k.fn(_Ctx(len(n.output), n), *args, **attrs)
        else:
            res = k.fn(*args, **attrs)
        outs = res if isinstance(res, tuple) else (res,)
        for name, value in zip(n.output, outs):
            if name:
                env[name] = value if isinstance(value, list) or value is None else np.asarray(value)
    return [env[o.name] for o in g.output]


@pytest.mark.parametrize("case", _spine_cases(), ids=repr)
def test_conformance(case: Any) -> None:
    if isinstance(case, _Case) and _session_ready():
        got_sets = _run_session(case)
    elif isinstance(case, _Case):
        got_sets = [run_direct(case.model, ins) for ins, _ in case.data_sets]
    else:
        run_case(case)
        return
    for got, (_, want) in zip(got_sets, case.data_sets):
        assert_outputs_close(got, want, case.rtol, case.atol)


def _run_session(case: _Case) -> list[list[Any]]:
    import anychip

    sess = anychip.load(case.model, devices=["cpu"])
    names = [i.name for i in sess.inputs]
    return [sess.run(None, dict(zip(names, ins))) for ins, _ in case.data_sets]


def test_every_spine_op_has_a_kernel_for_every_schema_version() -> None:
    load_all()
    missing = []
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == "" and s.name in SPINE_OPS:
            if not CPU_KERNELS.lookup("", s.name, s.since_version):
                missing.append(f"{s.name}-{s.since_version}")
    assert not missing, missing


def _naive_conv(x, w, b, pads, strides, dilations, group):
    """Direct 2-D convolution with Python loops over outputs: the slow, obvious reference."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    ho = (h + pads[0] + pads[2] - (kh - 1) * dilations[0] - 1) // strides[0] + 1
    wo = (wd + pads[1] + pads[3] - (kw - 1) * dilations[1] - 1) // strides[1] + 1
    y = np.zeros((n, m, ho, wo))
    mg = m // group
    for oc in range(m):
        gi = oc // mg
        for i in range(ho):
            for j in range(wo):
                r, s = i * strides[0], j * strides[1]
                patch = xp[
                    :,
                    gi * cg : (gi + 1) * cg,
                    r : r + (kh - 1) * dilations[0] + 1 : dilations[0],
                    s : s + (kw - 1) * dilations[1] + 1 : dilations[1],
                ]
                y[:, oc, i, j] = np.tensordot(patch, w[oc], axes=3)
    if b is not None:
        y += b.reshape(1, m, 1, 1)
    return y


@pytest.mark.parametrize(
    ("c", "m", "group", "k", "pads", "strides", "dilations"),
    [
        (4, 6, 1, 3, [1, 1, 1, 1], [1, 1], [1, 1]),
        (4, 6, 2, 3, [0, 1, 2, 1], [2, 1], [1, 1]),
        (6, 6, 6, 3, [1, 1, 1, 1], [1, 1], [1, 1]),  # depthwise, flat stride-1 path
        (6, 6, 6, 3, [2, 2, 2, 2], [1, 1], [2, 2]),  # depthwise with dilation
        (6, 12, 6, 3, [1, 1, 1, 1], [2, 2], [1, 1]),  # depthwise multiplier 2, strided
        (4, 8, 1, 1, [0, 0, 0, 0], [1, 1], [1, 1]),  # 1x1 direct matmul
        (4, 8, 2, 1, [0, 0, 0, 0], [2, 2], [1, 1]),  # strided grouped 1x1
        (3, 5, 1, 2, [1, 0, 0, 1], [1, 2], [2, 1]),
    ],
)
def test_conv_paths_match_direct_convolution(c, m, group, k, pads, strides, dilations):
    from anychip.backends.cpu.kernels.op_conv import conv

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, c, 9, 8)).astype(np.float32)
    w = rng.standard_normal((m, c // group, k, k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    got = conv(x, w, b, group=group, pads=pads, strides=strides, dilations=dilations)
    want = _naive_conv(x, w, b, pads, strides, dilations, group)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_maxpool_indices_match_argmax_and_storage_order():
    from anychip.backends.cpu.kernels.op_pool import max_pool

    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    for order in (0, 1):
        y, idx = max_pool(
            _Ctx(2, None),
            x,
            kernel_shape=[2, 3],
            strides=[2, 2],
            pads=[1, 1, 0, 0],
            storage_order=order,
        )
        assert idx.dtype == np.int64 and idx.shape == y.shape
        if order == 0:
            np.testing.assert_array_equal(x.reshape(-1)[idx], y)
        else:
            # column-major over spatial axes: index = n*C*H*W + c*H*W + w*H + h
            plane = idx % 30
            h, wcol = plane % 5, plane // 5
            nc = idx // 30
            np.testing.assert_array_equal(x.reshape(6, 5, 6)[nc, h, wcol], y)
