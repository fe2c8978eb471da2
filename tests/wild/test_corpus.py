"""A bounded subset of bench/wild_corpus.py (the full corpus: ``python bench/wild_corpus.py``):
models made by onnxruntime's quantizer and optimizers, skl2onnx and old exporters pass, or are
refused with a reason."""

from __future__ import annotations

import functools

import pytest

from bench.wild_corpus import all_cases, run_case, table

_SUBSET = {
    "quantized": (
        "small_cnn qoperator u8s8 per-channel",
        "small_cnn qdq s8s8",
        "mlp dynamic s8",
        "mlp qoperator s8s8 per-channel",
    ),
    "contrib-transformer": (
        "bert fused (Attention, BiasGelu)",
        "cnn ort-extended (FusedConv)",
        "mlp ort-extended (FusedGemm)",
        "cnn ort-all (NCHWc layout)",
        "bert fused + dynamic s8 (QAttention)",
    ),
    "scikit-learn": ("GradientBoostingClassifier (multi)", "SVC rbf probability (multi)"),
    "old-exporter": ("LayerNormalization at opset 13", "wrong declared output shape"),
}
_IDS = [f"{source}/{name}" for source, names in _SUBSET.items() for name in names]


@functools.cache
def _cases() -> dict:
    """The subset's cases by id, made when a test first asks (all_cases() imports scikit-learn
    and onnxruntime's quantizer: 1-2 s in each pytest-xdist worker's collection)."""
    return {f"{c.source}/{c.name}": c for c in all_cases() if c.name in _SUBSET.get(c.source, ())}


def test_the_subset_is_in_the_corpus() -> None:
    assert sorted(_cases()) == sorted(_IDS)


@pytest.mark.parametrize("case_id", _IDS)
def test_corpus_case(case_id) -> None:
    case = _cases()[case_id]
    result = run_case(case)
    if "NCHWc" in case.name:
        # onnxruntime's machine-specific layout ops (com.microsoft.nchwc) are refused, named.
        assert result.status == "refused" and "com.microsoft.nchwc" in result.reason
        return
    assert result.status == "pass", result.reason


def test_table_counts_by_source() -> None:
    case = next(c for c in _cases().values() if c.source == "old-exporter")
    text = table([run_case(case)])
    assert "old-exporter" in text.splitlines()[1] and " 1 " in text.splitlines()[1]


def test_a_label_may_differ_only_at_a_tie() -> None:
    import numpy as np

    from bench.wild_corpus import compare

    scores = np.array([[0.5, 0.50000006], [0.2, 0.8]], np.float32)
    want = [np.array([1, 1]), scores]
    assert compare([np.array([0, 1]), scores], want, 1e-4, 1e-4) == ""
    assert "differ" in compare([np.array([1, 0]), scores], want, 1e-4, 1e-4)


def test_timed_phases_are_reported_apart() -> None:
    from bench.wild_corpus import PHASES, phase_ratios

    case = _cases()["old-exporter/wrong declared output shape"]
    result = run_case(case, repeat=2)
    phases = result.extra["phases"]
    assert tuple(phases) == PHASES  # load, first run, runs 2-10, steady
    assert all(a > 0 and b > 0 for a, b in phases.values())
    assert result.ratio == phase_ratios([result], "steady")[0]
    header = table([result]).splitlines()[0]
    assert all(p in header for p in PHASES)
