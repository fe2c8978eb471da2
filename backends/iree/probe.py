"""Capability by measurement: each node signature compiled and run on the device, compared
with anychip's CPU kernels, once per IREE version, target, flags and driver (cached on disk).

A real vendor compiler refuses some cases of an op and computes others wrong (IREE's own
tracker lists hundreds of ONNX node cases that do not compile and dozens of miscompiles). So
before a node goes to an IREE device, a one-node model of its signature (op, opset,
attributes, input dtypes and shapes, small constants) is compiled for the device and run on
seeded random inputs, and its outputs are compared with the CPU backend's kernels on the same
inputs (``core/run/kernel_call.evaluate_node``). A node whose signature failed is refused
with the reason ("IREE 3.13 vulkan-spirv: Sigmoid-13 f32[?,9] mismatches the CPU by 3.4").

Cost: one compile per signature (0.3-1 s). The first question about a graph's node asks about
every unasked node of that graph at once, as one module of independent pieces; a batch that
does not compile is split in halves until each refusal is found, and a piece that mismatches
inside a batch is asked again alone (lavapipe computed a Sigmoid wrong beside 22 other pieces
and right alone), whose answer is final. Answers are kept in a JSON file under the cache
folder (``iree/probes-<key>.json``), so a warm process asks nothing.

Inputs: floats normal(0, 1); 8- and 16-bit integers over their range, wider ones in
[1, 3) (valid indices and counts for most ops); bool
at random; symbolic and unknown dimensions at 3. Two kinds of node get the values their own
model computes instead (``model_values``: the graph run once on the CPU, its inputs random,
symbolic dimensions at 3): a node with an integer input computed from ``Shape`` or ``Size``
(the target of a Reshape or Expand, a Slice's bounds: random integers are no valid shape, and
IREE's Expand to a shape with a 0 differs from ONNX), and a node whose CPU reference raises
on random inputs (a MatMul whose operand's last dimension comes from a computed Reshape). A
node that neither way measures, or whose signature cannot be built (unknown rank), is
refused saying so.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.backends.iree.compiler import Executable, compile_vmfb, short_error
from anychip.errors import CompileTimeout
from anychip.ir.clone import extract_graph
from anychip.ir.graph import Graph
from anychip.ir.node import Attr, AttrType

if TYPE_CHECKING:
    from anychip.ir.node import Node
    from anychip.ir.value import Value

__all__ = [
    "Prober",
    "compare",
    "measured",
    "model_values",
    "node_key",
    "random_inputs",
    "reference",
]

SMALL_CONST = 1 << 16
SYMBOL_SIZE = 3
_BATCH = 24
#: Ops whose integer results describe tensors (the start of a computed shape).
_SHAPE_SOURCES = frozenset({"Shape", "Size"})


def _attr_key(a: Attr) -> Any:
    value = a.value
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, hashlib.sha1(value.tobytes()).hexdigest())
    if isinstance(value, (list, tuple)):
        return [_attr_key(Attr(a.name, AttrType.UNDEFINED, x)) for x in value]
    return repr(value)


def _shape(v: Value) -> Any:
    return None if v.shape is None else [d if isinstance(d, int) else str(d) for d in v.shape]


def node_key(node: Node) -> str:
    """A digest of what the answer about ``node`` depends on."""
    ins = []
    for v in node.inputs:
        if v is None:
            ins.append(None)
            continue
        const = None
        if v.const is not None and v.const.nbytes <= SMALL_CONST:
            const = hashlib.sha1(np.ascontiguousarray(v.const).tobytes()).hexdigest()
        ins.append([int(v.dtype), _shape(v), const, v.const is not None])
    outs = [None if v is None else [int(v.dtype), _shape(v)] for v in node.outputs]
    attrs = sorted([k, _attr_key(a)] for k, a in node.attributes.items())
    version = node.meta.get("since", node.version)
    text = json.dumps([node.domain, node.op_type, version, node.version, ins, outs, attrs])
    return hashlib.sha1(text.encode()).hexdigest()


def describe(node: Node) -> str:
    """``Sigmoid-13 f32[?,9]``: the op, its opset and its first input."""
    x = next((v for v in node.inputs if v is not None), None)
    shape = (
        ""
        if x is None or x.shape is None
        else ",".join(str(d) if isinstance(d, int) else "?" for d in x.shape)
    )
    dtype = "" if x is None or not x.dtype else x.dtype.short
    return f"{node.op_type}-{node.meta.get('since', node.version)} {dtype}[{shape}]"


def random_inputs(
    values: list[Value], seed: int, high: int = 3, low: int = 0, wide: bool = False
) -> list[np.ndarray]:
    """Seeded random arrays for ``values`` (dimensions that are not ints at ``SYMBOL_SIZE``,
    integers in ``[low, high)``, 8- and 16-bit ones over their range with ``wide``)."""
    rng = np.random.default_rng(seed)
    out = []
    for v in values:
        shape = tuple(d if isinstance(d, int) else SYMBOL_SIZE for d in v.shape or ())
        dtype = v.dtype.numpy
        if dtype == np.bool_:
            a = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer) and wide and np.dtype(dtype).itemsize <= 2:
            info = np.iinfo(dtype)  # 8- and 16-bit integers are data, not indices or shapes
            a = rng.integers(int(info.min), int(info.max) + 1, shape).astype(dtype)
        elif np.issubdtype(dtype, np.integer):
            a = rng.integers(low, max(high, low + 1), shape).astype(dtype)
        else:
            a = rng.standard_normal(shape).astype(dtype)
        out.append(np.asarray(a))
    return out


def reference(graph: Graph, arrays: list[np.ndarray], table: Any, schemas: Any) -> list[Any]:
    """``graph`` evaluated node by node with the CPU's kernels (``table``)."""
    from anychip.core.run.kernel_call import evaluate_node

    env: dict[Any, Any] = {v: a for v, a in zip(graph.inputs, arrays)}
    for v in graph.initializers.values():
        env[v] = v.const
    for node in graph.nodes:
        ins = [None if v is None else (env[v] if v in env else v.const) for v in node.inputs]
        for v, r in zip(node.outputs, evaluate_node(node, ins, table, schemas)):
            if v is not None:
                env[v] = r
    return [env[v] for v in graph.outputs]


