"""Tensors kept in a device's memory between runs (onnxruntime's ``OrtValue`` on a device).

``DeviceValue`` holds one device tensor with the backend that owns it; ``numpy()`` is its one
copy to the host, and the tensor goes back to its device when the last reference to the
value goes (or at ``release()``). A session makes them two ways:

* an output bound to a device (``IOBinding.bind_output(name, "xpu")``, or ``run_values(...,
  {name: "xpu"})``): the step that would copy the output from that device to the host hands
  the device tensor over instead, for this run (no copy); an output computed elsewhere is
  copied onto the device once;
* a feed: a ``DeviceValue`` given as an input (``Session.run``, ``IOBinding.bind_input``). When
  every step reading that input copies it onto the value's device, those copies hand the
  tensor on instead (no copy); otherwise the value is read to the host once.

A run with device values swaps the steps of the session's current placement for that run
(under the session's lock) and keeps the tensors handed in or out from being released by the
run. It runs that placement as it is: the feedback's trials and failover are not used for it,
since its tensors live on the devices of that placement (a run with host arrays takes both as
usual). ``Step`` copy counters (``Session.placement()``'s bytes per run) count only real
copies.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from anychip.core.plan.partition import HOST
from anychip.core.run.lifecycle import check_open
from anychip.errors import AnychipError, InputError

__all__ = ["DeviceValue", "involved", "run_values"]


class DeviceValue:
    """A tensor in one device's memory (onnxruntime's ``OrtValue``): ``device_name()``,
    ``shape()``, ``data_type()``, ``numpy()`` (a copy to the host), ``release()``. Feed it to a
    run of a session on that device and it stays there."""

    __slots__ = ("_tensor", "_backend", "_shape", "_dtype", "_finalizer", "__weakref__")

    def __init__(self, tensor: Any, backend: Any, shape: Sequence[int], dtype: Any) -> None:
        self._tensor, self._backend = tensor, backend
        self._shape, self._dtype = [int(d) for d in shape], np.dtype(dtype)
        release = None if backend.host_memory else backend.release
        self._finalizer = weakref.finalize(self, release, tensor) if release else None

    @classmethod
    def from_numpy(cls, array: np.ndarray, backend: Any) -> DeviceValue:
        """``array`` copied onto ``backend``'s device."""
        array = np.asarray(array)
        return cls(backend.to_device(array), backend, array.shape, array.dtype)

    def device_name(self) -> str:
        return str(self._backend.name)

    def shape(self) -> list[int]:
        return list(self._shape)

    def data_type(self) -> str:
        return f"tensor({self._dtype.name})"

    def numpy(self) -> np.ndarray:
        """The tensor copied to a fresh host array."""
        self._check()
        return np.asarray(self._backend.to_host(self._tensor))

    def release(self) -> None:
        """Give the tensor back to its device now (the value is unusable after)."""
        if self._finalizer is not None:
            self._finalizer()
        self._tensor = None

    @property
    def tensor(self) -> Any:
        """The backend's own tensor (valid while this value lives)."""
        self._check()
        return self._tensor

    def _check(self) -> None:
        if self._tensor is None:
            raise AnychipError(f"this {self.device_name()} value was released; it holds nothing")

    def __repr__(self) -> str:
        return f"<DeviceValue on {self.device_name()} {self._dtype.name}{self._shape}>"


def involved(feeds: Any) -> bool:
    """Whether ``feeds`` holds a ``DeviceValue`` (the run needs this module)."""
    if type(feeds) is not dict and not isinstance(feeds, Mapping):
        return False
    return any(isinstance(f, DeviceValue) for f in feeds.values())


