"""The array-API kernel family and ``ArrayAPIBackend``: one set of kernels, written against the
Python array API standard, serving any namespace on any device (CuPy for ``cuda``,
array-api-strict in the tests, PyTorch on ``mps``/``xpu``, JAX...). Not a plugin by itself:
``backends/cuda`` builds on it, and ``register_backend`` adds a backend in-process.
"""

from __future__ import annotations

from anychip.backends.arrayapi.backend import (
    ArrayAPIBackend,
    ArrayAPIPlugin,
    register_backend,
    standard_namespace,
)
from anychip.backends.arrayapi.tensor import Space, XTensor

__all__ = [
    "ArrayAPIBackend",
    "ArrayAPIPlugin",
    "register_backend",
    "standard_namespace",
    "Space",
    "XTensor",
]
