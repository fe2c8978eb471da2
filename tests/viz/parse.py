"""Readers of the pictures for the tests: the HTML page (html.parser) and Graphviz's SVG
(xml.etree), reduced to what the tests check."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from typing import Any

SVG = "{http://www.w3.org/2000/svg}"


class Page(HTMLParser):
    """Every element's tag, attributes and nesting; fails on unbalanced tags."""

    VOID = {"meta", "input", "br", "img", "link", "hr", "path", "rect", "line"}

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], list[str]]] = []
        self.stack: list[str] = []
        self.texts: list[tuple[list[str], str]] = []
        self.feed(text)
        self.close()
        assert not self.stack, f"unclosed elements: {self.stack}"

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.elements.append((tag, a, list(self.stack)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}, list(self.stack)))

    def handle_endtag(self, tag: str) -> None:
        if tag in self.VOID:
            return
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()

    def with_class(self, cls: str) -> list[dict[str, str]]:
        return [a for _, a, _ in self.elements if cls in a.get("class", "").split()]


def external_references(text: str) -> list[str]:
    """src/href attributes and CSS url()/@import that point off the page."""
    refs = re.findall(r"""(?:src|href)\s*=\s*["']?\s*((?:https?:)?//[^"'\s>]*)""", text, re.I)
    refs += re.findall(r"url\(\s*['\"]?\s*((?:https?:)?//[^)'\"]*)", text, re.I)
    refs += re.findall(r"@import\s+[^;]*", text, re.I)
    refs += re.findall(r"<link\b[^>]*>", text, re.I)
    return refs


def svg_groups(svg: bytes) -> dict[str, Any]:
    """Graphviz's SVG: node groups by id, copy edge groups by id."""
    root = ET.fromstring(svg)
    groups = {g.get("id", ""): g for g in root.iter(f"{SVG}g")}
    return groups


def fill_of(group: Any) -> str:
    for el in group.iter():
        if el.tag in (f"{SVG}path", f"{SVG}polygon") and el.get("fill") not in (None, "none"):
            return el.get("fill")
    return ""


def texts_of(group: Any) -> list[str]:
    return [el.text or "" for el in group.iter(f"{SVG}text")]
