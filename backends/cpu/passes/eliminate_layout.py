"""``EliminateTransposeReshapePass``: layout ops that do nothing or undo each other.

* Transpose of a Transpose (the inner one read only there) becomes one Transpose with the
  composed permutation, and disappears when that is the identity;
* Reshape of a Reshape (the inner one read only there) reads the inner one's input: a Reshape
  only looks at its input's element count and order (``allowzero`` never set on either, since
  a 0 in the outer shape would copy a dimension of the inner result);
* a Reshape, Transpose or Squeeze/Unsqueeze/Flatten whose static input and output shapes are
  equal (Transpose: identity permutation) is removed: its readers read its input. Not when its
  output is a graph output or its input a graph input that is also an output;
* a Cast to its input's own type (skl2onnx starts most models with a Cast to float of a float
  input) goes the same way: it only copies;
* so do Identity and an inference Dropout (no ``training_mode``, or a constant false one;
  ``is_test`` set in opsets 1-6; its mask unread): SqueezeNet's Dropout sat between a channel
  Concat and the last convolution, so the Concat wrote NCHW for it and the convolution
  reordered it (onnxruntime removes both the same way).
"""

from __future__ import annotations

from anychip.ir.dtypes import DType
from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import attrs, fused_node, producer, record, single_use

__all__ = ["EliminateTransposeReshapePass"]

_SHAPE_OPS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten")


def _static(shape: tuple | None) -> bool:
    return shape is not None and all(isinstance(d, int) and d >= 0 for d in shape)


def _perm(node: Node) -> list[int] | None:
    shape = node.inputs[0].shape
    perm = node.attr("perm", None)
    if perm is None:
        return None if shape is None else list(range(len(shape)))[::-1]
    return [int(p) for p in perm]


def _bypass(node: Node, graph: Graph) -> bool:
    """Readers of ``node``'s output read its input; ``node`` is removed."""
    x, y = node.inputs[0], node.outputs[0]
    if y in graph.outputs:
        return False
    for user, i in list(y.uses):
        user.replace_input(i, x)
    graph.remove(node)
    return True


class EliminateTransposeReshapePass(Pass):
    """Compose or cancel Transposes, collapse Reshapes, drop identity layout ops."""

    name = "eliminate_transpose_reshape"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        fired = 0
        for node in list(graph.nodes):
            if node.graph is not graph or node.domain:
                continue
            if node.op_type == "Transpose":
                fired += self._transpose(node, graph)
            elif node.op_type == "Reshape":
                fired += self._reshape(node, graph)
            if node.graph is graph and node.op_type in _SHAPE_OPS + ("Transpose",):
                fired += self._identity(node, graph)
            elif node.op_type == "Cast":
                fired += self._same_type_cast(node, graph)
            elif node.op_type in ("Identity", "Dropout"):
                fired += self._pass_through(node, graph)
        record(graph, self.name, fired)
        return PassResult(graph, fired > 0)

    def _transpose(self, node: Node, graph: Graph) -> int:
        inner = producer(node.inputs[0], graph, "Transpose")
        if inner is None or not single_use(inner.outputs[0], graph):
            return 0
        p1, p2 = _perm(inner), _perm(node)
        if p1 is None or p2 is None or len(p1) != len(p2):
            return 0
        composed = [p1[i] for i in p2]
        if composed == list(range(len(composed))) and node.outputs[0] not in graph.outputs:
            for user, i in list(node.outputs[0].uses):  # they cancel
                user.replace_input(i, inner.inputs[0])
            graph.remove(node)
            graph.remove(inner)
            return 1
        index = graph.nodes.index(node)
        fused = fused_node(node, "Transpose", [inner.inputs[0]], [node.outputs[0]], {})
        fused.attributes.update(attrs(perm=composed))
        graph.remove(node)
        graph.remove(inner)
        graph.insert(index - 1, fused)
        return 1

    def _reshape(self, node: Node, graph: Graph) -> int:
        inner = producer(node.inputs[0], graph, "Reshape")
        if inner is None or not single_use(inner.outputs[0], graph):
            return 0
        if node.attr("allowzero", 0) or inner.attr("allowzero", 0):
            return 0
        shape = node.inputs[1].const if len(node.inputs) > 1 else None
        if shape is None or (shape == 0).any():
            return 0
        node.replace_input(0, inner.inputs[0])
        graph.remove(inner)
        return 1

    def _identity(self, node: Node, graph: Graph) -> int:
        x, y = node.inputs[0], node.outputs[0]
        if not _static(x.shape) or x.shape != y.shape or x.dtype != y.dtype:
            return 0
        if node.op_type == "Transpose" and _perm(node) != list(range(len(x.shape))):
            return 0
        if x in graph.outputs:
            return 0
        return int(_bypass(node, graph))

    def _pass_through(self, node: Node, graph: Graph) -> int:
        """An Identity, or a Dropout that is one in inference."""
        x = node.inputs[0] if node.inputs else None
        if x is None or not x.is_tensor or x in graph.outputs:
            return 0
        if node.op_type == "Dropout":
            if any(v is not None and (v.uses or v in graph.outputs) for v in node.outputs[1:]):
                return 0  # the mask is read
            training = node.inputs[2] if len(node.inputs) > 2 else None
            if training is not None and (training.const is None or bool(training.const.any())):
                return 0  # training mode, or not known to be off
            if (node.version or 7) < 7 and not node.attr("is_test", 0):
                return 0  # opsets 1-6 train unless is_test is set
        return int(_bypass(node, graph))

    def _same_type_cast(self, node: Node, graph: Graph) -> int:
        x = node.inputs[0]
        to = node.attr("to", None)
        if not isinstance(to, int) or x.dtype == DType.UNDEFINED or x.dtype != to:
            return 0
        if not x.is_tensor or x in graph.outputs:
            return 0
        return int(_bypass(node, graph))
