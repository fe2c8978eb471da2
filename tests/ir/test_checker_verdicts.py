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


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """A cache folder of the test's own, and a count of onnx.checker's runs."""
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ANYCHIP_CHECKER_CACHE", raising=False)
    calls: list[int] = []
    real = onnx.checker.check_model

    def counted(*args: object, **kwargs: object) -> None:
        calls.append(1)
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(onnx.checker, "check_model", counted)
    return calls


def test_a_pass_is_remembered_for_the_same_bytes(checks: list[int], tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    import_model(path)
    assert len(checks) == 1
    assert len(list((tmp_path / "cache" / "checked").iterdir())) == 1
    import_model(path)
    import_model(path.read_bytes())  # the same bytes given as bytes
    assert len(checks) == 1


def test_an_edited_file_is_checked_again_and_a_bad_one_refused(
    checks: list[int], tmp_path: Path
) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    import_model(path)
    onnx.save(_model(scale=2.0), path)  # other weights: another key
    import_model(path)
    assert len(checks) == 2
    onnx.save(_model(bad=True), path)  # Relu has no alpha: the checker refuses it
    for _ in range(2):  # a failure is never remembered
        with pytest.raises(ModelError, match="onnx.checker"):
            import_model(path)
    assert len(checks) == 4
    assert len(list((tmp_path / "cache" / "checked").iterdir())) == 2


def test_protos_and_the_switch_check_every_time(
    checks: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proto = _model()
    import_model(proto)
    import_model(proto)
    assert len(checks) == 2
    assert not (tmp_path / "cache" / "checked").exists()
    monkeypatch.setenv("ANYCHIP_CHECKER_CACHE", "0")
    data = proto.SerializeToString()
    import_model(data)
    import_model(data)
    assert len(checks) == 4


def test_the_key_holds_onnx_version_and_free_dims(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _model().SerializeToString()
    base = _verdicts.verdict_path(data, None)
    assert base is not None
    assert _verdicts.verdict_path(data, {"n": 2}) != base
    assert _verdicts.verdict_path(data + b"\0", None) != base
    monkeypatch.setattr(onnx, "__version__", onnx.__version__ + ".other")
    assert _verdicts.verdict_path(data, None) != base


def test_a_damaged_record_is_no_pass(checks: list[int], tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    import_model(path)
    (record,) = (tmp_path / "cache" / "checked").iterdir()
    record.write_bytes(b"something else")
    import_model(path)
    assert len(checks) == 2


@pytest.fixture
def inferences(monkeypatch: pytest.MonkeyPatch, checks: list[int]) -> list[int]:
    """A count of shape inference's runs (beside the checker's)."""
    import onnx.shape_inference

    calls: list[int] = []
    real = onnx.shape_inference.infer_shapes

    def counted(*args: object, **kwargs: object) -> onnx.ModelProto:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", counted)
    return calls


def _shapes(model: object) -> str:
    return format_graph(model.graph)  # type: ignore[attr-defined]


def test_inferred_shapes_kept_for_the_same_bytes_only(
    inferences: list[int], tmp_path: Path
) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(n=4), path)
    first = _shapes(import_model(path))
    assert "[4]" in first  # the output's shape came from inference
    again = _shapes(import_model(path))
    assert again == first and len(inferences) == 1
    onnx.save(_model(n=7), path)  # the same graph with other shapes: inferred again
    other = _shapes(import_model(path))
    assert "[7]" in other and "[4]" not in other
    assert len(inferences) == 2
    verdict = _verdicts.verdict_path(path.read_bytes(), None)
    assert verdict is not None
    kept = tmp_path / "cache" / "shapes" / f"{verdict.stem}.pb"
    kept.write_bytes(kept.read_bytes()[:-3])  # damaged: refused by its digest, inferred again
    damaged = _shapes(import_model(path))
    assert damaged == other and len(inferences) == 3


def test_inference_warnings_issued_again_from_a_kept_result(
    inferences: list[int], tmp_path: Path
) -> None:
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
    assert len(inferences) == 1


def test_a_model_with_external_data_is_checked_every_time(
    inferences: list[int], checks: list[int], tmp_path: Path
) -> None:
    model = _model(n=1024)  # 4 KiB of weights, written beside the model
    path = tmp_path / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, size_threshold=0, location="w.bin")
    for _ in range(2):
        import_model(path)
    assert len(checks) == 2 and len(inferences) == 2
    assert not (tmp_path / "cache" / "checked").exists()