def measured(graph: Graph, seed: int, table: Any, schemas: Any) -> tuple[list, list]:
    """Random inputs for ``graph`` and the CPU's outputs on them. 8- and 16-bit integers over
    their whole range (signed and unsigned arithmetic differ at large values), wider integers
    in [1, 3) (no empty shapes); then everything in [1, 3), [0, 2), and all 0 where the CPU
    refuses larger ones (indices into a dimension of 2 or 1).

    Raises:
        Exception: the CPU's, where even zeros do not run.
    """
    for low, high, wide in ((1, 3, True), (1, 3, False), (0, 2, False), (0, 1, False)):
        arrays = random_inputs(list(graph.inputs), seed, high, low, wide)
        try:
            return arrays, reference(graph, arrays, table, schemas)
        except NameError:  # a bug here, not the inputs: say so
            raise
        except Exception:
            if high == 1:
                raise
    raise AssertionError("unreachable")


def compare(got: np.ndarray, want: Any) -> str | None:
    """None where ``got`` matches ``want`` within ONNX's tolerances, else how it differs."""
    want = np.asarray(want)
    if got.shape != want.shape:
        return f"gives shape {list(got.shape)}, the CPU {list(want.shape)}"
    if want.dtype.kind in "fc":
        tol = 1e-3 if want.dtype == np.float16 else 1e-4
        g, w = got.astype(np.float64), want.astype(np.float64)
        same_nan = np.isnan(g) == np.isnan(w)
        close = np.isclose(g, w, rtol=tol, atol=tol * 10, equal_nan=True)
        if not (same_nan.all() and close.all()):
            err = np.nanmax(np.abs(np.where(np.isnan(g) | np.isnan(w), np.inf, g - w)))
            return f"mismatches the CPU by {float(err):.3g}"
        return None
    if not np.array_equal(got.astype(want.dtype), want):
        return f"mismatches the CPU at {int((got.astype(want.dtype) != want).sum())} elements"
    return None


