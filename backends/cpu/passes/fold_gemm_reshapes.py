"""``FoldGemmReshapesPass``: the Reshapes an exporter writes around a linear layer go.

Exporters flatten a ``[..., K]`` activation to 2-D for Gemm and give the result its leading
dimensions back (the tiny GPT-2 export: 14 of its 24 Reshapes)::

    a = Reshape(x, [-1, K]); y2 = Gemm(a, B[, C]); y = Reshape(y2, [..., N])

becomes ``y = MatMul(x, B)`` (``anychip::MatMulAdd(x, B, C)`` with a bias), the product of the
same rows: numpy's and oneDNN's MatMul read an N-D activation as its 2-D rows. Fires when
Gemm is the plain product (alpha = beta = 1, neither operand transposed, B a constant 2-D
matrix, C absent or a constant of N elements), each intermediate has one reader and is not a
graph output, and ``y``'s leading dimensions are ``x``'s (equal ints or the same symbol). When
``x`` has another last dimension than ``K`` (the attention's merged heads, ``[1, S, H, D]``),
or other leading dimensions than ``y`` (any, since ``y``'s rows are the Gemm's), the first
Reshape stays and gives ``x`` the leading dimensions of ``y`` and the last ``K`` (one symbolic
dimension at most, written -1; none of size 0).
"""

from __future__ import annotations

import numpy as np

from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import (
    FLOATS,
    Names,
    constant,
    fused_node,
    producer,
    reader,
    record,
    single_use,
)
from anychip.ir.value import Value
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["FoldGemmReshapesPass"]


class FoldGemmReshapesPass(Pass):
    """Reshape -> Gemm -> Reshape becomes one N-D MatMul (or MatMulAdd)."""

    name = "fold_gemm_reshapes"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        fired = 0
        names = None
        for gemm in list(graph.nodes):
            if gemm.graph is graph and gemm.op_type == "Gemm" and not gemm.domain:
                match = _match(gemm, graph)
                if match is not None:
                    names = names or Names(graph)
                    fired += _rewrite(gemm, *match, graph, names)
        record(graph, self.name, fired)
        return PassResult(graph, fired > 0)


def _match(gemm: Node, graph: Graph) -> tuple[Node, Node] | None:
    """The Reshapes before and after a plain Gemm, when the fold is exact (module docstring)."""
    if any(gemm.attr(k, d) != d for k, d in (("alpha", 1.0), ("beta", 1.0))):
        return None
    if gemm.attr("transA", 0) or gemm.attr("transB", 0):
        return None
    a, b = gemm.inputs[0], gemm.inputs[1]
    c = gemm.inputs[2] if len(gemm.inputs) > 2 else None
    if a is None or b is None or b.const is None or b.const.ndim != 2 or a.dtype not in FLOATS:
        return None
    n = b.const.shape[1]
    if b.dtype != a.dtype or c is not None and (c.const is None or c.dtype != a.dtype):
        return None
    if c is not None and (c.const.size != n or c.const.shape not in ((n,), (1, n))):
        return None
    first, last = producer(a, graph, "Reshape"), reader(gemm.outputs[0], graph, "Reshape")
    if first is None or last is None or not single_use(a, graph):
        return None
    x, y = first.inputs[0], last.outputs[0]
    if x is None or x.shape is None or y.shape is None or len(y.shape) < 2:
        return None
    if y.shape[-1] != n or x.dtype != a.dtype:
        return None
    if tuple(x.shape[:-1]) == tuple(y.shape[:-1]) and x.shape[-1] == b.const.shape[0]:
        return first, last
    if _target(y.shape[:-1], b.const.shape[0]) is None:
        return None
    return first, last


def _target(lead: tuple, k: int) -> np.ndarray | None:
    """``lead + (k,)`` as a Reshape's shape input (one symbolic dimension written -1)."""
    symbolic = [d for d in lead if not isinstance(d, int)]
    if len(symbolic) > 1 or any(isinstance(d, int) and d <= 0 for d in lead):
        return None
    return np.array([d if isinstance(d, int) else -1 for d in lead] + [k], np.int64)


def _rewrite(gemm: Node, first: Node, last: Node, graph: Graph, names: Names) -> int:
    x, b = first.inputs[0], gemm.inputs[1]
    c = gemm.inputs[2] if len(gemm.inputs) > 2 else None
    y = last.outputs[0]
    k = b.const.shape[0]
    chain = [first, gemm, last]
    index = graph.nodes.index(last)
    if tuple(x.shape[:-1]) != tuple(y.shape[:-1]) or x.shape[-1] != k:
        # keep a Reshape, to x's rows of K: y's leading dimensions and K
        lead = tuple(y.shape[:-1])
        shape = constant(graph, names, "rows_shape", _target(lead, k))
        rows = Value(names.fresh(x.name + "_rows"), x.dtype, lead + (k,))
        keep = fused_node(first, "Reshape", [x, shape], [rows], {})
        chain = [gemm, last]
        x = rows
    else:
        keep = None
    if c is None:
        fused = fused_node(gemm, "MatMul", [x, b], [y], {}, version=13)
    else:
        bias = c if c.const.ndim == 1 else constant(graph, names, c.name, c.const.reshape(-1))
        fused = fused_node(
            gemm, "MatMulAdd", [x, b, bias], [y], {}, domain=ANYCHIP_DOMAIN, version=1
        )
    for node in reversed(chain):
        graph.remove(node)
    if keep is not None:
        graph.remove(first)
        graph.insert(index - 2, keep)
        graph.insert(index - 1, fused)
    else:
        graph.insert(index - 2, fused)
    return 1
