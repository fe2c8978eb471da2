"""The entry points of one group, read from every installed distribution once, then kept.

``importlib.metadata.entry_points(group=...)`` opens and parses ``entry_points.txt`` of every
distribution on ``sys.path`` (80 in this project's venv: 5-8 ms of a fresh process's first
load, for the handful of anychip plugins among them). What it finds depends only on the
distributions' metadata folders and their ``entry_points.txt`` files, so the answer is kept in
the cache folder (``plugins/entry-points-<key>.json``, ``paths.write_atomic``) under a key
built from what a scan would read: ``sys.path`` in order, and in each of its folders the
names of the ``*.dist-info`` / ``*.egg-info`` entries with the size and modification time of
their ``entry_points.txt``. Installing, removing, upgrading or editing a plugin's metadata
changes the key, and that process scans again. Where the key cannot see everything a scan
would (a finder on ``sys.meta_path`` with distributions of its own, beside the standard path
finder), every process scans; so does ``ANYCHIP_ENTRY_POINT_CACHE=0``. See
docs/decisions/055-cold-load-caches.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["CachedEntryPoint", "entry_points", "cache_path"]

_FORMAT = 1
_META = (".dist-info", ".egg-info")


class CachedEntryPoint:
    """An entry point as the cache keeps it: what ``importlib.metadata.EntryPoint`` offers the
    host (``name``, ``value``, ``group``, ``load()``), and its ``dist`` found on demand."""

    __slots__ = ("name", "value", "group")

    def __init__(self, name: str, value: str, group: str) -> None:
        self.name = name
        self.value = value
        self.group = group

    def load(self) -> Any:
        """Import the object the entry point names (``module:attr``)."""
        from importlib.metadata import EntryPoint

        return EntryPoint(self.name, self.value, self.group).load()

    @property
    def dist(self) -> Any:
        """The distribution that declares it (a scan: ``anychip --version`` asks)."""
        from importlib.metadata import entry_points as scan

        for ep in scan(group=self.group):
            if ep.name == self.name and ep.value == self.value:
                return ep.dist
        return None

    def __repr__(self) -> str:
        return f"CachedEntryPoint({self.name!r}, {self.value!r}, {self.group!r})"


def entry_points(group: str) -> list[Any]:
    """The entry points of ``group`` in the installed distributions: from the cache when what
    a scan reads is unchanged, else scanned (and kept)."""
    path = cache_path(group)
    if path is not None:
        kept = _read(path)
        if kept is not None:
            return [CachedEntryPoint(name, value, group) for name, value in kept]
    from importlib.metadata import entry_points as scan

    found = list(scan(group=group))
    if path is not None:
        _write(path, [(ep.name, ep.value) for ep in found])
    return found


def cache_path(group: str) -> Path | None:
    """The cache file for ``group`` as the installed metadata is now; None when it cannot be
    keyed (switched off, or a finder the key cannot see)."""
    if os.environ.get("ANYCHIP_ENTRY_POINT_CACHE", "1") == "0":
        return None
    from importlib.machinery import PathFinder

    for finder in sys.meta_path:
        if finder is not PathFinder and hasattr(finder, "find_distributions"):
            return None  # distributions the folders below do not show
    digest = hashlib.sha256(f"{_FORMAT} {group} {sys.version_info[:2]}".encode())
    for entry in sys.path:
        folder = os.path.abspath(entry or ".")
        digest.update(f"\0{folder}".encode())
        try:
            with os.scandir(folder) as it:
                names = sorted(e.name for e in it if _is_metadata(e.name))
        except NotADirectoryError:
            digest.update(f" file {_stat(folder)}".encode())  # a zip on sys.path
            continue
        except OSError:
            continue  # absent: a scan finds nothing there either
        for name in names:
            digest.update(
                f"\0{name} {_stat(os.path.join(folder, name, 'entry_points.txt'))}".encode()
            )
    from anychip.paths import cache_root

    return cache_root() / "plugins" / f"entry-points-{digest.hexdigest()[:24]}.json"


def _is_metadata(name: str) -> bool:
    low = name.lower()
    return low.endswith(_META) or low == "egg-info"


def _stat(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "-"
    return f"{st.st_size} {st.st_mtime_ns}"


def _read(path: Path) -> list[tuple[str, str]] | None:
    try:
        body = json.loads(path.read_bytes())
        if body.get("format") != _FORMAT:
            return None
        kept = [(str(name), str(value)) for name, value in body["entry_points"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # absent or not ours: scanned, written again
    from anychip.paths import used

    used(path)
    return kept


def _write(path: Path, found: list[tuple[str, str]]) -> None:
    from anychip.paths import write_atomic

    body = {"format": _FORMAT, "entry_points": found}
    try:
        write_atomic(path, json.dumps(body).encode())
    except OSError:
        pass  # a read-only cache folder: every process scans
