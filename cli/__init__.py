"""The ``anychip`` command (also ``python -m anychip``): ``main`` declares the subcommands;
``bench``, ``scaffold``, ``viz`` and ``conformance`` hold the bodies of the larger ones."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``anychip`` command; returns the exit status."""
    from anychip.cli.main import main as run

    return run(argv)
