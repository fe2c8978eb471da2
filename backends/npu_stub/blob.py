"""The NPU's compiled artifact: a ``Program`` and its weights as bytes, and back.

Layout (all integers little-endian)::

    MAGIC (16 bytes) | format (u32) | manifest length (u64) | body length (u64)
    | sha256(manifest + body) (32 bytes) | manifest (JSON, ASCII) | body

The body is the weights block exactly as it lies in device memory (every packed constant at
its offset), then the host arrays the manifest lists (constants builders read on the host,
tensor attributes), each at a 64-byte aligned offset. The manifest holds the op list (each
op's node: op type, domain, opset version and resolved schema version, attributes, the values
it reads and writes with their shapes and dtypes, its slots, the weights its builder got), the
slots' shapes and dtypes, the weights' shapes and dtypes, the memory plan and the compile's
info. Nothing is pickled: arrays are raw bytes of an allowed dtype.

Loading checks everything before any of it reaches the device: magic, format, lengths and
digest; every index, dtype, shape and array bound; each rebuilt node against the NPU's
``check_node``; each builder taking exactly the weights the compile gave it; the weights'
layout; the memory plan against the op list (``check_plan``). Anything off raises
``DeviceError`` and the caller compiles again. A constant given to a builder only as a
device weight is rebuilt as a stand-in of its shape and dtype filled with NaN (or the
dtype's minimum): builders read constants through ``ctx.const`` or ``ctx.weight``, never
directly, and the round-trip tests (``tests/backends/npu_stub``) would see a builder that did.
"""

from __future__ import annotations

import hashlib
import json
import struct
from math import prod
from typing import Any

import numpy as np

from anychip.backends.npu_stub.kernels import BUILDERS, load_all
from anychip.backends.npu_stub.kernels.support import check_node
from anychip.backends.npu_stub.program import ALIGN, BuildContext, Op, Program, WeightRef
from anychip.core.memory.planner import MemoryPlan
from anychip.errors import DeviceError
from anychip.ir.dtypes import DType
from anychip.ir.node import Attr, AttrType, Node
from anychip.ir.value import Value

__all__ = ["dump", "load", "MAGIC", "FORMAT", "Unserializable"]

MAGIC = b"ANYCHIP-NPU-PRG\x00"
FORMAT = 1
_HEAD = struct.Struct("<IQQ")
_HEADER_SIZE = len(MAGIC) + _HEAD.size + 32
_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64".split()
)
_PLAIN = {
    AttrType.INT: int,
    AttrType.FLOAT: float,
    AttrType.STRING: str,
    AttrType.INTS: int,
    AttrType.FLOATS: float,
    AttrType.STRINGS: str,
}


class Unserializable(Exception):
    """The program holds something this format does not write (the partition is then not
    stored; it still runs)."""


# -- writing ---------------------------------------------------------------------------------
def dump(program: Program, image: memoryview, info: dict[str, Any], precision: str) -> bytes:
    """``program`` (placed: ``image`` is its weights block) as bytes.

    Raises:
        Unserializable: a symbolic shape, an attribute of a kind not written (graphs).
    """
    arrays: list[np.ndarray] = []
    values: list[list[Any]] = []
    index: dict[int, int] = {}

    def value(v: Value | None) -> int | None:
        if v is None:
            return None
        if id(v) not in index:
            index[id(v)] = len(values)
            values.append(_value_entry(v, program.const_read, arrays))
        return index[id(v)]

    ops = []
    for op in program.ops:
        node = op.node
        ops.append(
            {
                "op": node.op_type,
                "domain": node.domain,
                "name": node.name,
                "version": node.version,
                "since": node.meta.get("since"),
                "attrs": {k: _attr_entry(a, arrays) for k, a in node.attributes.items()},
                "in": [value(v) for v in node.inputs],
                "out": [value(v) for v in node.outputs],
                "slots_in": op.ins,
                "slots_out": op.outs,
                "weights": op.weights,
            }
        )
    plan = program.plan
    body_at = _align(program.weights_bytes)
    places = []
    for a in arrays:
        places.append([body_at, a.dtype.name, list(a.shape)])
        body_at = _align(body_at + a.nbytes)
    manifest = {
        "format": FORMAT,
        "name": program.name,
        "precision": precision,
        "values": values,
        "slots": [[d.name, list(s)] for s, d in zip(program.shapes, program.dtypes)],
        "inputs": program.inputs,
        "outputs": program.outputs,
        "ops": ops,
        "weights": [[r.dtype.name, list(r.shape)] for r in program.refs],
        "weights_bytes": program.weights_bytes,
        "weight_slots": sorted(program.weight_slots.items()),
        "arrays": places,
        "plan": {
            "offsets": sorted(plan.offsets.items()),
            "total_size": plan.total_size,
            "lower_bound": plan.lower_bound,
            "alignment": plan.alignment,
            "inplace": sorted(plan.inplace.items()),
            "strategy": plan.strategy,
        },
        "info": json.loads(json.dumps(info, default=str)),
    }
    text = json.dumps(manifest, separators=(",", ":")).encode("ascii")
    pieces: list[Any] = [text, image]
    at = program.weights_bytes
    for (offset, _, _), a in zip(places, arrays):
        pieces += [bytes(offset - at), memoryview(np.ascontiguousarray(a)).cast("B")]
        at = offset + a.nbytes
    digest = hashlib.sha256()
    for p in pieces:
        digest.update(p)
    head = MAGIC + _HEAD.pack(FORMAT, len(text), at) + digest.digest()
    return b"".join([head, *pieces])  # the one copy of the weights


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _value_entry(v: Value, const_read: set[int], arrays: list[np.ndarray]) -> list[Any]:
    if v.shape is None or not all(isinstance(d, int) for d in v.shape):
        raise Unserializable(f"value {v.name!r} has shape {v.shape}")
    const: Any = None
    if v.const is not None:
        if np.dtype(v.const.dtype).name not in _DTYPES:
            raise Unserializable(f"constant {v.name!r} is {v.const.dtype}")
        if id(v) in const_read:
            const = len(arrays)
            arrays.append(np.asarray(v.const))
        else:
            const = "weight"  # in the weights image, packed
    dtype = int(v.dtype) if v.const is None else int(DType.from_numpy(v.const.dtype))
    return [v.name, dtype, list(v.shape), const]


