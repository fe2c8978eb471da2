"""oneDNN (Intel's deep-learning primitives library) for the CPU backend's convolution,
pooling and recurrent kernels, loaded through cffi's ABI mode from the ``onednn-cpu-gomp``
wheel (the ``onednn`` extra). See docs/decisions/012-onednn-through-cffi.md.

``available()`` says whether it loaded, ``unavailable_reason()`` why not; ``ANYCHIP_ONEDNN=0``
hides it and the numpy kernels run.
"""

from __future__ import annotations

from anychip.backends.cpu.onednn._lib import available, findable, unavailable_reason

__all__ = ["available", "findable", "unavailable_reason"]
