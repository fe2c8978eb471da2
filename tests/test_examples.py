"""``examples/``: the two backend packages of docs/writing-a-backend.md really work.

toychip (kernel style, its own heap) and ort (graph style, onnxruntime) are imported from their
folders and registered with ``register_plugin``; models built with ``onnx.helper`` (seeded
random inputs and weights) run on them and are compared with onnxruntime, the placement report
must show the claimed nodes on the example device, and toychip's heap must be empty again once
the session is gone. ``examples/count_lines.py`` holds toychip to its 60-line budget, and the
toychip package is built and installed with pip to show its entry point is found.
"""

from __future__ import annotations

import gc
import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.core.plugin import host as plugins
from anychip.zoo import light_model

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TOYCHIP_BUDGET = 60


def _plugin_fixture(folder: str, module: str, name: str):
    path = str(EXAMPLES / folder)
    sys.path.insert(0, path)
    try:
        mod = importlib.import_module(module)
        plugins.register_plugin(mod, name)
        yield mod
    finally:
        plugins.unregister_plugin(name)
        sys.path.remove(path)


@pytest.fixture
def toychip():
    yield from _plugin_fixture("anychip-toychip", "anychip_toychip", "toychip")


@pytest.fixture
def ort_plugin():
    # "ort" is anychip's own onnxruntime plugin (backends/ort), registered already
    yield from _plugin_fixture("anychip-ort", "anychip_ort", "ort.example")


def _model(nodes, inputs, outputs, weights, opset: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(w, n) for n, w in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7  # what onnxruntime and opsets 7..21 all accept
    onnx.checker.check_model(model)
    return model


def _reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return sess.run(None, feeds)


def _mlp(opset: int, rng: np.random.Generator) -> onnx.ModelProto:
    """MatMul -> Add -> Relu -> Mul -> Softmax over the last axis of a [3, 8] input."""
    weights = {
        "W": rng.standard_normal((8, 5)).astype(np.float32),
        "b": rng.standard_normal(5).astype(np.float32),
        "s": rng.uniform(0.5, 1.5, 5).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Mul", ["r", "s"], ["q"]),
        helper.make_node("Softmax", ["q"], ["y"], axis=1),
    ]
    return _model(nodes, [("x", [3, 8])], [("y", [3, 5])], weights, opset)


# -- toychip ------------------------------------------------------------------------------------
@pytest.mark.parametrize("opset", [7, 9, 11, 13, 14, 21])
def test_toychip_runs_an_mlp_like_onnxruntime(toychip, opset: int) -> None:
    rng = np.random.default_rng(opset)
    model = _mlp(opset, rng)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    sess = anychip.load(model, devices=["toychip", "cpu"], cost_model=False)
    (y,) = sess.run(None, {"x": x})
    (ref,) = _reference(model, {"x": x})
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    assert sess.placement().by_device() == {"toychip": 5}, sess.placement()
    stats = toychip.ToyChip().memory_stats()
    assert stats.in_use > 0  # the weights live in the heap while the session does
    report = str(sess.memory())
    assert "toychip" in report
    del sess
    gc.collect()
    stats = toychip.ToyChip().memory_stats()
    assert stats.in_use == 0 and stats.live_blocks == 0, stats


@pytest.mark.parametrize(
    ("opset", "axis"), [(9, 1), (11, -2), (11, 0), (11, 2), (13, 1), (13, -3), (21, 2)]
)
def test_toychip_softmax_semantics_per_opset(toychip, opset: int, axis: int) -> None:
    """Softmax before opset 13 flattens at ``axis``; from 13 on it works along ``axis`` alone.
    On a 3-D input the two differ, so a kernel claiming the wrong range fails here."""
    rng = np.random.default_rng(100 + opset + axis)
    node = helper.make_node("Softmax", ["x"], ["y"], axis=axis)
    model = _model([node], [("x", [2, 3, 4])], [("y", [2, 3, 4])], {}, opset)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32) * 3
    sess = anychip.load(model, devices=["toychip", "cpu"], cost_model=False)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, _reference(model, {"x": x})[0], rtol=1e-5, atol=1e-7)
    assert sess.placement().by_device() == {"toychip": 1}


