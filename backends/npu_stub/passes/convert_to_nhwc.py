"""``ConvertToNhwcPass``: run the NPU's convolutions and pools channels-last.

The NPU's conv engine wants NHWC (channels contiguous: one im2col row is one memory run).
The pass works in three moves, repeated until nothing changes:

1. *convert*: each 4-D Conv, MaxPool, AveragePool, GlobalAveragePool (or NCHW ``NpuConv`` /
   ``NpuPool``) becomes an NHWC ``NpuConv`` / ``NpuPool`` between two Transposes: NCHW->NHWC
   on its input, NHWC->NCHW on its output (which keeps the original value, so readers and
   graph outputs are untouched);
2. *push*: an elementwise op (Relu, Clip, Sigmoid, HardSwish, Add, Mul, Sum) whose data inputs
   all come from NHWC->NCHW Transposes runs in NHWC instead, with the Transpose moved after it
   (4-D constants are permuted along); only where every reader of those Transposes can follow
   (elementwise ops, or Transposes back to NHWC), so the Transposes it moves past die;
3. *cancel*: a Transpose of a Transpose whose permutations compose to the identity is
   bypassed, and nodes nobody reads are removed.

The repetition is bounded (``ir/passes/base.fixed_point``): a graph on which it would not
settle raises ``PassLoopError`` naming the pass, and the partition goes elsewhere.

What is left are Transposes at the partition's edges and where a layout-agnostic op (Reshape,
Gemm) needs NCHW. The graph stays valid after each move.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.npu_stub.kernels.op_pool import pool_attributes
from anychip.backends.npu_stub.passes._rewrite import (
    Names,
    attrs,
    constant,
    drop_dead,
    new_node,
)
from anychip.backends.npu_stub.passes.fuse_conv_activation import npu_conv_attributes
from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.base import fixed_point, round_limit
from anychip.ir.value import Value

__all__ = ["ConvertToNhwcPass", "TO_NHWC", "TO_NCHW"]

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
_POOLS = {"MaxPool": "max", "AveragePool": "average", "GlobalAveragePool": "global_average"}
_ELEMENTWISE = {"Relu", "Clip", "Sigmoid", "HardSwish", "Add", "Mul", "Sum"}


def _perm(node: Node) -> tuple[int, ...] | None:
    if node is None or node.op_type != "Transpose" or node.domain:
        return None
    return tuple(int(p) for p in node.attr("perm") or ())


def _nhwc_shape(shape: tuple) -> tuple:
    return tuple(shape[i] for i in TO_NHWC)


class ConvertToNhwcPass(Pass):
    """Change the data layout of NPU convolutions and pools to NHWC (module docstring)."""

    name = "convert_to_nhwc"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        self._names = Names(graph)
        self._opset = max((n.version or 1 for n in graph.nodes if not n.domain), default=13)
        modified = False
        for node in list(graph.nodes):
            if self._convertible(node):
                self._convert(graph, node)
                modified = True
        if modified:
            fixed_point(
                self.name,
                lambda: self._push(graph) | self._cancel(graph) | drop_dead(graph),
                round_limit(graph),
            )
        graph.sort()
        return PassResult(graph, modified)

    # -- 1. convert ------------------------------------------------------------------------
    @staticmethod
    def _convertible(node: Node) -> bool:
        x = node.inputs[0] if node.inputs else None
        if x is None or x.shape is None or len(x.shape) != 4 or not x.is_static:
            return False
        if node.domain == "anychip":
            return node.op_type in ("NpuConv", "NpuPool") and node.attr("layout") == "NCHW"
        return not node.domain and (node.op_type == "Conv" or node.op_type in _POOLS)

    def _convert(self, graph: Graph, node: Node) -> None:
        x, y = node.inputs[0], node.outputs[0]
        if node.op_type in ("Conv", "NpuConv"):
            op, attributes = "NpuConv", npu_conv_attributes(node, "NHWC")
        elif node.op_type == "NpuPool":
            op, attributes = "NpuPool", {**node.attributes, **attrs(layout="NHWC")}
        else:
            geo = pool_attributes(node, _POOLS[node.op_type], tuple(x.shape[2:4]))
            geo.pop("out_hw", None)
            if "kernel" in geo:
                geo["kernel_shape"] = geo.pop("kernel")
            op, attributes = "NpuPool", attrs(**geo, layout="NHWC")
        index = graph.nodes.index(node)
        x_nhwc = self._transpose(graph, node, x, TO_NHWC, index)
        y_nhwc = Value(self._names.fresh(f"{y.name}_nhwc"), y.dtype, _nhwc_shape(y.shape))
        ins = [x_nhwc, *node.inputs[1:]]
        graph.remove(node)
        new = new_node(node, op, ins, [y_nhwc], attributes, domain="anychip", version=1)
        graph.insert(index + 1, new)
        self._transpose(graph, node, y_nhwc, TO_NCHW, index + 2, out=y)

    def _transpose(
        self, graph: Graph, like: Node, x: Value, perm: tuple, index: int, out: Value | None = None
    ) -> Value:
        if out is None:
            shape = tuple(x.shape[i] for i in perm)
            out = Value(
                self._names.fresh(f"{x.name}_{'nhwc' if perm == TO_NHWC else 'nchw'}"),
                x.dtype,
                shape,
            )
        t = new_node(
            like,
            "Transpose",
            [x],
            [out],
            attrs(perm=list(perm)),
            version=self._opset,
            name=f"{like.name}/{'to_nhwc' if perm == TO_NHWC else 'to_nchw'}",
        )
        graph.insert(index, t)
        return out

    # -- 2. push NHWC->NCHW transposes below elementwise ops --------------------------------
    def _push(self, graph: Graph) -> bool:
        changed = False
        for node in list(graph.nodes):
            if node.graph is not graph or node.domain or node.op_type not in _ELEMENTWISE:
                continue
            y = node.outputs[0]
            if y.shape is None or len(y.shape) != 4:
                continue
            fixed = (1, 2) if node.op_type == "Clip" else ()
            # Constants are permuted only once the move is sure: a permuted constant made for
            # a node that then stays (its data input not a Transpose) died at once, and the
            # dead node dropped counted as a change, round after round (Mul(const, x) with
            # the constant first, ConvNeXt's layer norm: issue 47).
            new_inputs: list[Value | np.ndarray | None] = []
            data = 0
            for i, v in enumerate(node.inputs):
                if v is None or i in fixed:
                    new_inputs.append(v)
                elif v.const is not None:
                    if v.const.ndim > 4:
                        break
                    c = v.const.reshape((1,) * (4 - v.const.ndim) + v.const.shape)
                    if v.const.ndim == 0 or c.shape == (1, 1, 1, 1):
                        new_inputs.append(v)
                    else:
                        new_inputs.append(c.transpose(TO_NHWC))
                else:
                    t = v.producer
                    if _perm(t) != TO_NCHW or not self._all_users_follow(v, graph):
                        break
                    new_inputs.append(t.inputs[0])
                    data += 1
            else:
                if data:
                    made = [
                        constant(graph, self._names, f"{v.name}_nhwc", p)
                        if isinstance(p, np.ndarray)
                        else p
                        for v, p in zip(node.inputs, new_inputs, strict=True)
                    ]
                    self._move_below(graph, node, made)
                    changed = True
        return changed

    @staticmethod
    def _all_users_follow(v: Value, graph: Graph) -> bool:
        """True when every reader of ``v`` can take NHWC too (an elementwise op, or a
        Transpose back to NHWC), so the Transpose producing ``v`` dies once all are moved."""
        if v in graph.outputs:
            return False
        for user, _ in v.uses:
            if user.domain or not (user.op_type in _ELEMENTWISE or _perm(user) == TO_NHWC):
                return False
        return True

    def _move_below(self, graph: Graph, node: Node, inputs: list[Value | None]) -> None:
        y = node.outputs[0]
        index = graph.nodes.index(node)
        y_nhwc = Value(self._names.fresh(f"{y.name}_nhwc"), y.dtype, _nhwc_shape(y.shape))
        graph.remove(node)
        new = new_node(
            node, node.op_type, inputs, [y_nhwc], dict(node.attributes), domain=node.domain
        )
        graph.insert(index, new)
        self._transpose(graph, node, y_nhwc, TO_NCHW, index + 1, out=y)

    # -- 3. cancel inverse pairs ------------------------------------------------------------
    @staticmethod
    def _cancel(graph: Graph) -> bool:
        changed = False
        for node in list(graph.nodes):
            outer = _perm(node)
            if outer is None or node.graph is not graph:
                continue
            inner_node = node.inputs[0].producer
            inner = _perm(inner_node)
            if inner is None or len(inner) != len(outer):
                continue
            if tuple(inner[i] for i in outer) != tuple(range(len(outer))):
                continue
            y = node.outputs[0]
            if y in graph.outputs:
                continue
            y.replace_all_uses_with(inner_node.inputs[0])
            graph.remove(node)
            changed = True
        return changed
