"""onnx.checker's passes and shape inference's results remembered across processes
(``ir/onnx/_verdicts.py``): used only for the very bytes they were made for, never for an
edited file, a failing model, a proto, or another onnx."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from anychip.errors import ModelError
from anychip.ir.onnx import _verdicts, import_model
from anychip.ir.printer import format_graph


def _model(bad: bool = False, scale: float = 1.0, n: int = 4) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.full((n,), scale, np.float32), "w")
    relu = helper.make_node("Relu", ["s"], ["y"], **({"alpha": 0.5} if bad else {}))
    nodes = [helper.make_node("Add", ["x", "w"], ["s"]), relu]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _counted(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(owner, name)

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


class Runs:
    """How many times the checker and shape inference ran."""

    def __init__(self, checks: list[int], inferences: list[int]) -> None:
        self.checks, self.inferences = checks, inferences

    def __call__(self) -> tuple[int, int]:
        return len(self.checks), len(self.inferences)


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Runs:
    """A cache folder of the test's own, every record kept however quick the work, and the
    checker's and inference's runs counted."""
    import onnx.shape_inference

    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ANYCHIP_CHECKER_CACHE", raising=False)
    monkeypatch.setattr(_verdicts, "WORTH_S", 0.0)
    return Runs(
        _counted(monkeypatch, onnx.checker, "check_model"),
        _counted(monkeypatch, onnx.shape_inference, "infer_shapes"),
    )


def _records(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "cache" / "imported"
    return sorted(folder.iterdir()) if folder.exists() else []


def test_kept_for_the_same_bytes(runs: Runs, tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    first = format_graph(import_model(path).graph)
    assert runs() == (1, 1) and len(_records(tmp_path)) == 1
    again = format_graph(import_model(path).graph)
    import_model(path.read_bytes())  # the same bytes given as bytes
    assert runs() == (1, 1)
    assert again == first and "[4]" in first  # the output's shape came from inference


def test_an_edited_file_is_checked_again_and_a_bad_one_refused(runs: Runs, tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(n=4), path)
    import_model(path)
    onnx.save(_model(n=7), path)  # the same graph with other shapes and weights
    other = format_graph(import_model(path).graph)
    assert "[7]" in other and "[4]" not in other
    assert runs() == (2, 2)
    onnx.save(_model(bad=True), path)  # Relu has no alpha: the checker refuses it
    for _ in range(2):  # a failure is never kept
        with pytest.raises(ModelError, match="onnx.checker"):
            import_model(path)
    assert runs() == (4, 2) and len(_records(tmp_path)) == 2


def test_protos_and_the_switch_check_every_time(
    runs: Runs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proto = _model()
    import_model(proto)
    import_model(proto)
    assert runs() == (2, 2) and not _records(tmp_path)
    monkeypatch.setenv("ANYCHIP_CHECKER_CACHE", "0")
    data = proto.SerializeToString()
    import_model(data)
    import_model(data)
    assert runs() == (4, 4) and not _records(tmp_path)


def test_quick_work_is_not_written(
    runs: Runs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_verdicts, "WORTH_S", 3600.0)
    data = _model().SerializeToString()
    import_model(data)
    import_model(data)
    assert runs() == (2, 2) and not _records(tmp_path)


def test_the_key_holds_onnx_version_and_free_dims(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _model().SerializeToString()
    base = _verdicts.record_path(data, None)
    assert base is not None
    assert _verdicts.record_path(data, {"n": 2}) != base
    assert _verdicts.record_path(data + b"\0", None) != base
    monkeypatch.setattr(onnx, "__version__", onnx.__version__ + ".other")
    assert _verdicts.record_path(data, None) != base


@pytest.mark.parametrize("damage", ["truncated", "replaced"])
def test_a_damaged_record_is_ignored(runs: Runs, tmp_path: Path, damage: str) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    first = format_graph(import_model(path).graph)
    (record,) = _records(tmp_path)
    body = record.read_bytes()
    record.write_bytes(body[:-3] if damage == "truncated" else b"something else")
    assert format_graph(import_model(path).graph) == first
    assert runs() == (2, 2)


def test_inference_warnings_issued_again_from_a_kept_result(runs: Runs) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 1])
    wrong = helper.make_tensor_value_info("r", TensorProto.FLOAT, [8, 32])
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [
        helper.make_node("ReduceSum", ["x", "axes"], ["r"], keepdims=1),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y], [axes], value_info=[wrong])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    for _ in range(2):
        with pytest.warns(UserWarning, match="'r' declared \\[8,32\\], inferred \\[8,1\\]"):
            import_model(data.SerializeToString())
    assert runs() == (1, 1)


def test_a_model_with_external_data_is_checked_every_time(runs: Runs, tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(n=1024), path, save_as_external_data=True, size_threshold=0, location="w")
    for _ in range(2):
        import_model(path)
    assert runs() == (2, 2) and not _records(tmp_path)
