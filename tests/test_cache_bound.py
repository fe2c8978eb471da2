"""The cache folder stays under ``ANYCHIP_CACHE_LIMIT`` through a workload (issue 44: "the
cache stays under its size limit while the whole test suite runs twice"): a bounded loop of
loads of several models, twice over, with the compile cache on and a limit half of what one
pass writes, the folder measured after every load and run (paths.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip import paths

WIDTHS = (48, 64, 80, 96)  # one model each: every one compiles and stores its own artifact


def _model(width: int) -> bytes:
    """Gemm -> Relu -> Gemm -> Sigmoid over [4, width]: the npu compiles it whole."""
    rng = np.random.default_rng(width)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, width])
    inits = [
        numpy_helper.from_array(
            (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), f"w{i}"
        )
        for i in range(2)
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w0"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w1"], ["g"]),
        helper.make_node("Sigmoid", ["g"], ["y"]),
    ]
    graph = helper.make_graph(nodes, f"mlp{width}", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _size(root: Path) -> int:
    return sum(size for _, size, _ in paths._files(root))


def _pass(models: dict[int, bytes], root: Path, limit: int | None, seen: list[int]) -> None:
    """Load and run each model on npu+cpu (compiled at load, the artifact stored) and on the
    cpu; the folder's size after each load and each run into ``seen``, checked when
    ``limit`` is given; the answers against onnxruntime's."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(1)
    for width, model in models.items():
        want_sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        for devices in (["npu", "cpu"], ["cpu"]):
            sess = anychip.load(model, devices=devices, cost_model=False, background_compile=False)
            seen.append(_size(root))
            x = rng.standard_normal((4, width)).astype(np.float32)
            got = sess.run(None, {"x": x})[0]
            seen.append(_size(root))
            np.testing.assert_allclose(got, want_sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
            sess.close()
            if limit is not None:
                assert max(seen) <= limit, (width, devices, seen, paths.cache_info(root))


def test_the_folder_stays_under_its_limit_through_two_passes(tmp_path, monkeypatch) -> None:
    from anychip.core.compile import pipeline

    root = tmp_path / "cache"
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(root))
    monkeypatch.setenv("ANYCHIP_COMPILE_CACHE", "1")
    monkeypatch.setenv("ANYCHIP_CALIBRATION", "off")
    monkeypatch.setattr(paths, "_written", {})
    models = {w: _model(w) for w in WIDTHS}
    seen: list[int] = []
    _pass(models, root, None, seen)  # what one pass writes, with no bound in reach
    written = _size(root)
    disk = pipeline.disk_for(pipeline.CompileOptions())
    assert disk is not None and disk.stats["stores"] >= len(WIDTHS), disk.stats
    largest = max(size for _, size, _ in paths._files(root))
    limit = max(written // 2, 2 * largest)
    assert limit < written, (limit, written)  # the bound is in reach: files must go

    monkeypatch.setenv("ANYCHIP_CACHE_LIMIT", str(limit))
    paths.clear_cache(root)
    stores = disk.stats["stores"]
    seen = []
    for _ in range(2):  # "twice": the second pass finds some artifacts evicted, stores again
        _pass(models, root, limit, seen)
    assert max(seen) <= limit, seen
    assert disk.stats["stores"] - stores > len(WIDTHS), disk.stats  # evicted, then made again


def test_small_writes_never_leave_the_folder_past_the_limit(tmp_path, monkeypatch) -> None:
    """Writes each under a twentieth of the limit (no look at the folder of their own) still
    evict when the folder would pass it: this process's size estimate (paths.stored)."""
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ANYCHIP_CACHE_LIMIT", "100K")
    monkeypatch.setattr(paths, "_written", {})
    limit = 100 << 10
    for i in range(200):
        paths.write_atomic(tmp_path / "calibration" / f"{i}.json", b"x" * 4000)
        assert _size(tmp_path) <= limit, (i, _size(tmp_path))
    assert _size(tmp_path) >= limit * 0.8  # evicted to 90%, not emptied


def test_a_linked_folder_counts_and_is_evicted_once(tmp_path, monkeypatch) -> None:
    """A test session links the user's built code into its cache folder (tests/conftest.py):
    what is written through the link counts against the limit; a link back up is walked once."""
    user, session = tmp_path / "user", tmp_path / "session"
    (user / "codegen").mkdir(parents=True)
    session.mkdir()
    (session / "codegen").symlink_to(user / "codegen", target_is_directory=True)
    (session / "codegen" / "loop").symlink_to(session, target_is_directory=True)
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(session))
    monkeypatch.setenv("ANYCHIP_CACHE_LIMIT", "40K")
    monkeypatch.setattr(paths, "_written", {})
    for i in range(30):
        paths.write_atomic(session / "codegen" / f"{i}.so", b"x" * 3000)
        assert _size(session) <= 40 << 10, i
    assert paths.cache_info(session)["codegen"][0] < 30  # the old ones went, through the link
    assert len(list((user / "codegen").glob("*.so"))) == paths.cache_info(session)["codegen"][0]


def test_opencl_binaries_are_counted_in_the_store(tmp_path, monkeypatch) -> None:
    """pyopencl's cache writes the binaries itself; anychip counts them after a build
    (backends/opencl/driver/programs.py), only when that folder is in the store."""
    from types import SimpleNamespace

    from anychip.backends.opencl.driver import programs

    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(paths, "_written", {str(tmp_path): (0, 0)})
    prg = SimpleNamespace(binaries=[b"x" * 100, b"y" * 20])
    programs._count(tmp_path / "opencl" / "pyopencl" / "key", prg)
    assert paths._written[str(tmp_path)] == (120, 120)
    programs._count(tmp_path.parent / "elsewhere", prg)  # ANYCHIP_COMPILE_CACHE=0's folder
    assert paths._written[str(tmp_path)] == (120, 120)
