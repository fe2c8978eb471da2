"""External tensor data: validate every location, then read the bytes into the protos.

Invariants:
    * Nothing is read before every external location of the model has been validated: a
      location must be relative, and its real path (symlinks resolved) must lie inside the
      model's folder. A model that points elsewhere is refused, never partly loaded.
    * Loading replaces ``external_data`` by ``raw_data`` in place, so the rest of the importer
      only ever sees in-memory tensors.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass

import onnx

from anychip.errors import ModelError

__all__ = [
    "ExternalRef",
    "iter_tensors",
    "validate_external_data",
    "load_external_data",
    "check_weight_budget",
    "declared_nbytes",
]


@dataclass(frozen=True)
class ExternalRef:
    """Where one tensor's bytes live, after validation."""

    tensor: onnx.TensorProto
    path: str
    offset: int
    length: int | None


def iter_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every ``TensorProto`` of the model: initializers, attributes, nested graphs, functions."""
    yield from _graph_tensors(model.graph)
    for fn in model.functions:
        for node in fn.node:
            yield from _node_tensors(node)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
    for attr in node.attribute:
        if attr.HasField("t"):
            yield attr.t
        yield from attr.tensors
        if attr.HasField("sparse_tensor"):
            yield attr.sparse_tensor.values
            yield attr.sparse_tensor.indices
        for sparse in attr.sparse_tensors:
            yield sparse.values
            yield sparse.indices
        if attr.HasField("g"):
            yield from _graph_tensors(attr.g)
        for g in attr.graphs:
            yield from _graph_tensors(g)


def iter_sparse(model: onnx.ModelProto) -> Iterator[onnx.SparseTensorProto]:
    """Every ``SparseTensorProto`` of the model (initializers and attributes, nested graphs
    and functions included)."""

    def graph(g: onnx.GraphProto) -> Iterator[onnx.SparseTensorProto]:
        yield from g.sparse_initializer
        for n in g.node:
            yield from node(n)

    def node(n: onnx.NodeProto) -> Iterator[onnx.SparseTensorProto]:
        for attr in n.attribute:
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor
            yield from attr.sparse_tensors
            if attr.HasField("g"):
                yield from graph(attr.g)
            for g in attr.graphs:
                yield from graph(g)

    yield from graph(model.graph)
    for fn in model.functions:
        for n in fn.node:
            yield from node(n)


def dense_nbytes(sparse: onnx.SparseTensorProto) -> int:
    """The bytes a sparse tensor takes once made dense (its dims times its element size; 8 a
    string entry, the object reference), which the import makes it."""
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(sparse.values.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        itemsize = 8
    return math.prod(max(int(d), 0) for d in sparse.dims) * max(itemsize, 1)


def validate_external_data(model: onnx.ModelProto, base_dir: str | None) -> list[ExternalRef]:
    """Check every external location of ``model``; return where each tensor's bytes are.

    Raises:
        ModelError: a location is absolute, escapes ``base_dir`` (through ``..`` or a symlink),
            names a missing file, or ``base_dir`` is needed but was not given.
    """
    refs: list[ExternalRef] = []
    for tensor in iter_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        if not location:
            raise ModelError(
                f"tensor {tensor.name!r} is stored externally but has no 'location'; the model "
                "file is malformed: re-export it"
            )
        if "\x00" in location:
            raise ModelError(
                f"tensor {tensor.name!r}: external data location {location!r} contains a NUL "
                "byte; the model file is malformed"
            )
        if base_dir is None:
            raise ModelError(
                f"tensor {tensor.name!r} keeps its data in external file {location!r}, but the "
                "model was given as bytes or a ModelProto: pass base_dir= (the folder that holds "
                "the external files) to import_model"
            )
        refs.append(_resolve(tensor, location, info, base_dir))
    return refs


def _resolve(
    tensor: onnx.TensorProto, location: str, info: dict[str, str], base_dir: str
) -> ExternalRef:
    name = tensor.name or "<unnamed>"
    if (
        os.path.isabs(location)
        or location.startswith(("/", "\\"))
        or os.path.splitdrive(location)[0]
    ):
        raise ModelError(
            f"tensor {name!r}: external data location {location!r} is an absolute path; "
            "external files must sit inside the model's folder and be named relative to it"
        )
    root = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, path]) != root:
        raise ModelError(
            f"tensor {name!r}: external data location {location!r} resolves to {path}, outside "
            f"the model's folder {root}; refusing to read it. Move the data file next to the "
            "model and fix the location"
        )
    if not os.path.isfile(path):
        raise ModelError(
            f"tensor {name!r}: external data file {location!r} not found in {root}; copy it "
            "next to the model file"
        )
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise ModelError(
            f"tensor {name!r}: external data offset/length {info.get('offset')!r}/"
            f"{info.get('length')!r} are not integers; the model file is malformed"
        ) from None
    if offset < 0 or (length is not None and length < 0):
        raise ModelError(f"tensor {name!r}: negative external data offset or length")
    return ExternalRef(tensor, path, offset, length)


def declared_nbytes(t: onnx.TensorProto) -> int | None:
    """The bytes ``t``'s dims and fixed-size type declare; None for strings and sub-byte types
    (whose packing the reader leaves to onnx)."""
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return None
    if t.data_type in (onnx.TensorProto.STRING,) or any(d < 0 for d in t.dims):
        return None
    if t.data_type in _SUB_BYTE:
        return None
    n = 1
    for d in t.dims:
        n *= d
    return n * itemsize


_SUB_BYTE = {
    getattr(onnx.TensorProto, name)
    for name in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(onnx.TensorProto, name)
}


def load_external_data(refs: list[ExternalRef]) -> None:
    """Read each validated reference into its tensor's ``raw_data``.

    Raises:
        ModelError: a file is shorter than the offset and length the model asks for.
    """
    for ref in refs:
        size = os.path.getsize(ref.path)
        want = size - ref.offset if ref.length is None else ref.length
        declared = declared_nbytes(ref.tensor)
        if declared is not None and want != declared:
            # Checked before any read: a small tensor must not pull in a huge file.
            raise ModelError(
                f"tensor {ref.tensor.name!r}: its dims and type declare {declared} bytes, but "
                f"its external data is {want} bytes ({ref.path} at offset {ref.offset}); the "
                "data file belongs to another model, or the tensor's length is wrong"
            )
        if ref.offset + want > size or want < 0:
            raise ModelError(
                f"tensor {ref.tensor.name!r}: external file {ref.path} holds {size} bytes but "
                f"the model asks for {want} bytes at offset {ref.offset}; the data file is "
                "truncated or belongs to another model"
            )
        with open(ref.path, "rb") as f:
            f.seek(ref.offset)
            data = f.read(want)
        ref.tensor.raw_data = data
        del ref.tensor.external_data[:]
        ref.tensor.data_location = onnx.TensorProto.DEFAULT


def check_weight_budget(model: onnx.ModelProto, max_bytes: int | None) -> None:
    """Refuse a model whose tensors declare more than ``max_bytes`` in all (the ceiling of
    one load), before any external byte is read or any array made. None: no ceiling, unless
    ``ANYCHIP_MAX_LOAD_BYTES`` sets one."""
    if max_bytes is None:
        raw = os.environ.get("ANYCHIP_MAX_LOAD_BYTES", "").strip()
        if not raw:
            return
        if not raw.isdigit():
            raise ModelError(f"ANYCHIP_MAX_LOAD_BYTES must be a number of bytes, got {raw!r}")
        max_bytes = int(raw)
    sizes = [(declared_nbytes(t) or 0, t.name) for t in iter_tensors(model)]
    # a sparse tensor is made dense at import: its dense bytes count (issue 47: a huge one
    # passed the ceiling and raised MemoryError while densified)
    sizes += [(dense_nbytes(sp), f"{sp.values.name} (sparse, dense)") for sp in iter_sparse(model)]
    total = sum(n for n, _ in sizes)
    if total > max_bytes:
        largest = ", ".join(f"{name!r} {n} B" for n, name in sorted(sizes, reverse=True)[:3])
        raise ModelError(
            f"the model's tensors declare {total} bytes, over the load ceiling of {max_bytes} "
            f"(max_load_bytes or ANYCHIP_MAX_LOAD_BYTES); the largest: {largest}. Raise the "
            "ceiling if the model is trusted and the machine has the memory."
        )
