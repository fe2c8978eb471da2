"""The test-only device ``strict``: the array-API family on ``array-api-strict``.

array-api-strict is a minimal implementation of the standard that rejects anything outside it,
so a kernel that leans on a NumPy extra fails here. Its arrays live in its own objects (host
memory underneath, but distinct from numpy arrays: a copy anychip forgot is an error), copied
in with ``asarray(..., copy=True)`` and out through DLPack. It is never shipped as a plugin:
``registered()`` adds it in-process with ``register_backend`` and removes it afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

NAME = "strict"


def make_backend():
    import array_api_strict

    from anychip.backends.arrayapi import ArrayAPIBackend

    return ArrayAPIBackend(NAME, array_api_strict, auto_select=False, memory_capacity=1 << 34)


@contextlib.contextmanager
def registered() -> Iterator[object]:
    """``strict`` registered for the duration (the backend object is yielded)."""
    from anychip.backends.arrayapi import register_backend
    from anychip.core.plugin.host import unregister_plugin

    backend = make_backend()
    name = register_backend(backend, name="test-strict")
    try:
        yield backend
    finally:
        unregister_plugin(name)
