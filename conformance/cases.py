"""The onnx package's node conformance cases (``onnx.backend.test.loader``), as data.

``all_cases()`` lists every bundled node case, ``node_cases(ops)`` those whose graph uses only
the given op types, ``load_case(case)`` reads its model and data sets, ``max_error`` /
``assert_outputs_close`` compare outputs as onnx's ``BackendTest`` does (dtype, shape, values
within the case's tolerances, NaN equal to NaN). The cases come from the installed onnx
package, so the kit needs no test files of anychip's own.
"""

from __future__ import annotations

import functools
import glob
import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx
import onnx.backend.test.loader as loader
from onnx import numpy_helper

from anychip.conformance.case_cache import generated_node_cases

__all__ = [
    "NodeCase",
    "all_cases",
    "node_cases",
    "ops_of",
    "load_case",
    "run_case",
    "max_error",
    "assert_outputs_close",
]


class NodeCase:
    """One conformance case: a model and one or more (inputs, expected outputs) data sets.

    The onnx wheel either ships a case as files (``model_dir``) or builds it in memory
    (``model`` and ``data_sets``); both are handled.
    """

    def __init__(
        self,
        name: str,
        model_dir: str | None,
        rtol: float,
        atol: float,
        model: Any = None,
        data_sets: Any = None,
    ) -> None:
        self.name = name
        self.model_dir = model_dir
        self.rtol = rtol
        self.atol = atol
        self.model = model
        self.data_sets = data_sets

    def __repr__(self) -> str:
        return self.name


@functools.lru_cache(maxsize=8)
def all_cases(kind: str = "node") -> tuple[NodeCase, ...]:
    """Every bundled case of ``kind`` (``node``, ``simple``, ``pytorch-converted``...)."""
    out = []
    tests = generated_node_cases() if kind == "node" else loader.load_model_tests(kind=kind)
    for c in tests:
        if c.model_dir is None and c.model is None:
            continue
        out.append(NodeCase(c.name, c.model_dir, c.rtol, c.atol, c.model, c.data_sets))
    return tuple(out)


def ops_of(case: NodeCase) -> frozenset[str]:
    """The op types of the case's graph, subgraphs included."""
    key = case.model_dir or case.name
    found = _OPS.get(key)
    if found is None:
        if case.model is not None:
            m = case.model
        else:
            m = onnx.load(os.path.join(case.model_dir, "model.onnx"), load_external_data=False)
        found = _OPS[key] = _walk_ops(m)
    return found


_OPS: dict[str, frozenset[str]] = {}


def _walk_ops(m: onnx.ModelProto) -> frozenset[str]:
    ops = set()

    def walk(g: onnx.GraphProto) -> None:
        for n in g.node:
            ops.add(n.op_type)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for sub in a.graphs:
                    walk(sub)

    walk(m.graph)
    return frozenset(ops)


def node_cases(ops: Iterable[str], kind: str = "node") -> list[NodeCase]:
    """The cases of ``kind`` whose top-level op types are all in ``ops``."""
    wanted = set(ops)
    return [c for c in all_cases(kind) if ops_of(c) <= wanted]


def _read_proto(path: str) -> Any:
    """Read a tensor, sequence or optional ``.pb`` file as numpy / list / None."""
    data = open(path, "rb").read()
    t = onnx.TensorProto()
    try:
        t.ParseFromString(data)
        if t.data_type != 0 or t.dims or t.raw_data:
            return numpy_helper.to_array(t)
    except Exception:
        pass
    s = onnx.SequenceProto()
    try:
        s.ParseFromString(data)
        if s.elem_type != 0:
            return numpy_helper.to_list(s)
    except Exception:
        pass
    o = onnx.OptionalProto()
    o.ParseFromString(data)
    return numpy_helper.to_optional(o)


def load_case(case: NodeCase) -> tuple[onnx.ModelProto, list[tuple[list[Any], list[Any]]]]:
    """The model and its data sets (inputs, expected outputs) of ``case``."""
    if case.model is not None and case.model_dir is None:
        sets = [
            ([_from_memory(x) for x in ins], [_from_memory(y) for y in outs])
            for ins, outs in case.data_sets or []
        ]
        return case.model, sets
    model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
    sets = []
    for d in sorted(glob.glob(os.path.join(case.model_dir, "test_data_set_*"))):
        ins = [_read_proto(p) for p in sorted(glob.glob(os.path.join(d, "input_*.pb")), key=_index)]
        outs = [
            _read_proto(p) for p in sorted(glob.glob(os.path.join(d, "output_*.pb")), key=_index)
        ]
        sets.append((ins, outs))
    return model, sets


