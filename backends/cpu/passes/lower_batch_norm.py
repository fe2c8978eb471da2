"""``LowerBatchNormPass``: an inference BatchNormalization that no convolution absorbed becomes
``Mul`` by its per-channel scale and ``Add`` of its shift, so the element-wise fusion that
runs next takes it into the same pass over memory as its neighbours (DenseNet's
Concat -> BatchNormalization -> Relu -> Conv: 62 of them in DenseNet-121, each two numpy
passes, then a third for the Relu).

The constants come from the CPU kernel's own function
(``kernels/op_batch_normalization.inference_constants``: ``a = scale / sqrt(var + epsilon)``,
``shift = bias - mean * a``, in the input's dtype), and ``x * a + shift`` rounds each step
as it does: the fused result is bit-identical.

Fires on a default-domain BatchNormalization of a float32/float64 input of known rank >= 2
with one output (the inference form: no running statistics asked for), ``training_mode`` 0,
``spatial`` 1, and constant scale, bias, mean and variance of one value per channel.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels.op_batch_normalization import inference_constants
from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import FLOATS, Names, constant, new_node, record
from anychip.ir.value import Value

__all__ = ["LowerBatchNormPass"]


def _constants(bn: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """``(a, shift)`` in the input's dtype, shaped ``[C, 1, ...]``, or None."""
    if bn.domain or bn.op_type != "BatchNormalization" or len(bn.outputs) != 1:
        return None
    x = bn.inputs[0]
    if len(bn.inputs) != 5 or x is None or x.dtype not in FLOATS or x.shape is None:
        return None
    if len(x.shape) < 2 or bn.attr("training_mode", 0) or not bn.attr("spatial", 1):
        return None
    stats = [v.const if v is not None else None for v in bn.inputs[1:]]
    c = x.shape[1]
    if any(s is None or s.ndim != 1 or s.shape[0] != c for s in stats) or not isinstance(c, int):
        return None
    dt = np.dtype(np.float32) if x.dtype == 1 else np.dtype(np.float64)
    a, shift = inference_constants(*stats, float(bn.attr("epsilon", 1e-5)), dt)
    shape = (c,) + (1,) * (len(x.shape) - 2)
    return a.reshape(shape), shift.reshape(shape)


class LowerBatchNormPass(Pass):
    """BatchNormalization in inference form -> Mul, Add (for the element-wise fusion)."""

    name = "lower_batch_norm"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        names, fired = Names(graph), 0
        for bn in list(graph.nodes):
            found = _constants(bn) if bn.graph is graph else None
            if found is None:
                continue
            a, shift = found
            x, y = bn.inputs[0], bn.outputs[0]
            stem = bn.name or "bn"
            mid = Value(names.fresh(f"{stem}_scaled"), y.dtype, y.shape)
            mul = new_node(bn, "Mul", [x, constant(graph, names, f"{stem}_a", a)], [mid], {})
            add = new_node(bn, "Add", [mid, constant(graph, names, f"{stem}_b", shift)], [y], {})
            index = graph.nodes.index(bn)
            graph.remove(bn)
            graph.insert(index, add)
            graph.insert(index, mul)
            fired += 1
        record(graph, self.name, fired)
        return PassResult(graph, fired > 0)
