"""Count the lines of Python that are code: not blank, not comment-only, not docstrings.

Usage::

    python examples/count_lines.py examples/anychip-toychip            # per file, then total
    python examples/count_lines.py examples/anychip-toychip --max 60   # exit 1 above 60

A line counts when a token other than a comment or a line break starts, ends or continues on
it (so each line of a statement split over several lines counts, and so does every line of a
multi-line string that is not a docstring). Docstrings are the string statements that open a
module, class or function body, as ``ast`` defines them.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from pathlib import Path

__all__ = ["count_lines", "count_source", "python_files"]

_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def _docstring_lines(tree: ast.AST) -> set[int]:
    """The line numbers of every module, class and function docstring in ``tree``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def count_source(source: str) -> int:
    """The number of code lines in ``source`` (see the module docstring for what counts)."""
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return len(code - _docstring_lines(ast.parse(source)))


def python_files(paths: list[str | Path]) -> list[Path]:
    """Every ``.py`` file named by ``paths`` (folders are searched recursively), sorted."""
    found: set[Path] = set()
    for p in map(Path, paths):
        found.update(p.rglob("*.py") if p.is_dir() else [p])
    return sorted(found)


def count_lines(paths: list[str | Path]) -> dict[Path, int]:
    """Code lines per Python file under ``paths``."""
    return {f: count_source(f.read_text(encoding="utf-8")) for f in python_files(paths)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="Python files or folders")
    parser.add_argument("--max", type=int, default=None, help="exit 1 when the total exceeds it")
    args = parser.parse_args(argv)
    counts = count_lines(args.paths)
    for path, n in counts.items():
        print(f"{n:6d}  {path}")
    total = sum(counts.values())
    print(f"{total:6d}  total")
    if args.max is not None and total > args.max:
        print(f"over budget: {total} > {args.max} lines", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