class _Handed:
    """A device output handed over by a swapped copy step (no copy made)."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor


def run_values(
    session: Any,
    output_names: Sequence[str] | None,
    feeds: Mapping[str, Any],
    out_devices: Mapping[str, str],
) -> list[Any]:
    """``session.run`` with ``DeviceValue`` feeds; the outputs named in ``out_devices`` as
    ``DeviceValue`` on that device, the others as numpy arrays."""
    backends = {b.name: b for b in session.compiled.backends}
    for name, device in out_devices.items():
        if device not in backends:
            raise InputError(
                f"output {name!r} bound to {device!r}, which is not among the session's "
                f"devices {session.devices}"
            )
    with session._lock:
        check_open(session)
        prog = session.compiled.steps
        host, kept, hand_in = _inputs(session, prog, feeds)
        arrays, wanted = session._feeds.check(host), session._feeds.select(output_names)
        for i, v in enumerate(session.model.graph.inputs):
            if v.name in kept:
                arrays[i] = kept[v.name]
        order = [o.name for o in session.model.graph.outputs]
        by_slot = {prog.output_slots[order.index(n)]: d for n, d in out_devices.items()}
        with _swapped(prog, hand_in, by_slot):
            outs = prog.run(arrays)
        result = []
        for i in wanted:
            out = outs[i]
            bound = out_devices.get(order[i])
            if isinstance(out, _Handed):
                out = _value(out.tensor, backends[bound or ""], session.outputs[i])
            elif bound is not None:  # computed elsewhere: one copy onto the device
                out = DeviceValue.from_numpy(np.asarray(out), backends[bound])
            result.append(out)
        return result


def _value(tensor: Any, backend: Any, info: Any) -> DeviceValue:
    """A handed-over tensor as a ``DeviceValue`` (shape and dtype from the tensor when it
    has them, else from the graph's output)."""
    shape = getattr(tensor, "shape", None)
    dtype = getattr(tensor, "dtype", None)
    if shape is None or dtype is None:
        shape, dtype = np.shape(backend.to_host(tensor)), info.numpy_dtype()
    return DeviceValue(tensor, backend, shape, dtype)


def _inputs(
    session: Any, prog: Any, feeds: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], dict[int, str]]:
    """(feeds for the checks, input name -> device tensor handed on, feed slot -> device)."""
    index = {v.name: i for i, v in enumerate(session.model.graph.inputs)}
    host, kept, hand_in = dict(feeds), {}, {}
    for name, x in feeds.items():
        if not isinstance(x, DeviceValue) or name not in index:
            continue
        slot = prog.feed_slots[index[name]]
        readers = [st for st in prog.steps if slot in st.ins]
        device = x.device_name()
        if readers and all(st.is_copy and st.device == device for st in readers):
            kept[name] = x.tensor
            hand_in[slot] = device
            host[name] = np.broadcast_to(np.zeros((), x._dtype), x.shape())  # for the checks
        else:
            host[name] = x.numpy()
    return host, kept, hand_in


@contextlib.contextmanager
def _swapped(prog: Any, hand_in: dict[int, str], hand_out: dict[int, str]) -> Iterator[None]:
    """For one run: the copies of handed-in feeds made identities and their device slots kept
    from release; the final copies of outputs bound to their device made hand-overs (their
    device slot not released either); the copy counters of swapped steps put back after."""
    saved: list[tuple[Any, Any, tuple[int, int, int]]] = []
    keep: set[int] = set()
    keep_on_failure: set[int] = set()
    for st in prog.steps:
        if not st.is_copy:
            continue
        src, dst = st.ins[0], st.outs[0]
        if src in hand_in:
            fn: Any = _identity
            keep_on_failure.add(dst)  # the caller's tensor: never released by the run
        elif (
            dst in hand_out
            and st.device == HOST
            and st.label.rsplit(" ", 1)[-1] == f"{hand_out[dst]}->{HOST}"
            and not any(dst in other.ins for other in prog.steps)
        ):
            fn = _Handed
        else:
            continue
        keep.add(dst if fn is _identity else src)
        saved.append((st, st.fn, (st.runs, st.moved, st.last)))
        st.fn = fn
    frees = [(st, st.frees) for st in prog.steps if any(s in keep for s, _ in st.frees)]
    for st, fr in frees:
        st.frees = tuple((s, r) for s, r in fr if s not in keep)
    device_slots = prog.device_slots
    prog.device_slots = [(s, r) for s, r in device_slots if s not in keep_on_failure]
    try:
        yield
    finally:
        prog.device_slots = device_slots
        for st, fr in frees:
            st.frees = fr
        for st, fn, counts in saved:
            st.fn = fn
            st.runs, st.moved, st.last = counts


def _identity(t: Any) -> Any:
    return t
