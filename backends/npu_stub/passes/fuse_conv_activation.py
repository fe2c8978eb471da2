"""``FuseConvActivationPass``: Conv -> Relu / Clip becomes one ``anychip::NpuConv``.

The activation is applied to the convolution's result while it is still in the NPU's
accumulators, so the intermediate tensor never reaches memory. Fused only when the activation
is the convolution's only reader and Clip's bounds are constants.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.npu_stub.kernels.op_conv import conv_attributes
from anychip.backends.npu_stub.kernels.support import opset_of
from anychip.backends.npu_stub.passes._rewrite import attrs, new_node, single_use
from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult

__all__ = ["FuseConvActivationPass", "npu_conv_attributes"]


def npu_conv_attributes(conv: Node, layout: str, activation: str = "", params=()) -> dict:
    """``NpuConv`` attributes equivalent to Conv/NpuConv ``conv`` (explicit pads)."""
    if conv.op_type == "NpuConv":
        out = dict(conv.attributes)
        if activation:
            out.update(attrs(activation=activation))
            if params:
                out.update(attrs(activation_params=[float(p) for p in params]))
        out.update(attrs(layout=layout))
        return out
    x = conv.inputs[0]
    geo = conv_attributes(conv, tuple(x.shape[2:4]), conv.inputs[1].shape)
    out = attrs(
        kernel_shape=geo["kernel"],
        pads=geo["pads"],
        strides=geo["strides"],
        dilations=geo["dilations"],
        group=geo["group"],
        activation=activation,
        layout=layout,
    )
    if params:
        out.update(attrs(activation_params=[float(p) for p in params]))
    return out


def _clip_bounds(node: Node) -> tuple[float, float] | None:
    if opset_of(node) < 11:
        return float(node.attr("min", -np.inf)), float(node.attr("max", np.inf))
    bounds = []
    for i, default in ((1, -np.inf), (2, np.inf)):
        v = node.inputs[i] if i < len(node.inputs) else None
        if v is not None and v.const is None:
            return None
        bounds.append(default if v is None else float(v.const))
    return bounds[0], bounds[1]


class FuseConvActivationPass(Pass):
    """Fuse a Relu or Clip into the convolution that feeds it."""

    name = "fuse_conv_activation"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        modified = False
        for act in list(graph.nodes):
            if act.domain or act.op_type not in ("Relu", "Clip") or act.graph is not graph:
                continue
            x = act.inputs[0]
            conv = x.producer
            if conv is None or conv.graph is not graph or not single_use(x, graph):
                continue
            if (conv.domain, conv.op_type) not in (("", "Conv"), ("anychip", "NpuConv")):
                continue
            if conv.attr("activation", "") or len(conv.inputs[0].shape or ()) != 4:
                continue
            params: tuple = ()
            if act.op_type == "Clip":
                bounds = _clip_bounds(act)
                if bounds is None:
                    continue
                params = bounds
            layout = conv.attr("layout", "NCHW")
            attributes = npu_conv_attributes(conv, layout, act.op_type, params)
            index = graph.nodes.index(conv)
            y = act.outputs[0]
            graph.remove(act)
            fused = new_node(
                conv,
                "NpuConv",
                list(conv.inputs),
                [y],
                attributes,
                domain="anychip",
                version=1,
                name=f"{conv.name}+{act.op_type}" if conv.name else "",
            )
            graph.remove(conv)
            graph.insert(index, fused)
            modified = True
        return PassResult(graph, modified)
