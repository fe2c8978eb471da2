"""The plugin entry points kept across processes (``core/plugin/entry_points.py``): a kept
answer is used only while the installed metadata is what it was; an added, edited or removed
plugin distribution is seen at once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from anychip.core.plugin import entry_points as ep_cache

GROUP = "anychip-test-group"


def _dist(site: Path, name: str, body: str) -> Path:
    meta = site / f"{name}-1.0.dist-info"
    meta.mkdir(parents=True, exist_ok=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (meta / "entry_points.txt").write_text(f"[{GROUP}]\n{body}\n")
    return meta


@pytest.fixture
def site(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A folder of distributions first on ``sys.path``, a cache folder of the test's own,
    and the real scan counted in ``site.scans``."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ANYCHIP_ENTRY_POINT_CACHE", raising=False)
    monkeypatch.setattr(sys, "path", [str(folder), *sys.path])
    import importlib.metadata

    scans: list[str] = []
    real = importlib.metadata.entry_points

    def counted(**kwargs: str) -> object:
        scans.append(kwargs.get("group", ""))
        return real(**kwargs)

    monkeypatch.setattr(importlib.metadata, "entry_points", counted)
    monkeypatch.setattr(ep_cache, "_scans", scans, raising=False)
    return folder


def _found() -> list[tuple[str, str]]:
    return sorted((ep.name, ep.value) for ep in ep_cache.entry_points(GROUP))


def test_kept_while_unchanged_and_loadable(site: Path) -> None:
    _dist(site, "plugin_a", "a = plugin_a_mod:hooks")
    (site / "plugin_a_mod.py").write_text("hooks = 'the hooks'\n")
    assert _found() == [("a", "plugin_a_mod:hooks")]
    assert _found() == [("a", "plugin_a_mod:hooks")]
    assert ep_cache._scans == [GROUP]  # type: ignore[attr-defined]
    (kept,) = ep_cache.entry_points(GROUP)
    assert isinstance(kept, ep_cache.CachedEntryPoint)
    assert kept.load() == "the hooks"
    assert kept.dist is not None and kept.dist.metadata["Name"] == "plugin_a"


def test_an_added_edited_or_removed_plugin_is_seen(site: Path) -> None:
    meta = _dist(site, "plugin_a", "a = plugin_a_mod")
    assert _found() == [("a", "plugin_a_mod")]
    _dist(site, "plugin_b", "b = plugin_b_mod")  # installed
    assert _found() == [("a", "plugin_a_mod"), ("b", "plugin_b_mod")]
    (meta / "entry_points.txt").write_text(f"[{GROUP}]\na = plugin_a_new\n")  # upgraded
    st = os.stat(meta / "entry_points.txt")
    os.utime(meta / "entry_points.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert _found() == [("a", "plugin_a_new"), ("b", "plugin_b_mod")]
    for f in meta.iterdir():  # uninstalled
        f.unlink()
    meta.rmdir()
    assert _found() == [("b", "plugin_b_mod")]
    assert len(ep_cache._scans) == 4  # type: ignore[attr-defined]


def test_no_cache_when_the_key_cannot_see_every_distribution(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Finder:
        @staticmethod
        def find_distributions(*args: object, **kwargs: object) -> list[object]:
            return []

        @staticmethod
        def find_spec(*args: object, **kwargs: object) -> None:
            return None

    assert ep_cache.cache_path(GROUP) is not None
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Finder()])
    assert ep_cache.cache_path(GROUP) is None


def test_switched_off(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYCHIP_ENTRY_POINT_CACHE", "0")
    _dist(site, "plugin_a", "a = plugin_a_mod")
    assert _found() == _found() == [("a", "plugin_a_mod")]
    assert len(ep_cache._scans) == 2  # type: ignore[attr-defined]