class Prober:
    """The answers of one device (target, flags, driver), asked and kept per node signature."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self._answers: dict[str, str | None] = {}
        self._loaded = False
        #: The last graph run for ``model_values`` and what it computed (None: it did not run).
        self._values: tuple[Graph, dict[Value, np.ndarray] | None] | None = None
        #: Set when a probe's compile ran past its budget (``core/plugin/budget.run_tool``):
        #: every unasked signature is refused with it for the rest of the process, and none of
        #: it is kept on disk (a slow machine today is no answer for tomorrow).
        self._timed_out: str | None = None

    # -- the disk cache -------------------------------------------------------------------------
    @property
    def path(self) -> Any:
        from anychip.paths import cache_root

        key = hashlib.sha1(self.backend.identity().encode()).hexdigest()[:16]
        return cache_root() / "iree" / f"probes-{key}.json"

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        try:
            data = json.loads(self.path.read_text())
            if data.get("identity") == self.backend.identity():
                self._answers.update(data.get("answers", {}))
        except (OSError, ValueError, AttributeError):
            pass

    def _save(self) -> None:
        from anychip.paths import write_atomic

        body = {"identity": self.backend.identity(), "answers": self._answers}
        try:  # atomic, in the bounded store (paths.py)
            write_atomic(self.path, json.dumps(body).encode())
        except OSError:  # a read-only cache folder: the answers stay in this process
            return

    # -- questions ---------------------------------------------------------------------------
    def reason(self, node: Node, eligible: Any = None) -> str | None:
        """None when ``node``'s signature compiled and matched the CPU here, else why not."""
        key = node_key(node)
        with self._lock:
            self._load()
            if key in self._answers:
                return self._answers[key]
            if self._timed_out is not None:
                return self._timed_out
            graph = node.graph
            pending: dict[str, Node] = {key: node}
            if graph is not None and eligible is not None:
                for other in graph.nodes:
                    if len(pending) >= _BATCH:
                        break
                    k = node_key(other)
                    if k not in self._answers and k not in pending and eligible(other):
                        pending[k] = other
            self._answers.update(self._ask(list(pending.items())))
            self._save()
            return self._answers[key]

    def _ask(self, items: list[tuple[str, Node]]) -> dict[str, str | None]:
        pieces = [(k, n, self._piece(n)) for k, n in items]
        answers: dict[str, str | None] = {}
        ready = []
        for k, n, piece in pieces:
            if isinstance(piece, str):
                answers[k] = piece
            else:
                ready.append((k, n, piece))
        groups: dict[Any, list[Any]] = {}
        for item in ready:  # one batch per opset: a merged model has one opset per domain
            groups.setdefault(_opsets(item[2][0]), []).append(item)
        for group in groups.values():
            answers.update(self._batch(group, alone=len(group) == 1))
        return answers

    def _piece(self, node: Node) -> Any:
        """A one-node graph of ``node``, its random inputs and the CPU's outputs, or why not."""
        ins = [v for v in node.inputs if v is not None and v.const is None]
        if any(v.shape is None for v in ins):
            return f"{describe(node)}: an input of unknown rank (IREE compiles ranked tensors)"
        outs = [v for v in node.outputs if v is not None]
        seen: list[Value] = []
        for v in ins:
            if v not in seen:
                seen.append(v)
        graph, _ = extract_graph("piece", [node], seen, outs)
        seed = int(node_key(node)[:8], 16)
        table, schemas = self.backend.cpu_table(), self.backend.schemas()
        if any(_computed_shape(v) for v in seen):
            found = self._model_inputs(node, seen)
            if found is not None:
                try:
                    return graph, found, reference(graph, found, table, schemas)
                except Exception:  # measured on random inputs below
                    pass
        try:
            arrays, want = measured(graph, seed, table, schemas)
        except Exception as e:
            found = self._model_inputs(node, seen)
            if found is not None:
                try:
                    return graph, found, reference(graph, found, table, schemas)
                except Exception:  # refused below, with the random inputs' error
                    pass
            return (
                f"{describe(node)}: not measurable on random inputs (the CPU raised "
                f"{type(e).__name__}: {str(e)[:120]})"
            )
        return graph, arrays, want

    def _model_inputs(self, node: Node, inputs: list[Value]) -> list[np.ndarray] | None:
        """``inputs``' values as ``node``'s own model computes them (``model_values``), or
        None where the model could not be run that far."""
        graph = node.graph
        if graph is None:
            return None
        if self._values is None or self._values[0] is not graph:
            table, schemas = self.backend.cpu_table(), self.backend.schemas()
            self._values = (graph, model_values(graph, table, schemas))
        found = self._values[1]
        if found is None or not all(v in found for v in inputs):
            return None
        return [found[v] for v in inputs]

    def _batch(self, ready: list[Any], alone: bool) -> dict[str, str | None]:
        if not ready:
            return {}
        tag = self.backend.tag
        graphs = [p[2][0] for p in ready]
        dtypes = [v.dtype.numpy.str for g in graphs for v in g.outputs]
        try:
            merged = _merge(graphs) if len(graphs) > 1 else graphs[0]
            vmfb = compile_vmfb(merged, self.backend.target, self.backend.flags(), tag)
            exe = Executable(vmfb, self.backend.driver, self.backend.index, dtypes, {})
            feeds = [self.backend.to_device(a) for p in ready for a in p[2][1]]
            got = [self.backend.to_host(t) for t in exe.run(feeds)]
            exe.close()
        except CompileTimeout as e:  # not a refusal to keep: this process asks no more
            self._timed_out = f"{tag}: not asked: a probe's compile was stopped: {e}"[:400]
            raise
        except Exception as e:
            if len(ready) > 1:
                half = len(ready) // 2
                return {**self._batch(ready[:half], False), **self._batch(ready[half:], False)}
            k, n, _ = ready[0]
            return {k: f"{tag}: {describe(n)} {_cut(e, tag)}"}
        answers: dict[str, str | None] = {}
        at = 0
        for k, n, (_, _, want) in ready:
            why = None
            for w in want:
                why = why or compare(got[at], w)
                at += 1
            if why is not None and not alone:
                answers.update(self._batch([(k, n, _find(ready, k))], True))
            else:
                answers[k] = None if why is None else f"{tag}: {describe(n)} {why}"
        return answers


