"""What a user installs: one version, the extras, oneDNN by default, the files a package has."""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import anychip
from anychip.cli.main import main
from anychip.core.report.placement import log_fallbacks
from anychip.errors import warn_caller

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_lives_in_version_py_alone() -> None:
    project = _pyproject()["project"]
    assert "version" not in project and "version" in project["dynamic"]
    attr = _pyproject()["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "anychip.version.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+", anychip.__version__)
    assert f"## {anychip.__version__}" in (ROOT / "CHANGELOG.md").read_text()


def test_extras_and_the_default_onednn() -> None:
    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    wanted = {"viz", "opencl", "cuda", "iree", "openvino", "ort", "ray", "bench", "all"}
    assert wanted <= set(extras), wanted - set(extras)
    assert any(r.startswith("cupy-cuda12x[ctk]") for r in extras["cuda"])
    (everything,) = extras["all"]
    named = set(everything.split("[")[1].rstrip("]").split(","))
    assert named >= wanted - {"all"} and "test" not in named
    onednn = [r for r in project["dependencies"] if r.startswith("onednn-cpu-gomp")]
    assert onednn and "platform_machine == 'x86_64'" in onednn[0]
    assert "platform_system == 'Linux'" in onednn[0]
    assert all(";" in r for r in extras["iree"])  # Linux and macOS wheels only


def test_package_files_and_metadata() -> None:
    assert (ROOT / "py.typed").exists()
    assert _pyproject()["tool"]["setuptools"]["package-data"]["anychip"] == ["py.typed"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    project = _pyproject()["project"]
    assert "Typing :: Typed" in project["classifiers"] and project["urls"]


def test_readme_first_command_installs_no_test_toolchain() -> None:
    first = re.search(r"```bash\n(.+?)\n", (ROOT / "README.md").read_text()).group(1)
    assert "pip install" in first and "[test" not in first and "anychip demo" in first


def test_version_names_anychip_and_each_plugin(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"anychip {anychip.__version__}\n")
    assert re.search(r"^  cpu +\S+", out, re.M) and "numpy" in out
    assert re.search(r"^    npu \(revision [^)]+\): a simulation", out, re.M), out


def test_devices_marks_the_simulations(capsys) -> None:
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    for name in ("npu", "xpu"):
        assert re.search(rf"^{name}\s+{name}\s+simulated\s", out, re.M), out
    assert re.search(r"^cpu\s+cpu\s+yes\s", out, re.M), out
    rows = {d.name: d for d in anychip.devices()}
    assert rows["npu"].simulated and not rows["cpu"].simulated


def test_an_unavailable_first_device_is_named_with_why(caplog) -> None:
    graph = onnx.helper.make_graph([], "g", [], [])  # log_fallbacks reads nodes only
    with caplog.at_level(logging.WARNING, logger="anychip"):
        log_fallbacks(graph, ["cuda", "cpu"], {"cuda": "CuPy is not installed (x)"})
    (record,) = caplog.records
    assert record.getMessage() == (
        "anychip: cuda is not available: CuPy is not installed (x); its nodes run on cpu"
    )


def _declared_wrong() -> bytes:
    """Relu whose output is declared [5, 5] where inference gives [2, 3]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 5])
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


def test_warnings_point_at_the_callers_line() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = anychip.load(_declared_wrong(), devices=["cpu"])  # the line warned about
    ours = [w for w in caught if "declared shapes" in str(w.message)]
    assert ours, [str(w.message) for w in caught]
    assert ours[0].filename == __file__, ours[0].filename
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))


def test_warn_caller_from_outside_anychip_is_the_plain_caller() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_caller("here")
    assert caught[0].filename == __file__
