"""Terminal and notebook renderings: plain text off a terminal (the reports' own text), rich
tables in one, HTML in Jupyter; logging under ``anychip`` with ``ANYCHIP_LOG_LEVEL``; progress
tasks reaching a listener."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys

import pytest
from rich.console import Console

from anychip.core.logsetup import configure_logging
from anychip.core.progress import reporting_to, task
from anychip.errors import AnychipError
from anychip.viz.terminal import render
from tests.viz.parse import Page, external_references


def test_render_is_the_plain_text_off_a_terminal(mixed) -> None:
    out = io.StringIO()
    render(mixed.placement(), out)
    assert out.getvalue() == str(mixed.placement()) + "\n"


def test_rich_and_html_show_every_node(mixed) -> None:
    report, memory = mixed.placement(), mixed.memory()
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200, color_system=None)
    console.print(report)
    console.print(memory)
    text = out.getvalue()
    for n in report.nodes:
        assert n.name in text
    assert "planned" in text and "copies per run" in text
    html = report._repr_html_()
    page = Page(html)
    rows = [a for tag, a, _ in page.elements if tag == "tr"]
    assert len(rows) >= len(report.nodes) + len(report.partitions) + len(report.copies)
    assert all(n.name in html for n in report.nodes)
    assert external_references(html) == [] and "<script" not in html
    Page(memory._repr_html_())


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
def test_log_level_from_the_environment() -> None:
    code = (
        "import logging, anychip; lg = logging.getLogger('anychip'); "
        "print(logging.getLevelName(lg.level), len(lg.handlers))"
    )
    env = dict(os.environ, ANYCHIP_LOG_LEVEL="debug")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["DEBUG", "1"], out.stderr
    env["ANYCHIP_LOG_LEVEL"] = "loud"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "is not a level" in out.stderr and out.stdout.split()[0] == "NOTSET"


def test_configure_logging_levels() -> None:
    logger = logging.getLogger("anychip")
    level = logger.level
    try:
        assert configure_logging("INFO").level == logging.INFO
        assert configure_logging(quiet=True).level == logging.ERROR
        with pytest.raises(AnychipError, match="DEBUG, INFO"):
            configure_logging("verbose")
    finally:
        logger.setLevel(level)


def test_progress_tasks_reach_the_listener(mixed) -> None:
    seen: list[tuple[str, int | None, int]] = []

    @contextlib.contextmanager
    def listener(description, total):
        row = [description, total, 0]
        yield lambda n=1: row.__setitem__(2, row[2] + n)
        seen.append(tuple(row))

    import anychip
    from tests.models import transformer_layer

    with reporting_to(listener):
        with task("outer", 2) as advance:
            advance(2)
        anychip.load(
            transformer_layer(seq=8, hidden=32, ffn=64, ln_mean=True),
            devices=["xpu", "cpu"],
            cost_model=False,
        ).close()
    assert seen[0] == ("outer", 2, 2)
    assert ("loading the model", None, 0) in seen
    compiles = [s for s in seen if s[0] == "compiling partitions"]
    assert compiles and compiles[-1][1] == compiles[-1][2] == 4
