"""Where anychip keeps what it writes: one cache folder per user (ground floor: imports nothing)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """``$ANYCHIP_CACHE_DIR``, else ``$XDG_CACHE_HOME/anychip``, else ``~/.cache/anychip``."""
    if os.environ.get("ANYCHIP_CACHE_DIR"):
        return Path(os.environ["ANYCHIP_CACHE_DIR"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "anychip"
