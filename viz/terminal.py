"""Terminal output: ``rich`` tables and progress bars where the output is a terminal and
``rich`` is installed (the ``viz`` extra), plain text otherwise. The reports' ``__rich__`` finds
the ``*_rich`` functions here through ``core/report/render.py`` (``@renders(kind, "rich")``).

``rich`` is optional on purpose: a server running models has no use for a terminal UI, and
every report already prints as plain text (its ``__str__``), which is what pipes, logs and
``--json``-less scripts get anyway. So the plain path is not a degraded copy: it is the
reports' own text, and ``rich`` only adds colour, box drawing and live progress.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any

from anychip.core.logsetup import use_rich
from anychip.core.memory.stats import _human
from anychip.core.report.render import renders
from anychip.viz.view import device_colors

__all__ = [
    "use_rich",
    "render",
    "placement_rich",
    "memory_rich",
    "profile_rich",
    "profile_text",
    "progress_bars",
    "kit_progress",
]


def render(obj: Any, stream: IO[str] | None = None) -> None:
    """Print ``obj``: as rich renders it in a terminal (its ``__rich__``), else ``str(obj)``."""
    stream = stream if stream is not None else sys.stdout
    if use_rich(stream) and hasattr(obj, "__rich__"):
        from rich.console import Console

        Console(file=stream).print(obj)
    else:
        print(obj, file=stream)


def _table(title: str, headers: list[str], rows: list[list[str]], **kw: Any) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left", **kw)
    for h in headers:
        table.add_column(h, overflow="fold")
    for r in rows:
        table.add_row(*r)
    return table


def _dev(device: str, colors: dict[str, str]) -> str:
    color = colors.get(device)
    return f"[{color}]{device}[/]" if color else device


@renders("placement", "rich")
def placement_rich(report: Any) -> Any:
    """A ``PlacementReport`` as rich tables: nodes (coloured by device), partitions, copies."""
    from rich.console import Group
    from rich.markup import escape
    from rich.text import Text

    colors = device_colors(list(report.devices))
    head = Text.from_markup(
        f"[bold]placement over {', '.join(report.devices)}[/]: "
        + ", ".join(f"{_dev(d, colors)}={c}" for d, c in report.by_device().items())
        + f"; {len(report.partitions)} partitions; {report.copy_count} copies/run "
        f"({_human(report.copy_bytes)})"
    )
    nodes = _table(
        "nodes",
        ["node", "op", "device", "part", "reason"],
        [
            [escape(n.name), n.op_type, _dev(n.device, colors), str(n.partition), escape(n.reason)]
            for n in report.nodes
        ],
    )
    parts = _table(
        "partitions",
        ["#", "device", "nodes", "cost model"],
        [
            [
                str(p.index),
                _dev(p.device, colors),
                str(len(p.nodes)),
                escape(", ".join(f"{k}={v}" for k, v in p.info.items())),
            ]
            for p in report.partitions
        ],
    )
    copies = _table(
        "copies per run",
        ["tensor", "from", "to", "bytes"],
        [
            [escape(c.tensor), c.src, c.dst, "?" if c.size is None else str(c.size)]
            for c in report.copies
        ],
    )
    items = [head, nodes, parts, copies]
    if report.decision:
        items.append(Text(f"cost model: {report.decision}"))
    items.extend(Text(f"unhealthy: {d}: {why}", style="red") for d, why in report.unhealthy.items())
    return Group(*items)


@renders("memory", "rich")
def memory_rich(report: Any) -> Any:
    """A ``MemoryReport`` as a rich table (its ``rows()``), then its notes."""
    from rich.console import Group
    from rich.text import Text

    table = _table("memory", list(report.HEAD), [list(row) for row in report.rows()])
    return Group(table, *(Text(f"note: {n}") for n in report.all_notes()))


def profile_text(profile: Any, top: int = 15) -> str:
    """The profile as plain text (``Profile.text``, which its ``__str__`` is)."""
    return profile.text(top)


@renders("profile", "rich")
def profile_rich(profile: Any, top: int = 15) -> Any:
    """A ``Profile`` as rich renders it: the runs, time per device, the slowest nodes."""
    from rich.console import Group
    from rich.text import Text

    colors = device_colors(list(profile.devices))
    head = Text("\n".join(profile.text(0).split("\n")[:2]))
    table = _table(
        "slowest nodes (per run)",
        ["node", "op", "device", "ms"],
        [[n, op, _dev(d, colors), f"{t * 1e3:.3f}"] for n, op, d, t in profile.node_times()[:top]],
    )
    return Group(head, table)


@contextlib.contextmanager
def progress_bars(enabled: bool = True) -> Iterator[None]:
    """Show ``core.progress`` tasks as rich progress bars on stderr inside the block (when
    ``enabled``, rich is installed and stderr is a terminal; otherwise nothing changes)."""
    if not enabled or not use_rich(sys.stderr):
        yield
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from anychip.core.progress import reporting_to

    columns = [
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=Console(file=sys.stderr), transient=True) as bars:

        @contextlib.contextmanager
        def listener(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
            tid = bars.add_task(description, total=total)
            try:
                yield lambda n=1: bars.advance(tid, n)
            finally:
                bars.remove_task(tid)

        with reporting_to(listener):
            yield


@contextlib.contextmanager
def kit_progress(quiet: bool) -> Iterator[Callable[[int, int, Any], None] | None]:
    """A rich progress callback for the conformance kit's ``progress(done, total, result)``,
    or None where the output is not a terminal with rich (the kit's plain lines then)."""
    if quiet or not use_rich(sys.stderr):
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    ) as bars:
        tid = bars.add_task("conformance cases", total=None)

        def advance(done: int, total: int, result: Any) -> None:
            bars.update(
                tid,
                completed=done,
                total=total,
                description=f"{result.status:<17} {result.case[:40]}",
            )

        yield advance