def test_toychip_broadcasting_elementwise(toychip) -> None:
    rng = np.random.default_rng(7)
    nodes = [
        helper.make_node("Add", ["x", "c"], ["a"]),
        helper.make_node("Mul", ["a", "x"], ["y"]),
    ]
    c = rng.standard_normal((4, 1)).astype(np.float32)
    model = _model(nodes, [("x", [2, 1, 5])], [("y", [2, 4, 5])], {"c": c}, 13)
    x = rng.standard_normal((2, 1, 5)).astype(np.float32)
    sess = anychip.load(model, devices=["toychip", "cpu"], cost_model=False)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _reference(model, {"x": x})[0])
    assert sess.placement().by_device() == {"toychip": 2}


def test_toychip_leaves_unclaimed_ops_to_the_cpu(toychip) -> None:
    """Add-6 (opset 6, with broadcast attributes) is outside the since=7 range, so it falls back
    with the kernel table's reason; the Relu next to it (Relu-6) stays on toychip."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    model = _model(nodes, [("x", [4])], [("y", [4])], {}, 6)
    x = rng.standard_normal(4).astype(np.float32)
    sess = anychip.load(model, devices=["toychip", "cpu"], cost_model=False)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.maximum(x + x, 0))
    where = {n.op_type: (n.device, n.reason) for n in sess.placement().nodes}
    assert where["Relu"][0] == "toychip"
    assert where["Add"][0] == "cpu" and "version 6" in where["Add"][1], where


@pytest.mark.parametrize(
    "array",
    [
        np.zeros((0,), np.float32),
        np.zeros((3, 0, 2), np.float32),
        np.float32(2.5).reshape(()),
        np.array([7.0], np.float32),
        np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2],  # non-contiguous
        np.arange(24, dtype=np.float32).reshape(2, 3, 4).transpose(2, 0, 1),
        np.array([np.nan, -0.0, np.inf, -np.inf, 1e-45], np.float32),  # odd float bit patterns
        np.arange(-3, 4, dtype=np.int64),
        np.array([[True, False, True]]),
        np.arange(5, dtype=np.float16)[::-1],
    ],
    ids=lambda a: f"{a.dtype}{list(a.shape)}{'' if a.flags.c_contiguous else '-strided'}",
)
def test_toychip_copy_round_trip_preserves_bytes(toychip, array: np.ndarray) -> None:
    chip = toychip.ToyChip()
    before = chip.memory_stats().in_use
    tensor = chip.to_device(array)
    assert not isinstance(tensor, np.ndarray)  # a handle into the heap, not host memory
    back = chip.to_host(tensor)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tobytes() == np.ascontiguousarray(array).tobytes()
    assert not np.shares_memory(back, chip.to_host(tensor))  # every copy out is fresh
    chip.release(tensor)
    assert chip.memory_stats().in_use == before


def test_toychip_heap_full_is_out_of_memory(toychip) -> None:
    chip = toychip.ToyChip()
    kept = chip.to_device(np.ones(1000, np.float32))
    with pytest.raises(anychip.OutOfMemoryError) as err:
        chip.to_device(np.zeros(chip.device.memory_capacity + 1, np.uint8))
    assert err.value.need > chip.device.memory_capacity - chip.memory_stats().in_use
    np.testing.assert_array_equal(chip.to_host(kept), np.ones(1000, np.float32))
    chip.release(kept)
    assert chip.memory_stats().in_use == 0


# -- the line budget ------------------------------------------------------------------------------
def _count_lines_module():
    spec = importlib.util.spec_from_file_location("count_lines", EXAMPLES / "count_lines.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_count_lines_counts_only_code() -> None:
    source = '''"""Module docstring,