def _attr_entry(a: Attr, arrays: list[np.ndarray]) -> list[Any]:
    if a.type in _PLAIN:
        kind = _PLAIN[a.type]
        if a.type in (AttrType.INTS, AttrType.FLOATS, AttrType.STRINGS):
            return [int(a.type), [kind(x) for x in a.value]]
        return [int(a.type), kind(a.value)]
    if a.type == AttrType.TENSOR and np.asarray(a.value).dtype.name in _DTYPES:
        arrays.append(np.asarray(a.value))
        return [int(a.type), len(arrays) - 1]
    raise Unserializable(f"attribute {a.name!r} of type {a.type.name}")


# -- reading ---------------------------------------------------------------------------------
def load(data: bytes, precision: str) -> tuple[Program, memoryview, dict[str, Any]]:
    """The program ``data`` holds (not placed), its weights image and the compile's info.

    Raises:
        DeviceError: ``data`` is not an NPU program of this format and precision, or is
            corrupt (see the module docstring for what is checked).
    """
    try:
        return _load(memoryview(data), precision)
    except DeviceError:
        raise
    except Exception as e:  # a malformed manifest: wrong types, missing keys, bad values
        raise DeviceError(f"npu: not a valid compiled program: {type(e).__name__}: {e}") from e


def _load(data: memoryview, precision: str) -> tuple[Program, memoryview, dict[str, Any]]:
    if len(data) < _HEADER_SIZE or bytes(data[: len(MAGIC)]) != MAGIC:
        raise DeviceError("npu: not a compiled NPU program (no header)")
    fmt, mlen, blen = _HEAD.unpack_from(data, len(MAGIC))
    if fmt != FORMAT:
        raise DeviceError(f"npu: compiled program of format {fmt}, this anychip reads {FORMAT}")
    if len(data) != _HEADER_SIZE + mlen + blen:
        raise DeviceError("npu: compiled program truncated or padded")
    text = data[_HEADER_SIZE : _HEADER_SIZE + mlen]
    body = data[_HEADER_SIZE + mlen :]
    digest = hashlib.sha256(text)
    digest.update(body)
    if digest.digest() != bytes(data[len(MAGIC) + _HEAD.size : _HEADER_SIZE]):
        raise DeviceError("npu: compiled program corrupt (digest differs)")
    m = json.loads(bytes(text).decode("ascii"))
    if m["precision"] != precision:
        raise DeviceError(f"npu: compiled for precision {m['precision']!r}, not {precision!r}")
    arrays = [_array(body, *entry) for entry in m["arrays"]]
    values = [_value(entry, arrays) for entry in m["values"]]
    slots = [(tuple(_ints(s)), _dtype(d)) for d, s in m["slots"]]
    refs = [WeightRef(None, tuple(_ints(s)), _dtype(d)) for d, s in m["weights"]]
    load_all()
    ctx = BuildContext(precision == "fp16", replay=refs)
    ops = [_op(entry, values, slots, arrays, ctx) for entry in m["ops"]]
    weight_slots = {int(s): int(r) for s, r in m["weight_slots"]}
    for s, r in weight_slots.items():  # a 0-d constant is placed as [1]: same bytes
        shape, dtype = slots[_slot(s, slots)]
        ok = 0 <= r < len(refs) and refs[r].dtype == dtype
        _check(ok and refs[r].nbytes == prod(shape) * dtype.itemsize, "weight slot")
    program = Program(
        str(m["name"]),
        ops,
        [s for s, _ in slots],
        [d for _, d in slots],
        [_slot(i, slots) for i in m["inputs"]],
        [_slot(i, slots) for i in m["outputs"]],
        refs,
        weight_slots,
        ctx.const_read,
    )
    p = m["plan"]
    program.check(
        MemoryPlan(
            {int(k): int(v) for k, v in p["offsets"]},
            int(p["total_size"]),
            int(p["lower_bound"]),
            int(p["alignment"]),
            {int(k): int(v) for k, v in p["inplace"]},
            str(p["strategy"]),
        )
    )
    program.layout_weights()
    _check(program.weights_bytes == m["weights_bytes"], "weights layout")
    _check(program.weights_bytes <= len(body), "weights image")
    info = m["info"]
    _check(isinstance(info, dict), "info")
    return program, body[: program.weights_bytes], info


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise DeviceError(f"npu: compiled program inconsistent ({what})")


