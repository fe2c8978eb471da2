"""The HTML page's layout (``viz/layout.py``): folds of repeated runs, every node placed once,
partitions in disjoint bands, no two boxes of a layer overlapping."""

from __future__ import annotations

from anychip.viz import placement_view
from anychip.viz.layout import find_folds, layout


def test_find_folds_takes_the_longest_repeated_run() -> None:
    ops = ["Conv", "A", "B", "C", "A", "B", "C", "A", "B", "C", "Add"]
    assert find_folds(ops) == [(1, 3, 3)]
    assert find_folds(ops, min_nodes=10) == []
    assert find_folds(["A"] * 8) == [(0, 1, 8)]
    assert find_folds(list("ABCDEFGH")) == []
    # Keys are (op, device): the same ops on another device break the repeat.
    keyed = [(op, "npu") for op in ops[:7]] + [(op, "cpu") for op in ops[7:]]
    assert find_folds(keyed) == [(1, 3, 2)]


def _overlap(a, b) -> bool:
    return a.x < b.x + b.w and b.x < a.x + a.w and a.y < b.y + b.h and b.y < a.y + a.h


def test_layout_places_every_node_once_in_disjoint_bands(session) -> None:
    view = placement_view(session)
    lay = layout(view, fold=True)
    placed = sorted(m for u in lay.units for m in u.members)
    assert placed == [n.id for n in view.nodes]
    for i, a in enumerate(lay.units):
        for b in lay.units[i + 1 :]:
            assert not _overlap(a, b), (a, b)
    bands = sorted(lay.bands.values(), key=lambda b: b[1])
    for (_, y1, _, h1), (_, y2, _, _) in zip(bands, bands[1:]):
        assert y1 + h1 <= y2
    for ue in lay.edges:  # edges point down: a DAG drawn top to bottom
        assert lay.units[ue.src].layer < lay.units[ue.dst].layer


def test_mixed_placement_gets_a_band_per_partition(mixed) -> None:
    view = placement_view(mixed)
    lay = layout(view, fold=False)
    assert sorted(lay.bands) == [p.index for p in view.partitions]
    assert len(view.partitions) == 4
