"""The placement pictures (``anychip.viz``): the HTML page and Graphviz's SVG of the light
ResNet-50 and a transformer layer: well-formed, one element per node, a colour per device,
copy edges with their bytes, fallbacks with their reason, no external reference."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest

from anychip.errors import AnychipError
from anychip.viz import placement_view, save_placement
from anychip.viz.dot import placement_dot, svg_bytes
from anychip.viz.html import placement_html
from tests.viz.parse import Page, external_references, fill_of, svg_groups, texts_of

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is absent")


def test_html_has_one_element_per_node_coloured_by_device(session) -> None:
    report = session.placement()
    page = Page(placement_html(placement_view(session)))
    nodes = page.with_class("node")
    assert Counter(a["data-name"] for a in nodes) == Counter(n.name for n in report.nodes)
    assert {a["data-name"]: a["data-device"] for a in nodes} == {
        n.name: n.device for n in report.nodes
    }
    # Each node's first rect is filled with its device's colour, one colour per device.
    colour_of = _node_fills(page)
    by_device: dict[str, set[str]] = {}
    for name, device in ((n.name, n.device) for n in report.nodes):
        by_device.setdefault(device, set()).add(colour_of[name])
    assert all(len(c) == 1 for c in by_device.values()), by_device
    assert len({next(iter(c)) for c in by_device.values()}) == len(by_device)
    assert external_references(placement_html(placement_view(session))) == []


def _node_fills(page: Page) -> dict[str, str]:
    out, current = {}, None
    for tag, attrs, _ in page.elements:
        if tag == "g" and "node" in attrs.get("class", "").split():
            current = attrs["data-name"]
        elif tag == "rect" and current is not None:
            out[current], current = attrs["fill"], None
    return out


def test_html_marks_every_copy_with_its_bytes(session) -> None:
    report = session.placement()
    view = placement_view(session)
    page = Page(placement_html(view))
    copies = page.with_class("copy")
    assert copies, "every model here copies its input to the device and its output back"
    sizes = {c.tensor: c.size for c in report.copies}
    for attrs in copies:
        tensors = attrs["data-tensor"].split(",")
        assert int(attrs["data-bytes"]) == sum(sizes[t] for t in tensors)
    assert {t for a in copies for t in a["data-tensor"].split(",")} == set(sizes)


def test_html_labels_fallbacks_with_their_reason(mixed) -> None:
    report = mixed.placement()
    assert report.fallbacks(), "LayerNormalization with its Mean cannot run on the XPU"
    html = placement_html(placement_view(mixed))
    page = Page(html)
    marked = {a["data-name"]: a["data-reason"] for a in page.with_class("fallback")}
    assert marked == {n.name: n.reason for n in report.fallbacks()}
    assert "no Mean or InvStdDev outputs (the XPU gives Y only)" in html
    bands = page.with_class("partition")
    assert sorted(int(a["data-index"]) for a in bands) == [p.index for p in report.partitions]


def test_html_folds_repeated_blocks_of_a_large_graph(session) -> None:
    html = placement_html(placement_view(session))
    page = Page(html)
    folds = page.with_class("fold")
    if len(session.placement().nodes) <= 60:
        assert folds == []
        return
    assert folds, "the ResNet's bottleneck blocks repeat"
    members = [a for tag, a, stack in page.elements if "node" in a.get("class", "").split()]
    folded = sum(int(a["data-count"]) for a in folds)
    assert 0 < folded < len(members)


@needs_dot
def test_svg_has_one_group_per_node_and_copies_with_bytes(session) -> None:
    report = session.placement()
    view = placement_view(session)
    svg = svg_bytes(view)
    groups = svg_groups(svg)
    nodes = {k: g for k, g in groups.items() if k.startswith("node_")}
    assert len(nodes) == len(report.nodes)
    names = {texts_of(g)[0] for g in nodes.values()}
    assert names == {n.name for n in report.nodes}
    fill_by_device: dict[str, set[str]] = {}
    for vn in view.graph_nodes:
        fill_by_device.setdefault(vn.device, set()).add(fill_of(nodes[f"node_{vn.id}"]))
    assert all(len(f) == 1 for f in fill_by_device.values())
    assert len({f for fs in fill_by_device.values() for f in fs}) == len(fill_by_device)
    copies = [g for k, g in groups.items() if k.startswith("copy_")]
    assert len(copies) == len(view.copy_edges)
    sizes = {c.tensor: c.size for c in report.copies}
    labels = sorted(" ".join(texts_of(g)) for g in copies)
    assert labels == sorted(f"{sizes[e.tensor]} B" for e in view.copy_edges)
    assert "legend" in groups and any(
        "estimate" in t or "cpu" in t for t in texts_of(groups["legend"])
    )
    assert external_references(svg.decode()) == []


@needs_dot
def test_svg_labels_fallbacks(mixed) -> None:
    view = placement_view(mixed)
    groups = svg_groups(svg_bytes(view))
    for vn in view.graph_nodes:
        text = " ".join(texts_of(groups[f"node_{vn.id}"]))
        assert ("fallback: xpu: declared constraint: Y only" in text) == vn.fallback


def test_dot_source_and_file_formats(mixed, tmp_path) -> None:
    src = placement_dot(placement_view(mixed)).source
    assert src.count("subgraph cluster_") == len(mixed.placement().partitions)
    for name in ("p.html", "p.dot"):
        assert (save_placement(mixed, tmp_path / name)).stat().st_size > 1000
    with pytest.raises(AnychipError, match=r"\.html, \.htm, \.svg"):
        save_placement(mixed, tmp_path / "p.png")


def test_svg_without_dot_says_what_to_install(mixed, monkeypatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(AnychipError, match="install Graphviz.*or write .html"):
        svg_bytes(placement_view(mixed))
