"""The measurements behind ``core/plan/calibration.py``: one-node models per op class, run on the
device alone through ``anychip.load``, and host-link round trips.

A probe's time is the run's best time minus the copies of its inputs and outputs over the
measured link, so a node's figure is the device's own work plus the runtime's per-run cost
(which every device pays alike). Inputs are random (seeded); sizes are small enough that a
whole calibration takes a second or two on a CPU.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from anychip.core.logsetup import quiet_fallbacks
from anychip.errors import AnychipError

__all__ = [
    "measure_class",
    "measure_launch",
    "measure_link",
    "PROBES",
    "OP_PROBES",
]

log = logging.getLogger("anychip.calibration")

#: How a probe model becomes a session on one device: ``open_probe(model, device)``. The
#: session layer (``core/api/session.py``) installs it when it is imported; calibration sits
#: below the session and never imports it.
open_probe: Any = None


def set_probe_opener(fn: Any) -> None:
    """Install the function that loads a probe model on one device (``core/api`` calls it)."""
    global open_probe
    open_probe = fn


F = 1  # onnx.TensorProto.FLOAT


def _model(
    op: str,
    shapes: list[list[int]],
    out: list[int],
    weight: np.ndarray | None = None,
    opset: int = 13,
    **attrs: Any,
) -> bytes:
    """A one-node model of ``op`` on inputs of ``shapes`` (and the constant ``weight`` as its
    last operand, when given)."""
    from onnx import helper, numpy_helper

    names = [f"x{i}" for i in range(len(shapes))]
    inputs = [helper.make_tensor_value_info(n, F, s) for n, s in zip(names, shapes)]
    y = helper.make_tensor_value_info("y", F, out)
    inits = [] if weight is None else [numpy_helper.from_array(weight, "w")]
    node = helper.make_node(op, names + [i.name for i in inits], ["y"], **attrs)
    graph = helper.make_graph([node], f"probe_{op}", inputs, [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def _elementwise(n: int) -> tuple[bytes, float]:
    return _model("Add", [[n], [n]], [n]), float(n)


def _matmul(n: int) -> tuple[bytes, float]:
    return _model("MatMul", [[n, n], [n, n]], [n, n]), 2.0 * n**3


def _linear(n: int) -> tuple[bytes, float]:
    w = np.random.default_rng(n).standard_normal((n, n)).astype(np.float32)
    return _model("MatMul", [[n, n]], [n, n], weight=w), 2.0 * n**3


def _conv(c: int, hw: int) -> tuple[bytes, float]:
    m = _model("Conv", [[1, c, hw, hw], [c, c, 3, 3]], [1, c, hw, hw], pads=[1, 1, 1, 1])
    return m, 2.0 * c * c * 9 * hw * hw


def _reduce(rows: int) -> tuple[bytes, float]:
    return _model("Softmax", [[rows, 256]], [rows, 256], axis=-1), float(rows * 256)


def _data(n: int) -> tuple[bytes, float]:
    return _model("Transpose", [[n, n]], [n, n], perm=[1, 0]), float(n * n)


def _data_rows(m: int) -> tuple[bytes, float]:
    """Attention's head split: [4, m, 8, 32] -> [4, 8, m, 32], rows of 32 moved whole."""
    shape = [4, m, 8, 32]
    out = [4, 8, m, 32]
    return _model("Transpose", [shape], out, perm=[0, 2, 1, 3]), float(4 * m * 8 * 32)


def _attention(s: int, heads: int = 8, dh: int = 32, mask: bool = False) -> tuple[bytes, float]:
    """softmax(Q Kt * c [+ mask]) V on ``heads`` heads of ``dh`` at sequence ``s``: the nodes
    the backends fuse (``core/plan/cost_patterns.py``), so the figure is the fused kernel's
    (a masked chain may run unfused: GPT-like's took 6.36 ms on the XPU, the unmasked class
    read 0.40)."""
    shape = ((heads, s, dh), (heads, dh, s), (heads, s, dh), (s, s) if mask else None, "Mul")
    return _attention_model(shape), 2.0 * heads * s * s * (dh + dh)


