"""``Session.profile()``: every node of a kernel-mode partition and every copy timed, the
Perfetto trace and the HTML timeline, and the session left as it was."""

from __future__ import annotations

import json

import numpy as np

from tests.viz.parse import Page, external_references


def _feeds(sess) -> dict:
    rng = np.random.default_rng(0)
    return {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in sess.inputs}


def test_profile_times_every_node_and_copy(mixed, tmp_path) -> None:
    feeds = _feeds(mixed)
    before = [s.fn for s in mixed.compiled.steps.steps]
    prof = mixed.profile(feeds, runs=2)
    report = mixed.placement()
    assert [s.fn for s in mixed.compiled.steps.steps] == before, "the timers are removed"
    nodes = prof.by_kind("node")
    # The nodes that run: the partitions' graphs, after their fusion passes (the XPU fuses
    # the attention into one node).
    ran = {n.name: p.device for p in mixed.partitions for n in p.graph.nodes}
    assert sorted(e.name for e in nodes) == sorted(list(ran) * 2)
    assert {e.name: e.device for e in nodes} == ran
    copies = prof.by_kind("copy")
    assert len(copies) == 2 * report.copy_count
    assert sum(e.bytes for e in copies) == 2 * report.copy_bytes
    parts = prof.by_kind("partition")
    assert len(parts) == 2 * len(report.partitions)
    for e in nodes:  # each node inside its partition's span of the same run
        span = next(p for p in parts if p.partition == e.partition and p.run == e.run)
        assert span.start <= e.start and e.start + e.seconds <= span.start + span.seconds + 1e-6
    assert set(prof.device_times()) == {"xpu", "cpu", "copies"}
    # The profiled session still computes the same.
    (a,) = mixed.run(None, feeds)
    (b,) = mixed.run(None, feeds)
    np.testing.assert_array_equal(a, b)
    trace = json.loads(prof.save_trace(tmp_path / "t.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(prof.events)
    assert {e["cat"] for e in spans} == {"node", "copy", "partition"}
    html = prof.save_html(tmp_path / "t.html").read_text()
    page = Page(html)
    assert len(page.with_class("span")) == len(prof.events)
    assert external_references(html) == []
    # The top-N table names the slowest node (not a fixed one: which nodes make the top N
    # depends on the run's timings; "ln1" was left out once in about ten runs).
    totals: dict[str, float] = {}
    for e in nodes:
        totals[e.name] = totals.get(e.name, 0.0) + e.seconds
    assert max(totals, key=totals.get) in str(prof) and "ms" in prof._repr_html_()


def test_graph_mode_partitions_are_timed_whole(tmp_path) -> None:
    import anychip
    from tests.models import transformer_layer

    # The NPU's whole graph, as priority places it (the cost model keeps this tiny layer on
    # the CPU, estimated faster without the NPU's copies and launch).
    model = transformer_layer(seq=8, hidden=32, ffn=64)
    with anychip.load(model, devices=["npu", "cpu"], placement_policy="prefer-first") as s:
        prof = s.profile(runs=1)
        assert prof.by_kind("node") == []  # one compiled executable: no per-node times
        assert [e.device for e in prof.by_kind("partition")] == ["npu"]
        assert "one compiled executable" in str(prof)