def _ints(xs: Any) -> list[int]:
    _check(isinstance(xs, list) and all(type(x) is int and x >= 0 for x in xs), "shape")
    return xs


def _dtype(name: Any) -> np.dtype:
    _check(name in _DTYPES, f"dtype {name!r}")
    return np.dtype(name)


def _slot(i: Any, slots: list) -> int:
    _check(type(i) is int and 0 <= i < len(slots), f"slot {i!r}")
    return i


def _array(body: memoryview, offset: int, dtype: str, shape: list) -> np.ndarray:
    dt, shape = _dtype(dtype), _ints(shape)
    count = prod(shape)
    _check(offset % ALIGN == 0 and 0 <= offset <= len(body) - count * dt.itemsize, "array")
    # copied out (they are small): a view would keep the whole artifact alive with them
    return np.frombuffer(body, dt, count, offset).reshape(shape).copy()


def _value(entry: list, arrays: list[np.ndarray]) -> Value:
    name, dtype, shape, const = entry
    dt, shape = DType(dtype), tuple(_ints(shape))
    if const is None:
        return Value(str(name), dt, shape)
    if const == "weight":
        npdt = _dtype(np.dtype(dt.numpy).name)
        fill = np.nan if npdt.kind == "f" else (np.iinfo(npdt).min if npdt.kind in "iu" else 1)
        return Value(str(name), dt, shape, const=np.broadcast_to(np.array(fill, npdt), shape))
    array = arrays[const]
    _check(array.shape == shape and DType.from_numpy(array.dtype) == dt, f"constant {name}")
    return Value(str(name), dt, shape, const=array)


def _op(entry: dict, values: list[Value], slots: list, arrays: list, ctx: BuildContext) -> Op:
    ins = [None if i is None else values[i] for i in entry["in"]]
    outs = [None if i is None else values[i] for i in entry["out"]]
    _check(all(v is None or v.producer is None for v in outs), "value written twice")
    attrs = {k: _attr(k, t, v, arrays) for k, (t, v) in entry["attrs"].items()}
    node = Node(
        str(entry["op"]),
        ins,
        outs,
        domain=str(entry["domain"]),
        version=entry["version"],
        attributes=attrs,
        name=str(entry["name"]),
    )
    if entry["since"] is not None:
        node.meta["since"] = int(entry["since"])
    why = check_node(node)
    if why is not None:
        raise DeviceError(f"npu: compiled program has node {node.name!r} it cannot run: {why}")
    build = BUILDERS.get((node.domain, node.op_type))
    _check(build is not None, f"op {node.qualified_op}")
    ctx.expect(_ints(entry["weights"]))
    run = build(node, ctx)
    _check(not ctx.pending, f"weights of {node.name!r}")
    slots_in, slots_out = entry["slots_in"], entry["slots_out"]
    _check(len(slots_in) == len(ins), f"inputs of {node.name!r}")
    for v, s in zip(ins, slots_in):
        taken = v is None or id(v) in ctx.claimed
        _check(taken == (s is None), f"inputs of {node.name!r}")
        if s is not None:
            _check(slots[_slot(s, slots)] == (v.shape, np.dtype(v.dtype.numpy)), "slot type")
    written = [v for v in outs if v is not None]
    _check(len(slots_out) == len(written) > 0, f"outputs of {node.name!r}")
    for v, s in zip(written, slots_out):
        _check(slots[_slot(s, slots)] == (v.shape, np.dtype(v.dtype.numpy)), "slot type")
    return Op(run, list(slots_in), list(slots_out), node, list(entry["weights"]))


def _attr(name: str, kind: int, value: Any, arrays: list[np.ndarray]) -> Attr:
    t = AttrType(kind)
    if t == AttrType.TENSOR:
        return Attr(name, t, arrays[value])
    conv = _PLAIN[t]
    if t in (AttrType.INTS, AttrType.FLOATS, AttrType.STRINGS):
        _check(isinstance(value, list), f"attribute {name}")
        return Attr(name, t, [conv(x) for x in value])
    return Attr(name, t, conv(value))
