"""Device arrays in and out of ``Session.run`` (onnxruntime's IO binding, simpler).

In: a feed that is not a numpy array but a device array (CuPy, PyTorch, array-api-strict...,
anything with ``__dlpack__``) is offered to each of the session's devices (``adopt``, which
array-API backends have). The device whose namespace and device it belongs to takes it without
a copy when every step reading that input is a copy onto that device (the runner's copy then
wraps it instead of copying); otherwise it comes to the host once, through the device (or
``numpy.from_dlpack`` for arrays already in host memory). The feed checks (dtype, rank, shape)
run on a zero-byte stand-in of the same shape and dtype.

Out: ``run(..., output_device="cuda")`` returns that device's native arrays: for each output
computed there, the final device-to-host copy step is swapped, for this run only (the session
lock is held), for one that hands over the device array; an output computed elsewhere is copied
onto the device. Outputs also read by host steps keep their copy.

Only the runner's ``StepProgram`` is read (``steps``, ``feed_slots``, ``output_slots``, each
step's ``is_copy``/``ins``/``outs``/``device``/``label``/``fn``): a few lines to follow when it
changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from anychip.core.api.feeds import detach
from anychip.core.plan.partition import HOST
from anychip.core.run.failover import run_request
from anychip.errors import AnychipError, InputError

__all__ = ["involved", "run"]


def involved(feeds: Any, output_device: str | None) -> bool:
    """Whether a run needs this module: a device output, or a feed that is a device array."""
    if output_device is not None and output_device != HOST:
        return True
    if type(feeds) is not dict and not isinstance(feeds, Mapping):
        return False
    for f in feeds.values():
        if type(f) is not np.ndarray and not isinstance(f, np.ndarray) and hasattr(f, "__dlpack__"):
            return True
    return False


class _OnDevice:
    """An output handed over on its device (what a swapped copy step returns)."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array


def _backends(session: Any) -> list[Any]:
    from anychip.core.plugin.host import get_registry

    reg = get_registry(session.devices)
    return [reg.backends[d] for d in session.devices if d in reg.backends]


def _readers(prog: Any, slot: int) -> list[Any]:
    return [st for st in prog.steps if slot in st.ins]


def _adopts(backend: Any, x: Any) -> bool:
    return backend.adopts_arrays and backend.adopt(x) is not None


def _adopt(session: Any, feeds: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(feeds for the checks, input name -> device tensor kept on its device)."""
    prog = session.compiled.steps
    index = {v.name: i for i, v in enumerate(session.model.graph.inputs)}
    host, kept = dict(feeds), {}
    for name, x in feeds.items():
        if isinstance(x, np.ndarray) or not hasattr(x, "__dlpack__") or name not in index:
            continue
        owner = next((b for b in _backends(session) if _adopts(b, x)), None)
        if owner is None:
            try:
                host[name] = np.from_dlpack(x)
            except (BufferError, RuntimeError, TypeError) as e:
                raise InputError(
                    f"input {name!r} is a device array none of the session's devices "
                    f"({', '.join(session.devices)}) takes, and it cannot be read on the host "
                    f"({e}); pass a numpy array, or load the model with its device"
                ) from e
            continue
        tensor = owner.adopt(x)
        readers = _readers(prog, prog.feed_slots[index[name]])
        if readers and all(st.is_copy and st.device == owner.name for st in readers):
            kept[name] = tensor
            host[name] = np.broadcast_to(np.zeros((), tensor.dtype), tensor.shape)
        else:
            host[name] = owner.to_host(tensor)
    return host, kept


@contextlib.contextmanager
def _outputs_on(session: Any, device: str | None) -> Iterator[None]:
    """Swap the final copies of ``device``'s outputs to the host for hand-overs (one run)."""
    prog = session.compiled.steps
    swapped = []
    if device is not None:
        outs = set(prog.output_slots)
        for st in prog.steps:
            dst = st.outs[0] if st.outs else None
            if not st.is_copy or dst is None or dst not in outs or _readers(prog, dst):
                continue
            if st.device == HOST and st.label.rsplit(" ", 1)[-1] == f"{device}->{HOST}":
                swapped.append((st, st.fn))
                st.fn = lambda t: _OnDevice(t.array)
    try:
        yield
    finally:
        for st, fn in swapped:
            st.fn = fn


def _output_backend(session: Any, device: str) -> Any:
    found = next((b for b in _backends(session) if b.name == device), None)
    if found is None or not found.adopts_arrays:
        raise AnychipError(
            f"output_device={device!r}: name one of the session's devices that holds arrays "
            f"(an array-API backend such as cuda); the session has {session.devices}"
        )
    ok, why = found.available()
    if not ok:
        raise AnychipError(f"output_device={device!r} is not available here: {why}")
    return found


def run(
    session: Any, output_names: Sequence[str] | None, feeds: Mapping[str, Any], device: str | None
) -> list[Any]:
    """``Session.run`` with device feeds and/or outputs (see the module docstring)."""
    device = None if device == HOST else device
    backend = _output_backend(session, device) if device is not None else None
    host, kept = _adopt(session, feeds) if isinstance(feeds, Mapping) else (feeds, {})
    arrays, wanted = session._feeds.check(host), session._feeds.select(output_names)
    for i, v in enumerate(session.model.graph.inputs):
        if v.name in kept:
            arrays[i] = kept[v.name]
    with session._lock, _outputs_on(session, device):
        outs = run_request(session, arrays)
    outs = [outs[i] for i in wanted]
    if backend is None:
        return [detach(o, feeds) for o in outs]
    result = []
    for o in outs:
        if isinstance(o, _OnDevice):
            result.append(o.array)
        else:  # computed on another device: one copy onto the output device
            result.append(backend.to_native(np.asarray(o)))
    return result
