"""``FuseSkipLayerNormPass``: a residual ``Add`` read by a ``LayerNormalization`` over the last
axis becomes one ``com.microsoft`` ``SkipLayerNormalization`` (as onnxruntime's transformer
optimizer writes it)::

    s = Add(a, b); y = LayerNormalization(s, gamma, beta, axis=-1)
    ->  y, , , s = SkipLayerNormalization(a, b, gamma, beta)

The sum stays an output when anything else reads it (GPT-2's pre-norm residual stream) or it
is a graph output; the CPU kernel computes it first, rounded as the Add rounds it, then the
normalization of ``layer_norm_rows`` (``backends/cpu/native/rows.py``): the unfused results, one
dispatch
and one pass over memory fewer (the tiny BERT has four such pairs, the tiny GPT-2 five).

Fires only on float32 with both Add inputs computed (not constants: a bias Add is
``fuse_gemm``'s) and of one shape (symbols alike, the last dimension known), the
LayerNormalization's ``axis`` the last, ``stash_type`` 1, its Mean and InvStdDev outputs
unused, and ``gamma`` (and ``beta``) constants of the last axis' width.
"""

from __future__ import annotations

from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import attrs, fuse_each, fused_node, producer
from anychip.ir.value import Value
from anychip.opsets.com_microsoft import MS_DOMAIN

__all__ = ["FuseSkipLayerNormPass"]


def _shape(v: Value | None) -> tuple | None:
    """``v``'s shape when it is computed float32 with a known last dimension (the others may
    be symbols: the kernel checks the arrays' shapes, and broadcasts with numpy where they
    differ)."""
    if v is None or v.dtype != 1 or v.const is not None or not v.shape:
        return None
    return tuple(v.shape) if isinstance(v.shape[-1], int) else None


def _unused(v: Value | None, graph: Graph) -> bool:
    return v is None or (not v.uses and v not in graph.outputs)


def _affine_ok(v: Value | None, width: int, optional: bool) -> bool:
    if v is None:
        return optional
    c = v.const
    return c is not None and c.dtype == "float32" and c.shape == (width,)


class FuseSkipLayerNormPass(Pass):
    """Fuse ``Add`` + last-axis ``LayerNormalization`` into ``SkipLayerNormalization``."""

    name = "fuse_skip_layer_norm"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        return fuse_each(graph, "LayerNormalization", self._fuse, self.name)

    def _match(self, ln: Node, graph: Graph) -> Node | None:
        """The Add to fuse into ``ln``, or None."""
        add = producer(ln.inputs[0], graph, "Add")
        if add is None or len(add.inputs) != 2:
            return None
        shape = _shape(add.outputs[0])
        if shape is None or any(_shape(v) != shape for v in add.inputs):
            return None
        axis = ln.attr("axis", -1)
        if axis not in (-1, len(shape) - 1) or ln.attr("stash_type", 1) != 1:
            return None
        if not all(_unused(v, graph) for v in ln.outputs[1:]):
            return None
        inputs = list(ln.inputs) + [None] * (3 - len(ln.inputs))
        if not (_affine_ok(inputs[1], shape[-1], False) and _affine_ok(inputs[2], shape[-1], True)):
            return None
        return add

    def _fuse(self, ln: Node, graph: Graph) -> int:
        add = self._match(ln, graph)
        if add is None:
            return 0
        total = add.outputs[0]
        keep_sum = len(total.uses) > 1 or total in graph.outputs
        outs = [ln.outputs[0]] + ([None, None, total] if keep_sum else [])
        inputs = [add.inputs[0], add.inputs[1], ln.inputs[1]]
        if len(ln.inputs) > 2 and ln.inputs[2] is not None:
            inputs.append(ln.inputs[2])
        eps = attrs(epsilon=float(ln.attr("epsilon", 1e-5)))
        fused = fused_node(
            ln, "SkipLayerNormalization", inputs, outs, eps, domain=MS_DOMAIN, version=1
        )
        # At the Add's place: the sum's other readers may come before the LayerNormalization.
        index = graph.nodes.index(add)
        graph.remove(ln)
        graph.remove(add)
        graph.insert(index, fused)
        return 1