def _computed_shape(v: Value) -> bool:
    """Whether ``v`` is an integer computed from a ``Shape`` or ``Size`` (through integer
    nodes only): a shape, a bound or an axis, not data."""
    seen: set[int] = set()
    todo = [v]
    while todo:
        x = todo.pop()
        if id(x) in seen or x.const is not None or x.dtype is None:
            continue
        seen.add(id(x))
        if x.dtype.numpy.kind not in "iu":
            continue
        node = x.producer
        if node is None:
            continue
        if node.op_type in _SHAPE_SOURCES:
            return True
        todo.extend(u for u in node.inputs if u is not None)
    return False


def model_values(graph: Graph, table: Any, schemas: Any) -> dict[Value, np.ndarray] | None:
    """Every value ``graph`` computes on the CPU from seeded random inputs (symbolic
    dimensions at ``SYMBOL_SIZE``, integers in [0, 3): token ids, masks), as far as it runs;
    None when not even its inputs can be made."""
    from anychip.core.run.kernel_call import evaluate_node

    try:
        arrays = random_inputs(list(graph.inputs), 11, high=3)
    except Exception:  # an input of unknown rank or type
        return None
    env: dict[Value, Any] = dict(zip(graph.inputs, arrays))
    for v in graph.initializers.values():
        env[v] = v.const
    for node in graph.nodes:
        try:
            ins = [None if v is None else (env[v] if v in env else v.const) for v in node.inputs]
            outs = evaluate_node(node, ins, table, schemas)
        except Exception:  # the nodes after it keep their random inputs
            break
        for v, r in zip(node.outputs, outs):
            if v is not None:
                env[v] = np.asarray(r)
    return env


def _opsets(graph: Graph) -> tuple:
    found: dict[str, int] = {}
    for node in graph.walk():
        found[node.domain] = max(found.get(node.domain, 1), int(node.version or 1))
    return tuple(sorted(found.items()))


def _find(ready: list[Any], key: str) -> Any:
    return next(p[2] for p in ready if p[0] == key)


def _cut(e: BaseException, tag: str) -> str:
    text = str(e) if e.__class__.__name__ == "DeviceError" else short_error(e)
    text = text.replace(f"{tag}: ", "")
    return f"failed: {text}"[:300]


def _merge(graphs: list[Graph]) -> Any:
    """One ONNX model running ``graphs`` side by side (each one's names prefixed apart;
    the caller gives graphs of one opset)."""
    from onnx import compose, helper

    from anychip.backends.iree.compiler import to_onnx

    protos = [compose.add_prefix(to_onnx(g), f"p{i}_") for i, g in enumerate(graphs)]
    first = protos[0]
    graph = helper.make_graph(
        [n for p in protos for n in p.graph.node],
        "main",
        [v for p in protos for v in p.graph.input],
        [v for p in protos for v in p.graph.output],
        [t for p in protos for t in p.graph.initializer],
    )
    model = helper.make_model(graph, opset_imports=list(first.opset_import))
    model.ir_version = first.ir_version
    return model
