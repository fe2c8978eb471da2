"""Large host buffers on transparent huge pages (2 MiB) where the kernel allows it.

A run of a CNN walks megabytes of activations and weights each time; on 4 KiB pages each of
them costs a TLB entry per 4 KiB (Zen 3's second-level TLB holds 2,048: 8 MiB), and a layer's
source, weights and output together overflow it. Linux backs a mapping with 2 MiB pages when
it is advised to (``madvise(MADV_HUGEPAGE)``, the setting ``madvise`` of
``/sys/kernel/mm/transparent_hugepage/enabled``, Debian's and most distributions' default),
at the first touch of each aligned 2 MiB. Neither numpy's arrays (from
malloc's heap or its own mappings) nor oneDNN's buffers are on them here (a SqueezeNet process
held 0-2 MiB of huge pages), so ``empty`` here is what the buffers a session keeps for its runs
are made with: the replay's arena and the block its recorded buffers share, the memory
planner's pools, oneDNN's prepared weights. Medians of 40 runs at one thread, four processes
each, alternated, without / with: SqueezeNet 7.78 / 7.62 ms, MobileNet-like 12.38 / 11.70; in
one process, sessions alternated, at two threads: SqueezeNet 0.976, ResNet-50 0.965,
MobileNet-like 0.987, Inception-v2 1.022, DenseNet-like 1.004 (noise of a few % either way on
this VM); the processes' peak RSS unchanged (SqueezeNet 161 MB, ResNet-50 694).

Buffers under ``MIN_BYTES`` are numpy's own (a huge page for each would waste most of it);
from there a buffer is a private anonymous mapping of its own (``mmap``: Python's default,
a shared one, is shared memory, which the kernel gives no huge pages), starting on a 2 MiB
boundary (up to 2 MiB more address space, touched only where used). ``ANYCHIP_HUGEPAGES=0``
turns it off; where ``madvise`` or the setting is missing the buffers are plain numpy arrays.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

__all__ = ["empty", "enabled", "MIN_BYTES", "HUGE"]

#: A transparent huge page of x86-64 and arm64 Linux.
HUGE = 2 << 20
#: Buffers from this size are placed on huge pages.
MIN_BYTES = 1 << 20
_state: dict[str, bool] = {}


def _available() -> bool:
    """Whether the kernel gives huge pages on advice (``enabled`` is ``always`` or
    ``madvise``) and Python's ``mmap`` can give that advice."""
    if "ok" not in _state:
        try:
            with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
                setting = f.read()
        except OSError:
            setting = "[never]"
        _state["ok"] = "[never]" not in setting and hasattr(mmap, "MADV_HUGEPAGE")
    return _state["ok"]


def enabled() -> bool:
    """Whether ``empty`` places large buffers on huge pages here (and ``ANYCHIP_HUGEPAGES``
    does not turn it off; read on every call)."""
    return os.environ.get("ANYCHIP_HUGEPAGES") != "0" and _available()


def empty(nbytes: int) -> np.ndarray:
    """An uninitialized 1-D ``uint8`` array of ``nbytes``, on huge pages from ``MIN_BYTES``:
    a fresh anonymous mapping (nothing in it touched yet, so each aligned 2 MiB is a huge page
    at its first touch), advised, the array starting on its first 2 MiB boundary; the array
    holds the mapping, unmapped when the last view of it goes. A plain ``np.empty`` below
    that or where ``enabled()`` is false."""
    nbytes = int(nbytes)
    if nbytes < MIN_BYTES or not enabled():
        return np.empty(nbytes, np.uint8)
    m = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE)  # shared: shmem, no THP
    raw = np.frombuffer(m, np.uint8)
    start = -raw.ctypes.data % HUGE
    try:
        m.madvise(mmap.MADV_HUGEPAGE, start, raw.size - start)
    except OSError:  # refused: 4 KiB pages, as numpy's
        pass
    return raw[start : start + nbytes]
