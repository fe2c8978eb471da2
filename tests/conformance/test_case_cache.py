"""The disk cache of onnx's generated node cases (``anychip.conformance.case_cache``): stored
once, read back without generating, and a corrupt or foreign file rebuilt, never loaded."""

from __future__ import annotations

import pytest

from anychip.conformance import case_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The cache in a temporary folder, with a counting stand-in for onnx's generator."""
    calls = []

    def generate():
        calls.append(1)
        return [("test_add", [1.0, 2.0]), ("test_relu", [-1.0])]

    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ANYCHIP_CASE_CACHE", raising=False)
    monkeypatch.setattr(case_cache, "_GENERATE", generate)
    monkeypatch.setattr(case_cache, "_cases", None)

    def fresh_process():
        case_cache._cases = None  # what a new process starts with
        return case_cache.generated_node_cases()

    return calls, fresh_process


def test_a_second_process_reads_the_cases_without_generating(cache):
    calls, fresh_process = cache
    first = fresh_process()
    assert calls == [1] and case_cache.cache_file().exists()
    assert fresh_process() == first
    assert calls == [1]


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign"])
def test_a_corrupt_or_foreign_file_is_rebuilt_never_loaded(cache, damage):
    calls, fresh_process = cache
    expected = fresh_process()
    path = case_cache.cache_file()
    blob = bytearray(path.read_bytes())
    if damage == "flip":
        blob[-5] ^= 0xFF
    elif damage == "truncate":
        blob = blob[: len(blob) // 2]
    else:  # another onnx install's key
        at = len(case_cache.MAGIC) + 1
        blob[at : at + 64] = b"0" * 64
    path.write_bytes(bytes(blob))
    assert fresh_process() == expected
    assert calls == [1, 1]  # generated again
    assert fresh_process() == expected and calls == [1, 1]  # and stored again


def test_the_cache_can_be_turned_off(cache, monkeypatch):
    calls, fresh_process = cache
    monkeypatch.setenv("ANYCHIP_CASE_CACHE", "0")
    fresh_process()
    fresh_process()
    assert calls == [1, 1] and not case_cache.cache_file().exists()


def test_the_cached_cases_are_onnx_s_own():
    """The cases the suite and the kit use are onnx's generated list, name for name."""
    import onnx.backend.test.case.node as node_cases

    from anychip.conformance.cases import all_cases

    names = {c.name for c in case_cache.generated_node_cases()}
    assert names == {c.name for c in all_cases("node")}
    assert len(names) > 1000
    # onnx's generator registers every case in this list once its modules are imported.
    if node_cases._NodeTestCases:
        assert names == {c.name for c in node_cases._NodeTestCases}


def test_another_ml_dtypes_is_another_file(cache, monkeypatch):
    """The expected outputs of onnx's 4-bit and float8 cases come from ml_dtypes: cases made
    with one version are not read under another (0.6.0 and 0.7.0 cast to int4 differently)."""
    calls, fresh_process = cache
    first = case_cache.cache_file()
    fresh_process()
    monkeypatch.setattr(case_cache.ml_dtypes, "__version__", "0.0.0-other")
    assert case_cache.cache_file() != first
    fresh_process()
    assert calls == [1, 1]
