"""``anychip run --input``: feeds read from files.

``name=file.npy`` (numpy), ``name=file.pb`` (a serialized ONNX ``TensorProto``, what onnx's
and onnxruntime's test data ship as ``input_0.pb``), ``name=file.npz`` (the array ``name`` in
the archive, or its only array); without ``name=``, a ``.npz`` feeds every array by its key
and a ``.pb`` feeds its tensor under the tensor's own name.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from anychip.errors import InputError

__all__ = ["read_inputs"]

_FORMS = "name=file.npy, name=file.pb (an ONNX TensorProto), name=file.npz or file.npz"


def read_inputs(items: list[str]) -> dict[str, Any]:
    """The feeds named by ``--input`` items, read from their files.

    Raises:
        InputError: naming the item when its form, file or content is wrong.
    """
    feeds: dict[str, Any] = {}
    for item in items:
        name, path = item.split("=", 1) if "=" in item else ("", item)
        ext = os.path.splitext(path)[1].lower()
        if not name and ext not in (".npz", ".pb"):
            raise InputError(f"--input expects {_FORMS}; got {item!r}")
        if not os.path.isfile(path):
            raise InputError(f"--input {item!r}: no file {path!r}")
        try:
            feeds.update(_read(name, path, ext))
        except InputError:
            raise
        except Exception as e:  # a file numpy or protobuf cannot parse
            raise InputError(
                f"--input {item!r}: {path!r} is not a readable {ext or 'numpy'} file "
                f"({type(e).__name__}: {str(e)[:120]}); expected {_FORMS}"
            ) from None
    return feeds


def _read(name: str, path: str, ext: str) -> dict[str, Any]:
    if ext == ".pb":
        return _read_pb(name, path)
    if ext == ".npz":
        return _read_npz(name, path)
    return {name: np.load(path, allow_pickle=False)}


def _read_pb(name: str, path: str) -> dict[str, Any]:
    import onnx
    from onnx import numpy_helper

    tensor = onnx.TensorProto()
    with open(path, "rb") as f:
        tensor.ParseFromString(f.read())
    key = name or tensor.name
    if not key:
        raise InputError(f"--input {path!r}: the tensor has no name; give one as name={path}")
    return {key: numpy_helper.to_array(tensor)}


def _read_npz(name: str, path: str) -> dict[str, Any]:
    with np.load(path, allow_pickle=False) as archive:
        arrays = {k: archive[k] for k in archive.files}
    if not name:
        return arrays
    if name in arrays:
        return {name: arrays[name]}
    if len(arrays) == 1:
        return {name: next(iter(arrays.values()))}
    raise InputError(
        f"--input {name}={path}: the archive has no array {name!r} (it has {sorted(arrays)}); "
        f"give the name of one, or {path} alone to feed them all by name"
    )