def _attention_model(shape: tuple) -> bytes:
    """The attention chain on inputs of ``shape`` (Q, Kt, V, the mask or None, the scale's
    op): MatMul, scale, [Add of a constant mask], Softmax, MatMul."""
    from onnx import helper, numpy_helper

    q, kt, v, mask, scale_op = shape
    n = helper.make_node
    nodes = [n("MatMul", ["q", "kt"], ["s"]), n(scale_op, ["s", "c"], ["sc"])]
    dh = q[-1]
    consts = [numpy_helper.from_array(np.array(dh**-0.5, np.float32), "c")]
    if mask is not None:
        m = np.random.default_rng(1).standard_normal(mask).astype(np.float32)
        consts.append(numpy_helper.from_array(m, "mask"))
        nodes.append(n("Add", ["sc", "mask"], ["sm"]))
    nodes += [
        n("Softmax", [nodes[-1].output[0]], ["p"], axis=-1),
        n("MatMul", ["p", "v"], ["y"]),
    ]
    shapes = {"q": list(q), "kt": list(kt), "v": list(v)}
    inputs = [helper.make_tensor_value_info(k, F, d) for k, d in shapes.items()]
    batch = np.broadcast_shapes(tuple(q[:-2]), tuple(kt[:-2]), tuple(v[:-2]))
    y = helper.make_tensor_value_info("y", F, [*batch, q[-2], v[-1]])
    graph = helper.make_graph(nodes, "probe_attention", inputs, [y], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


#: class -> probes (model bytes, work) at three sizes.
PROBES = {
    "elementwise": [lambda n=n: _elementwise(n) for n in (4096, 65536, 1 << 20)],
    "matmul": [lambda n=n: _matmul(n) for n in (32, 128, 256)],
    # up to 512: a transformer's layers are 0.1-1 GFLOP, far past 256's 34 MFLOP
    "linear": [lambda n=n: _linear(n) for n in (32, 128, 512)],
    "conv": [lambda c=c, hw=hw: _conv(c, hw) for c, hw in ((16, 16), (32, 32), (64, 28))],
    "reduce": [lambda r=r: _reduce(r) for r in (16, 256, 2048)],
    "data": [lambda n=n: _data(n) for n in (64, 256, 1024)],
    "data_rows": [lambda m=m: _data_rows(m) for m in (64, 256, 1024)],
    "attention": [lambda s=s: _attention(s) for s in (64, 256, 512)],
    "attention_mask": [lambda s=s: _attention(s, mask=True) for s in (64, 256, 512)],
}


_UNARY = ("Relu", "Neg", "Abs", "Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "Erf", "Reciprocal")
_BINARY = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min")


def _op_probe(op: str, n: int) -> tuple[bytes, float]:
    """A one-node model of ``op`` over ``n`` elements (LayerNormalization: rows of 256)."""
    if op == "LayerNormalization":
        rng = np.random.default_rng(n)
        w = rng.standard_normal(256).astype(np.float32)
        shape = [n // 256, 256]
        return _model(op, [shape], shape, weight=w, opset=17, axis=-1), float(n)
    if op == "Pow":  # as models write it: x ** 3 (GELU's tanh form), x ** 2
        return _model(op, [[n]], [n], weight=np.array(3.0, np.float32)), float(n)
    shapes = [[n]] if op in _UNARY else [[n], [n]]
    return _model(op, shapes, [n]), float(n)


#: Ops whose speed differs too much within their class (numpy's float32 power calls powf per
#: element, 100 times the time of an Add; Tanh is a SIMD loop on one device, libm on another):
#: each is measured on its own, on first use, at three sizes (elements).
OP_PROBES = {
    op: [lambda n=n, op=op: _op_probe(op, n) for n in (4096, 65536, 1 << 19)]
    for op in (*_UNARY, *_BINARY, "LayerNormalization")
}


def measure_link(backend: Any, repeat: int) -> tuple[float, float]:
    """``(latency s, bandwidth B/s)`` of one host<->device copy, fitted to round trips of
    1 KiB, 256 KiB and 4 MiB."""
    from anychip.core.plan.calibration import best_of

    sizes, times = [], []
    for n in (256, 65536, 1 << 20):
        a = np.random.default_rng(n).standard_normal(n).astype(np.float32)

        def trip(a: np.ndarray = a) -> None:
            t = backend.to_device(a)
            backend.to_host(t)
            backend.release(t)

        sizes.append(a.nbytes)
        times.append(best_of(trip, repeat) / 2)
    slope, intercept = np.polyfit(sizes, times, 1)
    bandwidth = 1.0 / slope if slope > 0 else 1e12
    return max(float(intercept), 1e-7), float(bandwidth)


def _probe_time(
    backend: Any,
    model: bytes,
    work: float,
    link: tuple | None,
    repeat: int,
    positive: bool,
    device: str | None = None,
) -> float | None:
    """Seconds of one probe model on ``backend`` alone (on ``device``, when given: the host
    in ``measure_launch``), less its copies over ``link`` (but at least a fifth of the whole
    run: a noisy subtraction must not make a device free); None when the device cannot run
    it. ``positive``: inputs in [0.5, 2) instead of normal (no NaN from Log or Sqrt, no
    division by zero)."""
    from anychip.core.plan.calibration import best_of

    name = device or backend.name
    if open_probe is None:  # the session layer, imported through the package root, installs it
        from anychip import load  # noqa: F401
    try:
        with quiet_fallbacks():
            sess = open_probe(model, name)
    except AnychipError as e:
        log.info("calibration of %s: not measured: %s", name, e)
        return None
    if set(sess.placement().by_device()) != {name}:
        return None
    rng = np.random.default_rng(int(work) % (1 << 31))
    feeds = {
        i.name: (
            rng.uniform(0.5, 2.0, i.shape) if positive else rng.standard_normal(i.shape)
        ).astype(np.float32)
        for i in sess.inputs
    }
    raw = t = best_of(lambda s=sess, f=feeds: s.run(None, f), repeat)
    if link is not None:
        nbytes = [a.nbytes for a in feeds.values()]
        nbytes.append(int(np.prod(sess.outputs[0].shape)) * 4)
        t -= sum(link[0] + b / link[1] for b in nbytes)
    return max(t, raw / 5, 1e-7)


#: The host every device's launch is measured against (``measure_launch``).
HOST = "cpu"


def measure_launch(backend: Any, repeat: int) -> float | None:
    """Seconds one call of ``backend``'s compiled partition costs beyond the host's run of
    the same one-node model (a one-element Add), or None when either cannot run it.

    Both sides pay the session's own per-run cost, which is in every class point of every
    device alike; the difference is what a graph-mode device adds per partition call (IREE's
    invoker and its arrays in and out), which the cost model charges once per call
    (``cost_search.Costs.launch``). Timed alternately, two rounds each, the fastest kept."""
    model = _model("Add", [[1], [1]], [1])
    link = None if backend.host_memory else measure_link(backend, 1)
    here, host = float("inf"), float("inf")
    for _ in range(2):
        t = _probe_time(backend, model, 1.0, link, repeat, positive=True)
        h = _probe_time(backend, model, 1.0, None, repeat, positive=True, device=HOST)
        if t is None or h is None:
            return None
        here, host = min(here, t), min(host, h)
    return max(here - host, 0.0)


def measure_class(backend: Any, cls: str, repeat: int) -> list[tuple[float, float]]:
    """``[(work, seconds)]`` of the class's probes (or of one op's, ``op:<type>``) on
    ``backend`` alone; empty when the device cannot run the class's op (its declared figures
    stay in use)."""
    points = []
    link = None if backend.host_memory else measure_link(backend, 1)
    op = cls[3:] if cls.startswith("op:") else None
    for probe in OP_PROBES[op] if op else PROBES[cls]:
        model, work = probe()
        t = _probe_time(backend, model, work, link, repeat, positive=op not in (None, "Pow"))
        if t is None:
            log.info("calibration of %s: %s not measured", backend.name, cls)
            return []
        points.append((work, t))
    return sorted(points)