over two lines."""

import os  # a comment after code counts


def f(a,
      b):
    """Docstring."""
    # a comment line
    text = """not a docstring:
    every line counts"""
    return (a +
            b)
'''
    # import, def (2 lines), text = (2 lines), return (2 lines)
    assert _count_lines_module().count_source(source) == 7


def test_toychip_is_at_most_60_lines() -> None:
    tool = EXAMPLES / "count_lines.py"
    folder = EXAMPLES / "anychip-toychip"
    done = subprocess.run(
        [sys.executable, str(tool), str(folder), "--max", str(TOYCHIP_BUDGET)],
        capture_output=True,
        text=True,
        check=False,
    )
    total = int(done.stdout.strip().splitlines()[-1].split()[0])
    assert total <= TOYCHIP_BUDGET and done.returncode == 0, done.stdout + done.stderr
    assert f"**{total} lines of Python**" in (folder / "README.md").read_text(encoding="utf-8")


def test_ort_line_count_is_stated() -> None:
    folder = EXAMPLES / "anychip-ort"
    total = sum(_count_lines_module().count_lines([folder]).values())
    assert f"**{total} lines of Python**" in (folder / "README.md").read_text(encoding="utf-8")


# -- packaging --------------------------------------------------------------------------------
def _can_build_wheels() -> bool:
    """setuptools builds wheels itself from 70.1 on; before, it needs the wheel package."""
    version = importlib.metadata.version("setuptools")
    if tuple(int(p) for p in version.split(".")[:2]) >= (70, 1):
        return True
    return importlib.util.find_spec("wheel") is not None


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
def test_toychip_installs_and_is_found_by_its_entry_point(tmp_path: Path) -> None:
    if not _can_build_wheels():
        pytest.skip("building needs setuptools>=70.1 (the test extra) or the wheel package")
    source = tmp_path / "src"
    shutil.copytree(EXAMPLES / "anychip-toychip", source)  # builds leave files next to the source
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "--target", str(target), str(source)],
        check=True,
        capture_output=True,
        text=True,
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target)] + sys.path))
    done = subprocess.run(
        [sys.executable, "-m", "anychip", "devices"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    )
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()[1:] if line}
    assert "toychip" in rows, done.stdout
    assert rows["toychip"][2] == "yes" and rows["toychip"][4] == "toychip", done.stdout


# -- ort ----------------------------------------------------------------------------------------
def test_ort_runs_a_light_cnn_like_onnxruntime(ort_plugin) -> None:
    model = light_model("squeezenet", seed=3)
    weights = {init.name for init in model.graph.initializer}
    (inp,) = [i for i in model.graph.input if i.name not in weights]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    sess = anychip.load(model, devices=["ort", "cpu"])
    (y,) = sess.run(None, {inp.name: x})
    (ref,) = _reference(model, {inp.name: x})
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
    report = sess.placement()
    assert report.by_device() == {"ort": len(model.graph.node)}, report
    assert len(report.partitions) == 1 and report.partitions[0].info["nodes"] > 0
    a = np.ones(3, np.float32)
    assert ort_plugin.backend.OrtBackend().to_device(a) is a  # host memory: no real copy


def test_ort_refuses_types_its_cpu_kernels_lack(ort_plugin) -> None:
    """onnxruntime's CPU Relu-14 takes float, double, int8 and int32, not int64: that Relu falls
    back to anychip's CPU with the reason, the float MLP around it stays on ort."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"]),
            helper.make_node("Relu", ["m"], ["y"]),
            helper.make_node("Relu", ["k"], ["ky"]),
        ],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
            helper.make_tensor_value_info("k", TensorProto.INT64, [3]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("ky", TensorProto.INT64, [3]),
        ],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 7
    x = rng.standard_normal((2, 6)).astype(np.float32)
    k = rng.integers(-5, 5, 3)
    sess = anychip.load(model, devices=["ort", "cpu"], cost_model=False)
    y, ky = sess.run(None, {"x": x, "k": k})
    np.testing.assert_allclose(y, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ky, np.maximum(k, 0))
    where = {n.name: (n.device, n.reason) for n in sess.placement().nodes}
    assert [d for d, _ in where.values()] == ["ort", "ort", "cpu"], where
    assert "tensor(int64)" in where[sess.placement().nodes[2].name][1]


def test_ort_refuses_nested_graphs(ort_plugin) -> None:
    """An If reads outer values from its branches; exported alone it could not, so it stays on
    the CPU while the Add feeding it runs on ort."""
    rng = np.random.default_rng(6)

    def branch(op: str) -> onnx.GraphProto:
        out = helper.make_tensor_value_info(f"{op}_out", TensorProto.FLOAT, [4])
        return helper.make_graph([helper.make_node(op, ["s"], [f"{op}_out"])], op, [], [out])

    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "x"], ["s"]),
            helper.make_node("ReduceSum", ["s"], ["t"], keepdims=0),
            helper.make_node("Greater", ["t", "zero"], ["c"]),
            helper.make_node(
                "If", ["c"], ["y"], then_branch=branch("Relu"), else_branch=branch("Neg")
            ),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.zeros((), np.float32), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    x = rng.standard_normal(4).astype(np.float32)
    sess = anychip.load(model, devices=["ort", "cpu"], cost_model=False)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _reference(model, {"x": x})[0])
    where = {n.op_type: (n.device, n.reason) for n in sess.placement().nodes}
    assert where["Add"][0] == "ort", where
    assert where["If"][0] == "cpu" and "nested graphs" in where["If"][1], where
