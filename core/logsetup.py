"""Logging: everything anychip says goes through the ``anychip`` logger (``logging``).

A library adds no handler of its own (the application decides), with two exceptions that are
asked for: ``ANYCHIP_LOG_LEVEL=DEBUG|INFO|WARNING|ERROR`` (read when anychip is imported), and
the ``anychip`` command. Both call ``configure_logging``, which sets the logger's level and,
when nobody else handles its records (no handler on it or on the root logger), adds one that
writes the messages to stderr (``rich``'s handler in a terminal when it is installed).

``use_rich`` is the one answer to "does this stream get rich output" (``viz/terminal.py`` asks
it too); it looks for rich without importing it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from typing import IO

__all__ = ["configure_logging", "use_rich", "LEVELS"]

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_MARK = "_anychip_handler"


def _level(value: str | int) -> int:
    if isinstance(value, int):
        return value
    name = value.strip().upper()
    if name not in LEVELS:
        from anychip.errors import AnychipError

        raise AnychipError(
            f"ANYCHIP_LOG_LEVEL={value!r} is not a level; use one of {', '.join(LEVELS)}"
        )
    return getattr(logging, name)


def configure_logging(level: str | int | None = None, *, quiet: bool = False) -> logging.Logger:
    """Set the ``anychip`` logger's level (``level``, else ``ANYCHIP_LOG_LEVEL``, else as it
    is; ``quiet``: errors only) and give it a stderr handler if nothing handles it."""
    logger = logging.getLogger("anychip")
    wanted = level if level is not None else os.environ.get("ANYCHIP_LOG_LEVEL") or None
    if quiet:
        logger.setLevel(logging.ERROR)
    elif wanted is not None:
        logger.setLevel(_level(wanted))
    mine = [h for h in logger.handlers if getattr(h, _MARK, False)]
    if not mine and not logger.handlers and not logging.getLogger().handlers:
        handler = _handler()
        setattr(handler, _MARK, True)
        logger.addHandler(handler)
    return logger


def use_rich(stream: IO[str] | None = None) -> bool:
    """Whether ``stream`` (default stdout) gets rich output: a terminal, rich installed,
    ``NO_COLOR``/``TERM=dumb`` not set."""
    stream = stream if stream is not None else sys.stdout
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return False
    return importlib.util.find_spec("rich") is not None


def _handler() -> logging.Handler:
    if use_rich(sys.stderr):
        from rich.logging import RichHandler

        return RichHandler(show_path=False, show_time=False)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    return handler


@contextlib.contextmanager
def quiet_fallbacks() -> Iterator[None]:
    """No fallback warnings from the sessions made inside (probes and conformance cases:
    their caller reports the facts)."""
    logger = logging.getLogger("anychip")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
