"""Pruning the test run's bytecode cache (``sys.pycache_prefix``, set in ``conftest.py``).

Under a prefix, Python mirrors each source folder's absolute path. CI builds a fresh virtual
environment in a new temporary folder at every run, so without pruning the cache kept every
past venv's compiled numpy, onnx and onnxruntime: about 100 MB a run, 2.8 GB seen on one
machine, until its disk was full. A mirrored folder whose source folder is gone is deleted.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def prune(root: Path) -> int:
    """Delete each folder under ``root`` whose mirrored source folder no longer exists.

    Returns how many folders were deleted. POSIX layout only (the prefix mirrors ``/``);
    elsewhere nothing is touched.
    """
    if os.name != "posix" or not root.is_dir():
        return 0
    removed = 0
    stack = [root]
    while stack:
        folder = stack.pop()
        source = Path("/") / folder.relative_to(root)
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if (source / entry.name).is_dir():
                stack.append(Path(entry.path))
            else:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
    return removed
