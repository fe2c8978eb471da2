"""Each convolution of a model in anychip's CPU session beside onnxruntime's, in execution
order, from both profilers (``Session.profile()``; onnxruntime's ``enable_profiling``).

    python bench/conv_pairs.py MODEL [--threads 2] [--runs 40] [--top 20]

``MODEL`` is any name of ``bench/cpu_models.py``. The i-th Conv of one engine is paired with
the i-th of the other: right for chains (MobileNet), not where onnxruntime turns other nodes
into convolutions (DenseNet's BatchNormalization) or runs branches in another order (ResNet's
projections); the sums are right either way. Medians over the runs, microseconds.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

__all__ = ["onnxruntime_ordered", "main"]


def onnxruntime_ordered(path: str, feeds: dict, runs: int, threads: int) -> list[tuple]:
    """onnxruntime's nodes in execution order: (name, op, median seconds per run)."""
    from node_gaps import onnxruntime_nodes

    nodes = onnxruntime_nodes(path, feeds, runs, threads)
    return [(name, op, t) for name, (op, t) in nodes.items()]


def _describe(model: object) -> dict[str, str]:
    """Each Conv node's input, weight shapes, strides and group, by node name."""
    from onnx import helper, shape_inference

    inferred = shape_inference.infer_shapes(model)
    g = inferred.graph
    dims = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in list(g.value_info) + list(g.input)
    }
    inits = {i.name: list(i.dims) for i in g.initializer}
    out = {}
    for n in g.node:
        if n.op_type == "Conv":
            a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
            out[n.name] = (
                f"x={dims.get(n.input[0])} w={inits.get(n.input[1])} "
                f"s={a.get('strides')} g={a.get('group', 1)}"
            )
    return out


def main(argv: list[str] | None = None) -> None:
    from node_gaps import both, parse

    args = parse(__doc__, argv, runs=40, top=20)
    model, ours, theirs = both(args.model, args.threads, args.runs, onnxruntime_ordered)
    where = {n.name: i for i, n in enumerate(model.graph.node)}
    described = _describe(model)
    convs = [(k, t) for k, (op, t) in ours.items() if op in ("Conv", "FusedConv")]
    convs.sort(key=lambda kt: where.get(kt[0].split("+")[0], len(where)))
    peer = [(n, t) for n, op, t in theirs if op in ("Conv", "FusedConv")]
    print(f"{len(convs)} convolutions here, {len(peer)} in onnxruntime")
    print(f"sum: anychip {sum(t for _, t in convs) * 1e6:.0f} us, "
          f"onnxruntime {sum(t for _, t in peer) * 1e6:.0f} us")  # fmt: skip
    rows = [(a - b, ka, kb, a, b) for (ka, a), (kb, b) in zip(convs, peer)]
    for _, ka, kb, a, b in sorted(rows, reverse=True)[: args.top]:
        desc = described.get(ka.split("+")[0], "")
        print(f"{ka:24s} {kb:20s} {a * 1e6:7.0f} {b * 1e6:7.0f} {a / b:5.2f} {desc}")


if __name__ == "__main__":
    main()