def _from_memory(x: Any) -> Any:
    """In-memory data come as numpy arrays, lists (sequences), None, or protos."""
    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    if isinstance(x, onnx.SequenceProto):
        return numpy_helper.to_list(x)
    if isinstance(x, onnx.OptionalProto):
        return numpy_helper.to_optional(x)
    if isinstance(x, list):
        return [_from_memory(v) for v in x]
    return x


def _index(path: str) -> int:
    return int(os.path.basename(path).split("_")[1].split(".")[0])


def assert_outputs_close(got: list[Any], want: list[Any], rtol: float, atol: float) -> None:
    """Compare outputs like onnx's BackendTest does (dtype, shape, values; NaN equal)."""
    assert len(got) == len(want), f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if isinstance(w, list):
            assert isinstance(g, list) and len(g) == len(w), f"output {i}: sequence mismatch"
            assert_outputs_close(g, w, rtol, atol)
            continue
        if w is None:
            assert g is None, f"output {i}: expected an empty optional"
            continue
        g = np.asarray(g)
        w = np.asarray(w)
        assert g.dtype == w.dtype, f"output {i}: dtype {g.dtype}, expected {w.dtype}"
        assert g.shape == w.shape, f"output {i}: shape {g.shape}, expected {w.shape}"
        if w.dtype == object:
            assert g.tolist() == w.tolist(), f"output {i}: {g} != {w}"
        elif w.dtype.kind in "fc" or w.dtype.itemsize == 1 and w.dtype.kind == "V":
            np.testing.assert_allclose(
                g.astype(np.float64) if w.dtype.kind != "c" else g,
                w.astype(np.float64) if w.dtype.kind != "c" else w,
                rtol=rtol,
                atol=atol,
                equal_nan=True,
                err_msg=f"output {i}",
            )
        elif w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=f"output {i}")
        else:  # ml_dtypes floats (bfloat16, float8, float4): compare as float32
            np.testing.assert_allclose(
                g.astype(np.float32),
                w.astype(np.float32),
                rtol=rtol,
                atol=atol,
                equal_nan=True,
                err_msg=f"output {i}",
            )


def run_case(case: NodeCase, devices: list[str] | None = None) -> None:
    """Run every data set of ``case`` through ``anychip.load`` and compare outputs."""
    import anychip

    model, sets = load_case(case)
    sess = anychip.load(model, devices=devices or ["cpu"])
    names = [i.name for i in sess.inputs]
    for ins, outs in sets:
        feeds = dict(zip(names, ins))
        got = sess.run(None, feeds)
        assert_outputs_close(got, outs, case.rtol, case.atol)


def max_error(got: list[Any], want: list[Any], rtol: float, atol: float) -> tuple[bool, float, str]:
    """``(ok, largest absolute difference, what differed)`` for outputs ``got`` against
    ``want``, judged like ``assert_outputs_close``; the difference is ``inf`` where dtypes,
    shapes or sequence lengths differ."""
    try:
        assert_outputs_close(got, want, rtol, atol)
        ok, why = True, ""
    except AssertionError as e:
        ok, why = False, " ".join(str(e).split())
    return ok, _largest_diff(got, want), why


def _largest_diff(got: Any, want: Any) -> float:
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return float("inf")
        return max([_largest_diff(g, w) for g, w in zip(got, want)] + [0.0])
    if want is None or got is None:
        return 0.0 if want is got else float("inf")
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape or g.dtype != w.dtype:
        return float("inf")
    if w.size == 0 or w.dtype == object:
        return 0.0 if w.dtype != object or g.tolist() == w.tolist() else float("inf")
    gf, wf = g.astype(np.float64), w.astype(np.float64)
    both_nan = np.isnan(gf) & np.isnan(wf)
    diff = np.where(both_nan | (gf == wf), 0.0, np.abs(gf - wf))
    return float(np.nanmax(np.where(np.isnan(diff), np.inf, diff)))
