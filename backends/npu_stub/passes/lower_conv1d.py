"""``LowerConv1dPass``: a 1-D Conv becomes the NPU's 2-D ``NpuConv`` over a unit height.

``Conv(x[N, C, L], w[M, C/g, K])`` is ``NpuConv(x[N, C, 1, L], w[M, C/g, 1, K])`` with
kernel ``[1, K]``, strides ``[1, s]``, dilations ``[1, d]`` and pads ``[0, b, 0, e]``
(``auto_pad`` resolved on the static length), between two Reshapes; a constant ``w`` is
reshaped once here, a computed one by a third Reshape. The 2-D conv then goes NHWC like any
other (``convert_to_nhwc``); every piece runs on the NPU. Runs first among the NPU's passes,
so a 1-D conv is fused, folded and laid out as a 2-D one.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.npu_stub.kernels.geometry import explicit_pads
from anychip.backends.npu_stub.passes._rewrite import Names, attrs, constant, new_node
from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.value import Value

__all__ = ["LowerConv1dPass", "conv1d_as_2d"]


def conv1d_as_2d(node: Node, length: int, kernel_len: int) -> dict:
    """The 2-D ``NpuConv`` attributes (NCHW) of 1-D Conv ``node`` over ``length``."""
    kernel = [int(k) for k in (node.attr("kernel_shape") or [kernel_len])]
    strides = [int(s) for s in (node.attr("strides") or [1])]
    dilations = [int(d) for d in (node.attr("dilations") or [1])]
    pads = node.attr("pads")
    begin, end = explicit_pads(
        [length], kernel, strides, dilations, node.attr("auto_pad", "NOTSET"), pads or [0, 0]
    )
    return attrs(
        kernel_shape=[1, kernel[0]],
        pads=[0, begin, 0, end],
        strides=[1, strides[0]],
        dilations=[1, dilations[0]],
        group=int(node.attr("group", 1)),
        activation="",
        layout="NCHW",
    )


class LowerConv1dPass(Pass):
    """Rewrite every 1-D Conv of the partition as a 2-D ``NpuConv`` (module docstring)."""

    name = "lower_conv1d"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        names = Names(graph)
        modified = False
        for node in list(graph.nodes):
            x = node.inputs[0] if node.inputs else None
            if node.domain or node.op_type != "Conv" or x is None or x.shape is None:
                continue
            if len(x.shape) == 3 and x.is_static and node.inputs[1].is_static:
                self._lower(graph, node, names)
                modified = True
        return PassResult(graph, modified)

    @staticmethod
    def _lower(graph: Graph, conv: Node, names: Names) -> None:
        x, w, y = conv.inputs[0], conv.inputs[1], conv.outputs[0]
        bias = list(conv.inputs[2:3])
        n, c, length = (int(d) for d in x.shape)
        m, cg, k = (int(d) for d in w.shape)
        index = graph.nodes.index(conv)
        made: list[Node] = []

        def reshape(v: Value, shape: tuple, out: Value | None = None) -> Value:
            target = constant(graph, names, f"{v.name}_shape4", np.array(shape, np.int64))
            out = out or Value(names.fresh(f"{v.name}_4d"), v.dtype, tuple(shape))
            made.append(
                new_node(conv, "Reshape", [v, target], [out], {}, name=f"{conv.name}/{v.name}")
            )
            return out

        x4 = reshape(x, (n, c, 1, length))
        if w.const is not None:
            w4 = constant(graph, names, f"{w.name}_4d", w.const.reshape(m, cg, 1, k))
        else:
            w4 = reshape(w, (m, cg, 1, k))
        out_len = int(y.shape[2])
        y4 = Value(names.fresh(f"{y.name}_4d"), y.dtype, (n, m, 1, out_len))
        attributes = conv1d_as_2d(conv, length, k)
        made.append(
            new_node(
                conv, "NpuConv", [x4, w4, *bias], [y4], attributes, domain="anychip", version=1
            )
        )
        graph.remove(conv)
        reshape(y4, (n, m, out_len), out=y)
        for offset, node in enumerate(made):
            graph.insert(index + offset, node)
