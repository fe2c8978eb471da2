"""``FuseConvPass``: Conv [+ bias Add] [+ residual Add] [+ activation] becomes
``com.microsoft::FusedConv(X, W, B, Z)`` with ``activation``/``activation_params``, the
signature onnxruntime's graph optimizer writes: ``Y = activation(conv(X, W, B) + Z)``.

Fires when at least one of the three follows the Conv, each intermediate has one reader and
is not a graph output, and:

* the bias Add's other input is a float constant of ``C`` elements laid out along the
  channel axis (``[C, 1, 1]`` or ``[1, C, 1, 1]``); it is added to the Conv's own bias;
* the residual Add's (or two-input Sum's) other input has the Conv output's static shape (no
  broadcasting);
* the activation is Relu, Tanh, Sigmoid, LeakyRelu, HardSigmoid, or Clip with constant
  bounds (the activations FusedConv's kernels compute);
* the CPU's FusedConv kernel is a fast one (``require_fast_kernel``): the numpy kernel
  (``kernels/op_contrib_conv.py``) computes the conv, then the sum, then the activation, each
  into a new array, where the unfused nodes write into planned memory and in place; measured
  on the light models it made ResNet-50 0.77x and Inception-v1 0.60x as fast
  (``bench/fusion.py``). A kernel registered for FusedConv by another module (oneDNN's, with
  the sum and activation as post-ops) turns the pass on.

A Conv with none of the three after it becomes a FusedConv too (``FuseConvPass.lone``) when
some node reads it and it is not a graph output: a Conv's planned output is NCHW, where a
FusedConv's is left to its kernel, which keeps it channels-last for oneDNN readers. ResNet's
projection convolutions, read as the residual ``Z`` of the next FusedConv, paid a reorder
into NCHW and one back (its 53 convolutions at two threads: 52.9 -> 44.1 ms in the session,
``bench/conv_pairs.py resnet50``). Same results (the kernel is the same oneDNN convolution).
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.passes._common import fast_kernel
from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import (
    Names,
    attrs,
    constant,
    fused_node,
    record,
    replace_chain,
    scalar_const,
    single_use,
)
from anychip.ir.value import Value
from anychip.opsets.com_microsoft import MS_DOMAIN

__all__ = ["FuseConvPass", "activation_of", "fast_fused_conv"]

_PLAIN = ("Relu", "Tanh", "Sigmoid")


def activation_of(node: Node) -> tuple[str, list[float]] | None:
    """``(activation, params)`` of an activation node FusedConv/FusedGemm can take, or None."""
    if node.domain:
        return None
    op = node.op_type
    if op in _PLAIN:
        return op, []
    if op == "LeakyRelu":
        return op, [float(node.attr("alpha", 0.01))]
    if op == "HardSigmoid":
        return op, [float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5))]
    if op == "Clip":
        if "min" in node.attributes or "max" in node.attributes or (node.version or 11) < 11:
            lo, hi = node.attr("min", None), node.attr("max", None)
        else:
            ins = list(node.inputs) + [None, None]
            lo, hi = scalar_const(ins[1]), scalar_const(ins[2])
            for v, got in ((ins[1], lo), (ins[2], hi)):
                if v is not None and got is None:
                    return None
        lo = -np.inf if lo is None else float(lo)
        hi = np.inf if hi is None else float(hi)
        return op, [float(np.float32(lo)), float(np.float32(hi))]
    return None


def _only_reader(v: Value, graph: Graph) -> Node | None:
    if not single_use(v, graph):
        return None
    node = v.uses[0][0]
    return node if node.graph is graph else None


def _channel_bias(add: Node, y: Value, channels: int) -> np.ndarray | None:
    other = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    c = other.const if other is not None else None
    if c is None or c.dtype != np.float32 or c.size != channels or c.ndim > len(y.shape or ()):
        return None
    shape = (1,) * (len(y.shape) - c.ndim) + c.shape
    if shape[1] != channels:
        return None
    return c.reshape(channels)


def _residual(add: Node, y: Value) -> Value | None:
    other = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    if other is None or other.const is not None or other is y:
        return None
    shape = y.shape
    if shape is None or other.shape != shape or not all(isinstance(d, int) for d in shape):
        return None
    return other if other.dtype == y.dtype else None


def _is_add(node: Node) -> bool:
    """Add, or Sum of two inputs (ResNet-50 v1's residuals): the same ``a + b``."""
    if node.domain:
        return False
    return node.op_type == "Add" or (node.op_type == "Sum" and len(node.inputs) == 2)


def fast_fused_conv() -> bool:
    """Whether the CPU's FusedConv kernel is fast (``_common.fast_kernel``)."""
    from anychip.backends.cpu.kernels import op_contrib_conv

    return fast_kernel(MS_DOMAIN, "FusedConv", op_contrib_conv.fused_conv)


class FuseConvPass(Pass):
    """Fuse a Conv with its bias Add, residual Add and activation into FusedConv."""

    name = "fuse_conv"
    #: Fire only when ``fast_fused_conv()`` (the tests set it False to test the rewrite).
    require_fast_kernel = True
    #: A Conv with nothing to fuse becomes a FusedConv too: its output is then unplanned, so
    #: it stays channels-last for oneDNN readers.
    lone = True

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        if not any(n.op_type == "Conv" and not n.domain for n in graph.nodes):
            return PassResult(graph, False)  # before asking oneDNN (its library's load)
        if self.require_fast_kernel and not fast_fused_conv():
            return PassResult(graph, False)
        fired = 0
        names = Names(graph)
        for conv in list(graph.nodes):
            if conv.domain or conv.op_type != "Conv" or conv.graph is not graph:
                continue
            if self._fuse(conv, graph, names):
                fired += 1
        record(graph, self.name, fired)
        return PassResult(graph, fired > 0)

    def _fuse(self, conv: Node, graph: Graph, names: Names) -> bool:
        y, w = conv.outputs[0], conv.inputs[1]
        if y.dtype != 1 or w.shape is None or y.shape is None:
            return False
        bias = conv.inputs[2] if len(conv.inputs) > 2 else None
        bias_add = z = act = residual = None
        tail, nxt = y, _only_reader(y, graph)
        extra = None
        if nxt is not None and nxt.op_type == "Add" and not nxt.domain:
            extra = _channel_bias(nxt, tail, int(w.shape[0]))
            if extra is not None and (bias is None or bias.const is not None):
                bias_add, tail = nxt, nxt.outputs[0]
                nxt = _only_reader(tail, graph)
        if nxt is not None and _is_add(nxt):
            z = _residual(nxt, tail)
            if z is not None:
                residual, tail = nxt, nxt.outputs[0]
                nxt = _only_reader(tail, graph)
        found = activation_of(nxt) if nxt is not None else None
        if found is not None:
            act, tail = nxt, nxt.outputs[0]
        if bias_add is None and z is None and act is None:
            if not self.lone or y in graph.outputs or not y.uses:
                return False
        if bias_add is not None:
            total = extra if bias is None else bias.const.reshape(-1) + extra
            bias = constant(graph, names, f"{conv.name or 'conv'}_bias", total.astype(np.float32))
        a = {k: v for k, v in conv.attributes.items()}
        if act is not None:
            a.update(attrs(activation=found[0]))
            if found[1]:
                a.update(attrs(activation_params=[float(p) for p in found[1]]))
        inputs = [conv.inputs[0], w, bias, z]
        while inputs[-1] is None:
            inputs.pop()
        chain = [n for n in (conv, bias_add, residual, act) if n is not None]
        fused = fused_node(
            conv, "FusedConv", inputs, [tail], a, domain="com.microsoft", version=1,
            name=f"{conv.name}+fused" if conv.name else "",
        )  # fmt: skip
        replace_chain(graph, chain, fused)
        return True
