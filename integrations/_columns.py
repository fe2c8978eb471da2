"""Columns to model inputs and outputs to columns, for one batch of a data set (numpy format).

Pure numpy, no Ray: a batch is ``dict[column, ndarray]`` whose first axis is the row. A column
of per-row tensors (images stored as arrays) arrives as one ``(rows, *row_shape)`` array, or as
an object array of equally shaped arrays (stacked here). A model whose first input dimension is
a fixed ``k`` (light ResNet-50 takes ``[1, 3, 224, 224]``) is run in chunks of ``k`` rows, the
last chunk padded with copies of its last row and the padding's outputs dropped; a model with a
symbolic first dimension takes the whole batch in one run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from anychip.errors import InputError

__all__ = ["ColumnMap"]


class ColumnMap:
    """Which column feeds which model input, which column each output becomes, what is kept.

    Built once per actor from the session's inputs and outputs and the user's mappings; every
    name is checked against the model at construction, the columns against each batch.
    """

    def __init__(
        self,
        session: Any,
        inputs: Mapping[str, str] | str | None,
        outputs: Mapping[str, str] | Sequence[str] | None,
        keep_columns: bool | Sequence[str],
    ) -> None:
        self.model_inputs = [i for i in session.get_inputs() if not i.optional]
        names = [i.name for i in self.model_inputs]
        if isinstance(inputs, str):  # the column of a one-input model
            if len(names) != 1:
                raise InputError(f"inputs={inputs!r} names one column; the model takes {names}")
            inputs = {names[0]: inputs}
        self.inputs = dict(inputs or {})
        unknown = sorted(set(self.inputs) - set(names))
        if unknown:
            raise InputError(f"inputs= names {unknown} are not model inputs; the model has {names}")
        out_names = [o.name for o in session.get_outputs()]
        if outputs is None:
            self.outputs = {n: n for n in out_names}
        elif isinstance(outputs, Mapping):
            self.outputs = dict(outputs)
        else:
            self.outputs = {n: n for n in outputs}
        unknown = sorted(set(self.outputs) - set(out_names))
        if unknown:
            raise InputError(f"outputs= names {unknown} are not model outputs; it has {out_names}")
        self.keep_columns = keep_columns
        #: The fixed first dimension of every input (None where it is symbolic).
        self.fixed_rows = _fixed_rows(self.model_inputs)

    def feeds(self, batch: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        """The model's feeds for a batch, each ``(rows, *row_shape)`` in the input's dtype."""
        feeds: dict[str, np.ndarray] = {}
        for info in self.model_inputs:
            column = self._column_for(info.name, batch)
            feeds[info.name] = _as_tensor(batch[column], column, info)
        counts = {len(a) for a in feeds.values()}
        if len(counts) > 1:
            raise InputError(f"the input columns have different row counts: {sorted(counts)}")
        return feeds, counts.pop() if counts else 0

    def _column_for(self, name: str, batch: Mapping[str, np.ndarray]) -> str:
        column = self.inputs.get(name, name)
        if column in batch:
            return column
        if name not in self.inputs and len(self.model_inputs) == 1 and len(batch) == 1:
            return next(iter(batch))  # one input, one column (ray.data.from_numpy's "data")
        raise InputError(
            f"model input {name!r} reads column {column!r}, which the batch does not have "
            f"(columns: {sorted(batch)}); map it with inputs={{{name!r}: 'column'}}"
        )

    def run(self, session: Any, feeds: dict[str, np.ndarray], rows: int) -> list[np.ndarray]:
        """Every selected output for ``rows`` rows: one run, or one run per fixed-size chunk."""
        names = list(self.outputs)
        k = self.fixed_rows
        if k is None:
            return list(session.run(names, feeds))
        parts: list[list[np.ndarray]] = [[] for _ in names]
        for start in range(0, rows, k):
            chunk = {n: _padded(a[start : start + k], k) for n, a in feeds.items()}
            take = min(k, rows - start)
            for part, y in zip(parts, session.run(names, chunk)):
                part.append(y[:take])
        return [np.concatenate(p) if len(p) > 1 else p[0] for p in parts]

    def result(
        self, batch: Mapping[str, np.ndarray], outputs: list[np.ndarray], rows: int
    ) -> dict[str, np.ndarray]:
        """The output batch: the kept columns, then one column per selected output."""
        if self.keep_columns is True:
            kept = list(batch)
        elif self.keep_columns is False:
            kept = []
        else:
            kept = list(self.keep_columns)
            missing = sorted(set(kept) - set(batch))
            if missing:
                raise InputError(f"keep_columns {missing} are not in the batch ({sorted(batch)})")
        out = {c: batch[c] for c in kept}
        for (name, column), y in zip(self.outputs.items(), outputs):
            if y.ndim == 0 or len(y) != rows:
                raise InputError(
                    f"output {name!r} has shape {y.shape}: its first dimension is not the "
                    f"{rows} rows of the batch, so it cannot become a column"
                )
            out[column] = y
        return out


def _fixed_rows(inputs: list[Any]) -> int | None:
    dims = {i.shape[0] if i.shape else None for i in inputs}
    dims = {d if isinstance(d, int) and d > 0 else None for d in dims}
    if len(dims) != 1:
        raise InputError(f"the model's inputs disagree on their first (row) dimension: {dims}")
    return dims.pop()


def _as_tensor(values: np.ndarray, column: str, info: Any) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype == object:  # a column of per-row arrays Arrow could not store as a tensor
        try:
            array = np.stack([np.asarray(v) for v in array])
        except ValueError as e:
            raise InputError(
                f"column {column!r}: its rows are arrays of different shapes ({e})"
            ) from e
    want = info.numpy_dtype
    if want is not None and array.dtype != want:
        if not np.can_cast(array.dtype, want, "same_kind"):
            raise InputError(
                f"column {column!r} holds {array.dtype}, model input {info.name!r} takes {want}"
            )
        array = array.astype(want)
    row_shape = info.shape[1:] if info.shape else None
    if row_shape and all(isinstance(d, int) for d in row_shape):
        if list(array.shape[1:]) != row_shape:
            if array.ndim > 1 and array.shape[1] == 1 and list(array.shape[2:]) == row_shape:
                return array.reshape(array.shape[0], *row_shape)  # rows stored with a batch of 1
            raise InputError(
                f"column {column!r} has rows of shape {list(array.shape[1:])}; model input "
                f"{info.name!r} ({info.type}) takes rows of shape {row_shape}"
            )
    return array


def _padded(chunk: np.ndarray, k: int) -> np.ndarray:
    if len(chunk) == k:
        return chunk
    pad = np.repeat(chunk[-1:], k - len(chunk), axis=0)
    return np.concatenate([chunk, pad])
