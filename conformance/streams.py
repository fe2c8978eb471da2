"""The kit's check of a declared stream contract (``Backend.streams()``, ``core/plugin/streams``).

``streams``: through the runtime's own copy functions (``core/run/streams.py``), float32 arrays
of odd shapes go host -> device -> host byte for byte; a download whose tensor is released before
it was synchronized, with an upload into the freed memory right after, still reads the old data
(the release rule); ``record``/``wait``/``synchronize`` work on both streams and ``synchronize()``
with no event returns; memory in use is back where it started.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.conformance.report import ContractResult
from anychip.core.plugin.streams import COMPUTE, COPY, Streams

__all__ = ["check_streams", "declares_streams"]

_SHAPES = [(0,), (), (1,), (3, 5, 7), (1 << 18,)]


def declares_streams(backend: Any) -> bool:
    """Whether ``backend`` declares streams (an error asking counts as declaring: it is checked)."""
    if backend.host_memory:
        return False
    try:
        return backend.streams() is not None
    except Exception:
        return True


def check_streams(backend: Any) -> ContractResult:
    """The ``streams`` contract check (see the module docstring)."""
    from anychip.conformance.contract import in_use
    from anychip.core.run.streams import _download, _upload

    name = "streams"
    try:
        streams = backend.streams()
    except Exception as e:
        return ContractResult(name, False, f"streams() raised {type(e).__name__}: {e}")
    if not isinstance(streams, Streams):
        return ContractResult(
            name, False, f"streams() returned {type(streams).__name__}, not a Streams subclass"
        )
    rng = np.random.default_rng(0)
    before = in_use(backend)
    step = "?"
    try:
        for shape in _SHAPES:
            step = f"round trip {list(shape)}"
            host = rng.standard_normal(shape).astype(np.float32)
            t = _upload(backend.name, streams, host)
            back, sync = _download(backend.name, streams, t)
            backend.release(t)
            sync()
            if back.shape != host.shape or back.tobytes() != host.tobytes():
                return ContractResult(name, False, f"{step}: the data changed in transit")
        step = "a download released before it was synchronized"
        host = rng.standard_normal(4096).astype(np.float32)
        t = backend.to_device(host)
        back, sync = _download(backend.name, streams, t)
        backend.release(t)
        other = backend.to_device(np.zeros(4096, np.float32))
        sync()
        backend.release(other)
        if back.tobytes() != host.tobytes():
            return ContractResult(
                name,
                False,
                f"{step}: it read memory reused by a later copy (a tensor released while a "
                "copy_out reads it must stay as it was until the copy is done)",
            )
        step = "events"
        for stream in (COMPUTE, COPY):
            ev = streams.record(stream)
            streams.wait(ev, COPY if stream == COMPUTE else COMPUTE)
            streams.synchronize(ev)
        streams.synchronize()
    except Exception as e:
        return ContractResult(name, False, f"{step}: {type(e).__name__}: {e}")
    after = in_use(backend)
    if before is not None and after != before:
        return ContractResult(
            name, False, f"device memory in use {before} B before, {after} B after the copies"
        )
    return ContractResult(name, True, "copies on the copy stream, ordered by events")
