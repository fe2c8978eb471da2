"""The text and rich renderings of ``viz.inspect.ModelSummary``."""

from __future__ import annotations

from typing import Any

from anychip.core.memory.stats import _human

__all__ = ["summary_text", "summary_rich", "si"]


def si(x: float) -> str:
    """``x`` with an SI prefix: 7.7G, 25.6M, 312k."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:g}"


def _io(rows: list[tuple[str, str, list]]) -> list[str]:
    return [f"  {n}  {d}[{','.join(str(x) for x in s)}]" for n, d, s in rows]


def _cell(row: list) -> str:
    can, total, why = row
    return f"{can}/{total}" if can == total else f"{can}/{total} ({why})"


def _header(s: Any) -> list[str]:
    opsets = ", ".join(f"{k} {v}" for k, v in s.opsets.items())
    by_op = ", ".join(f"{op} {si(f)}" for op, f in list(s.flops_by_op.items())[:4])
    lines = [
        f"model: {s.name} (ir {s.ir_version}{', ' + s.producer if s.producer else ''})",
        f"opsets: {opsets}",
        "inputs:",
        *_io(s.inputs),
        "outputs:",
        *_io(s.outputs),
        f"nodes: {sum(s.ops.values())} of {len(s.ops)} op types",
        f"parameters: {si(s.parameters)} ({_human(s.parameter_bytes)}) in {s.initializers} "
        "initializers",
        f"FLOPs: {'at least ' if s.unknown_flops else ''}{si(s.flops)} per run ({by_op})",
    ]
    if s.unknown_flops:
        lines.append(
            f"  not counted (shapes unknown): {len(s.unknown_flops)} nodes; give the symbolic "
            "dimensions sizes with --shape (anychip inspect MODEL --shape x=[1,128])"
        )
    return lines


def summary_text(s: Any) -> str:
    lines = _header(s)
    devices = list(s.devices)
    w = max([len(op) for op in s.ops] + [2])
    cells = {op: [_cell(s.devices[d][op]) for d in devices] for op in s.ops}
    widths = [max([len(d)] + [len(c[i]) for c in cells.values()]) for i, d in enumerate(devices)]
    head = "  ".join(f"{d:<{wd}}" for d, wd in zip(devices, widths))
    lines.append(f"{'op':<{w}}  {'count':>5}  {'FLOPs':>7}  {head}".rstrip())
    for op, count in s.ops.items():
        row = "  ".join(f"{c:<{wd}}" for c, wd in zip(cells[op], widths))
        lines.append(f"{op:<{w}}  {count:>5}  {si(s.flops_by_op.get(op, 0)):>7}  {row}".rstrip())
    return "\n".join(lines)


def summary_rich(s: Any) -> Any:
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    table = Table(title="operators, and which device can run them", title_justify="left")
    for h in ["op", "count", "FLOPs", *s.devices]:
        table.add_column(h, overflow="fold")
    for op, count in s.ops.items():
        cells = []
        for d in s.devices:
            row = s.devices[d][op]
            style = "green" if row[0] == row[1] else ("yellow" if row[0] else "red")
            cells.append(f"[{style}]{escape(_cell(row))}[/]")
        table.add_row(op, str(count), si(s.flops_by_op.get(op, 0)), *cells)
    return Group(Text("\n".join(_header(s))), table)
