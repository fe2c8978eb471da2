"""``FoldPadIntoConvPass``: a zero Pad in front of a Conv or an AveragePool becomes its own
padding.

Fires when the Pad is ``constant`` mode with value 0 (absent or a constant), its pads are
constant, non-negative and zero on the batch and channel axes, its output is read only by
the Conv or AveragePool (as ``X``), and that has ``auto_pad=NOTSET``. Its ``pads`` (begins
then ends, spatial axes) grow by the Pad's. An AveragePool then counts the padding
(``count_include_pad=1``, as the zeros were counted), so it must have counted its own or had
none. MaxPool is left alone: it pads with -inf, not zeros.
"""

from __future__ import annotations

from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import attrs, producer, record, scalar_const, single_use

__all__ = ["FoldPadIntoConvPass"]


def _pad_amounts(pad: Node) -> list[int] | None:
    """The Pad's ``pads`` when it is a zero constant pad over all axes, else None."""
    if pad.attr("mode", "constant") != "constant":
        return None
    if "pads" in pad.attributes:  # opset < 11
        if float(pad.attr("value", 0.0)) != 0.0:
            return None
        return [int(p) for p in pad.attr("pads")]
    ins = list(pad.inputs) + [None, None, None]
    if ins[3] is not None or ins[1] is None or ins[1].const is None:
        return None  # axes given: leave it
    if ins[2] is not None and scalar_const(ins[2]) != 0.0:
        return None
    return [int(p) for p in ins[1].const.reshape(-1)]


class FoldPadIntoConvPass(Pass):
    """Fold a zero Pad into the Conv or AveragePool that reads it."""

    name = "fold_pad_into_conv"

    @staticmethod
    def _counts_pads(node: Node) -> bool:
        if node.op_type == "Conv":
            return True
        return node.attr("count_include_pad", 0) == 1 or not any(node.attr("pads", None) or [])

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        fired = 0
        for conv in list(graph.nodes):
            if conv.graph is not graph or conv.domain:
                continue
            if conv.op_type not in ("Conv", "AveragePool") or not self._counts_pads(conv):
                continue
            pad = producer(conv.inputs[0], graph, "Pad")
            if pad is None or not single_use(pad.outputs[0], graph):
                continue
            if conv.attr("auto_pad", "NOTSET") != "NOTSET":
                continue
            amounts = _pad_amounts(pad)
            rank = len(conv.inputs[0].shape or ())
            if amounts is None or rank < 3 or len(amounts) != 2 * rank or min(amounts) < 0:
                continue
            begins, ends = amounts[:rank], amounts[rank:]
            if begins[:2] != [0, 0] or ends[:2] != [0, 0]:
                continue
            spatial = rank - 2
            old = conv.attr("pads", None) or [0] * (2 * spatial)
            new = [old[i] + begins[2 + i] for i in range(spatial)]
            new += [old[spatial + i] + ends[2 + i] for i in range(spatial)]
            conv.attributes.update(attrs(pads=new))
            if conv.op_type == "AveragePool":
                conv.attributes.update(attrs(count_include_pad=1))
            conv.replace_input(0, pad.inputs[0])
            graph.remove(pad)
            fired += 1
        record(graph, self.name, fired)
        return PassResult(graph, fired > 0)
