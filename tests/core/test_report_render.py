"""The reports' views through ``core/report/render.py``: viz registers them, core looks them up
and loads viz only through the provider the package root installs, a report with no view
falls back to its text, and ``import anychip`` loads neither viz nor rich."""

from __future__ import annotations

import subprocess
import sys

import pytest

from anychip.core.report import render as views
from anychip.errors import AnychipError


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """An empty renderer table whose provider records its calls (both restored after)."""
    calls: list[str] = []
    monkeypatch.setattr(views, "_renderers", {})
    monkeypatch.setattr(views, "_provider", lambda: calls.append("provided"))
    monkeypatch.setattr(views, "_provided", False)
    return calls


class _Report(views.Rendered):
    report_kind = "toy"

    def __str__(self) -> str:
        return "toy report"


def test_a_miss_calls_the_provider_once(fresh: list[str]) -> None:
    assert views.find("toy", "html") is None and views.find("toy", "rich") is None
    assert fresh == ["provided"]


def test_the_provider_registers_what_the_lookup_then_finds(monkeypatch) -> None:
    for name in ("_renderers", "_provider", "_provided"):  # restored after the test
        monkeypatch.setattr(views, name, getattr(views, name))
    views._renderers = {}

    def provider() -> None:
        views.renders("toy", "html")(lambda r: f"<b>{r}</b>")

    views.set_provider(provider)
    assert _Report()._repr_html_() == "<b>toy report</b>"
    assert views.render("toy", "html", _Report()) == "<b>toy report</b>"


def test_no_view_falls_back_to_the_text(fresh: list[str]) -> None:
    report = _Report()
    assert report._repr_html_() is None  # Jupyter then shows text/plain
    assert report.__rich__() == "toy report"
    with pytest.raises(AnychipError, match="nothing draws the toy report as 'timeline'"):
        views.render("toy", "timeline", report)


def test_viz_registers_every_view_of_the_reports() -> None:
    for kind, fmt in [
        ("placement", "html"),
        ("placement", "rich"),
        ("memory", "html"),
        ("memory", "rich"),
        ("profile", "html"),
        ("profile", "rich"),
        ("profile", "timeline"),
    ]:
        fn = views.find(kind, fmt)
        assert fn is not None and fn.__module__.startswith("anychip.viz."), (kind, fmt)


@pytest.mark.slow  # starts another process: the slow tier (pyproject.toml, markers)
def test_import_anychip_loads_no_viz_and_no_rich() -> None:
    code = (
        "import sys, anychip\n"
        "print(sorted(m for m in sys.modules if m.startswith('anychip.viz') or "
        "m.split('.')[0] == 'rich'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr
