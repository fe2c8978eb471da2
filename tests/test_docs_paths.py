"""The maintainer docs stay true of the tree: every module path that docs/architecture.md,
docs/decisions/ and docs/perf/ name exists, and every relative link between them resolves.

A path is a backticked token whose first folder is one of the package's (``core/run/steps.py``,
``backends/cpu/native/``); a trailing ``.name`` after a module (``core/plan/placement.place``)
names something in it and is checked to appear in that file. Reading files only: no imports.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(
    [DOCS / "architecture.md"]
    + list((DOCS / "decisions").glob("*.md"))
    + list((DOCS / "perf").glob("*.md"))
)
FOLDERS = {
    "backends",
    "bench",
    "cli",
    "codegen",
    "conformance",
    "core",
    "docs",
    "examples",
    "integrations",
    "ir",
    "opsets",
    "tests",
    "viz",
}
_CODE = re.compile(r"`([^`\s]+)`")
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _missing(token: str) -> str | None:
    """Why ``token`` (a repository path, maybe with ``.name`` after a module) is wrong, or None."""
    path = token.split("(")[0].rstrip("/.,;:")
    if (ROOT / path).exists():
        return None
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ROOT / (".".join(parts[:cut]) + ".py")
        if module.is_file():
            name = parts[cut]
            if re.search(rf"\b{re.escape(name)}\b", module.read_text()):
                return None
            return f"{name} is not in {module.relative_to(ROOT)}"
    return "no such file or folder"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_named_paths_exist(page: Path) -> None:
    text = page.read_text()
    wrong = []
    for token in set(_CODE.findall(text)):
        if (
            token.split("/")[0] not in FOLDERS
            or "/" not in token
            or any(c in token for c in "*<>{}|$")
        ):
            continue
        why = _missing(token)
        if why is not None:
            wrong.append(f"{token}: {why}")
    for link in set(_LINK.findall(text)):
        if not link.startswith("http") and not (page.parent / link).exists():
            wrong.append(f"link {link}: no such page")
    assert not wrong, f"{page.relative_to(ROOT)} names what is not in the tree:\n" + "\n".join(
        sorted(wrong)
    )
