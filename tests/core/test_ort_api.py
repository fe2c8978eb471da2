"""onnxruntime's interfaces on a Session: run options, free dimensions, optimization level,
threads, IO binding, run_async, model metadata, profiling (core/api/ort_api.py)."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.core.api.ort_api import RunOptions, RunTerminatedError
from anychip.errors import AnychipError, InputError, ModelError

RNG = np.random.default_rng(7)
W = RNG.standard_normal((4, 5)).astype(np.float32)
B = RNG.standard_normal(5).astype(np.float32)


def _mlp() -> bytes:
    """y = Relu(x @ W + B), x: [batch, 4]; producer and metadata for get_modelmeta."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Add", ["h", "B"], ["z"]),
        helper.make_node("Relu", ["z"], ["y"]),
    ]
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")]
    graph = helper.make_graph(nodes, "mlp", [x], [y], inits, doc_string="a small MLP")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.producer_name, model.domain, model.model_version = "tests", "ai.anychip", 3
    model.doc_string = "for get_modelmeta"
    helper.set_model_props(model, {"author": "ux", "task": "demo"})
    return model.SerializeToString()


def _ort(model: bytes, x: np.ndarray) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _x(batch: int) -> np.ndarray:
    return RNG.standard_normal((batch, 4)).astype(np.float32)


def test_terminate_before_a_run_refuses_it() -> None:
    sess = anychip.load(_mlp(), devices=["cpu"])
    with pytest.raises(RunTerminatedError, match="req-1: terminated .* before it started"):
        sess.run(None, {"x": _x(2)}, RunOptions(terminate=True, run_tag="req-1"))
    x = _x(2)
    (y,) = sess.run(None, {"x": x}, RunOptions(run_tag="req-2"))
    np.testing.assert_allclose(y, _ort(_mlp(), x), rtol=1e-5, atol=1e-6)


class _SetDuringRun:
    """onnxruntime's RunOptions shape, whose terminate is set once the run has started."""

    log_severity_level = 2
    logid = "flip"

    def __init__(self) -> None:
        self.reads = 0

    @property
    def terminate(self) -> bool:
        self.reads += 1
        return self.reads > 1


def test_terminate_set_during_a_run_drops_its_outputs() -> None:
    sess = anychip.load(_mlp(), devices=["cpu"])
    opts = _SetDuringRun()
    with pytest.raises(RunTerminatedError, match="flip: terminated .* while running"):
        sess.run(None, {"x": _x(2)}, opts)
    assert opts.reads == 2


def test_onnxruntime_run_options_are_honoured_and_others_refused() -> None:
    ort = pytest.importorskip("onnxruntime")
    sess = anychip.load(_mlp(), devices=["cpu"])
    ro = ort.RunOptions()
    ro.terminate = True
    with pytest.raises(RunTerminatedError):
        sess.run(None, {"x": _x(1)}, ro)
    with pytest.raises(AnychipError, match="run_options must be an anychip RunOptions"):
        sess.run(None, {"x": _x(1)}, {"terminate": True})


def test_free_dimension_override_fixes_the_input_shape() -> None:
    model = _mlp()
    sess = anychip.load(model, devices=["cpu"], free_dimension_overrides={"batch": 3})
    assert sess.inputs[0].shape == [3, 4]
    x = _x(3)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _ort(model, x), rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError):
        sess.run(None, {"x": _x(5)})
    with pytest.raises(ModelError, match=r"\['seq'\].*symbolic dimensions are \['batch'\]"):
        anychip.load(model, devices=["cpu"], free_dimension_overrides={"seq": 8})


def test_graph_optimization_level_by_onnxruntime_names() -> None:
    opts = anychip.SessionOptions
    assert opts(graph_optimization_level="disable_all").optimizes() is False
    assert opts(graph_optimization_level=0).optimizes() is False
    assert opts(graph_optimization_level="ORT_ENABLE_ALL").optimizes() is True
    assert opts(optimize=False).optimizes() is False
    with pytest.raises(AnychipError, match="graph_optimization_level 'fast'"):
        opts(graph_optimization_level="fast").optimizes()


def test_intra_op_num_threads_is_set_around_cpu_runs(monkeypatch) -> None:
    from anychip.backends.cpu.native import omp

    calls: list[int] = []
    real = omp.set_threads
    monkeypatch.setattr(omp, "set_threads", lambda n: (calls.append(n), real(n)))
    before = omp.max_threads()
    sess = anychip.load(_mlp(), devices=["cpu"], intra_op_num_threads=before + 1)
    x = _x(4)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _ort(_mlp(), x), rtol=1e-5, atol=1e-6)
    assert calls[:1] == [before + 1] and calls[-1] == before, calls
    with pytest.raises(AnychipError, match="intra_op_num_threads"):
        anychip.SessionOptions(intra_op_num_threads=-1)


def test_io_binding_keeps_inputs_and_outputs_across_runs() -> None:
    model = _mlp()
    sess = anychip.load(model, devices=["cpu"])
    binding = sess.io_binding()
    out = np.empty((2, 5), np.float32)
    binding.bind_output("y", out)
    for _ in range(2):
        x = _x(2)
        binding.bind_input("x", x)
        sess.run_with_iobinding(binding)
        (got,) = binding.get_outputs()
        assert got is out  # the same array, run after run
        np.testing.assert_allclose(out, _ort(model, x), rtol=1e-5, atol=1e-6)
    copy = binding.copy_outputs_to_cpu()[0]
    assert copy is not out and np.array_equal(copy, out)
    with pytest.raises(InputError, match="no input 'z'"):
        binding.bind_input("z", x)
    binding.bind_input("x", _x(3))
    with pytest.raises(InputError, match="bound output 'y' is float32\\[2, 5\\]"):
        binding.run()


def test_run_async_returns_futures_and_calls_back() -> None:
    model = _mlp()
    sess = anychip.load(model, devices=["cpu"])
    xs = [_x(i + 1) for i in range(4)]
    done = threading.Event()
    seen: list[tuple] = []

    def callback(outs, data, err) -> None:
        seen.append((data, err, outs))
        if len(seen) == len(xs):
            done.set()

    futures = [sess.run_async(None, {"x": x}, callback, i) for i, x in enumerate(xs)]
    for x, f in zip(xs, futures):
        np.testing.assert_allclose(f.result(timeout=60)[0], _ort(model, x), rtol=1e-5, atol=1e-6)
    assert done.wait(60)
    assert sorted(d for d, _, _ in seen) == [0, 1, 2, 3] and all(e == "" for _, e, _ in seen)
    bad = sess.run_async(None, {"x": np.zeros((2, 3), np.float32)})
    with pytest.raises(InputError):
        bad.result(timeout=60)
    sess.close()


def test_get_modelmeta() -> None:
    meta = anychip.load(_mlp(), devices=["cpu"]).get_modelmeta()
    assert (meta.producer_name, meta.graph_name, meta.domain) == ("tests", "mlp", "ai.anychip")
    assert meta.description == "for get_modelmeta" and meta.version == 3
    assert meta.graph_description == "a small MLP"
    assert meta.custom_metadata_map == {"author": "ux", "task": "demo"}


def test_profiling_on_the_session(tmp_path) -> None:
    prefix = str(tmp_path / "prof")
    sess = anychip.load(_mlp(), devices=["cpu"], enable_profiling=True, profile_file_prefix=prefix)
    with pytest.raises(AnychipError, match="has not run yet"):
        sess.end_profiling()
    sess.run(None, {"x": _x(2)})
    path = sess.end_profiling()
    assert path.startswith(prefix) and path.endswith(".json")
    events = json.loads(open(path).read())["traceEvents"]
    cats = {e.get("cat") for e in events}
    assert {"node", "partition"} <= cats, events[:5]
    assert any(str(e.get("name")).startswith("MatMul") for e in events if e.get("cat") == "node")
    with pytest.raises(AnychipError, match="enable_profiling=True"):
        anychip.load(_mlp(), devices=["cpu"]).end_profiling()


def test_export_and_load_compiled_round_trip(tmp_path, monkeypatch) -> None:
    import zipfile

    from anychip.core.compile import pipeline

    monkeypatch.setenv("ANYCHIP_COMPILE_CACHE", "1")
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path / "here"))
    model, x = _mlp(), _x(2)
    opts = dict(free_dimension_overrides={"batch": 2}, background_compile=False)
    sess = anychip.load(model, devices=["npu", "cpu"], cost_model=False, **opts)
    assert "npu" in sess.placement().by_device()
    want = sess.run(None, {"x": x})[0]
    archive = tmp_path / "mlp.anychip"
    sess.export_compiled(str(archive))
    with zipfile.ZipFile(archive) as z:
        assert any(n.startswith("compiled/") for n in z.namelist()), z.namelist()
    # another machine: an empty cache folder
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path / "there"))
    again = anychip.load_compiled(archive, background_compile=False)
    disk = pipeline.disk_for(pipeline.CompileOptions())
    assert disk is not None and disk.stats["hits"] >= 1 and disk.stats["stores"] == 0
    assert again.placement().by_device() == sess.placement().by_device()
    got = again.run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, _ort(model, x), rtol=1e-5, atol=1e-6)
    # an archive of another version is refused, naming both
    with zipfile.ZipFile(archive) as z:
        files = {n: z.read(n) for n in z.namelist()}
    meta = json.loads(files["placement.json"])
    meta["anychip"] = "0.0.1"
    files["placement.json"] = json.dumps(meta).encode()
    old = tmp_path / "old.anychip"
    with zipfile.ZipFile(old, "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
    with pytest.raises(ModelError, match="exported by anychip 0.0.1"):
        anychip.load_compiled(old)
    with pytest.raises(ModelError, match="not an anychip compiled archive"):
        anychip.load_compiled(model)  # bytes are no path: refused with the reason


def test_infer_queue_spreads_requests_over_sessions() -> None:
    model = _mlp()
    xs = [_x(3) for _ in range(6)]
    seen: list[tuple[int, str]] = []
    with anychip.InferQueue.spread(model, ["xpu", "cpu"]) as q:
        assert [s.devices for s in q.sessions] == [["xpu", "cpu"], ["cpu"]]
        q.set_callback(lambda outs, data, err: seen.append((data, err)))
        futures = [q.start_async({"x": x}, userdata=i) for i, x in enumerate(xs)]
        q.wait_all()
        for x, f in zip(xs, futures):
            np.testing.assert_allclose(f.result()[0], _ort(model, x), rtol=1e-5, atol=1e-6)
        assert sum(q.served) == 6 and min(q.served) >= 1, q.served  # both sessions ran
        bad = q.start_async({"x": np.zeros((3, 7), np.float32)})
        with pytest.raises(InputError):
            bad.result(timeout=60)
    assert sorted(d for d, e in seen if e == "") == list(range(6))
    with pytest.raises(AnychipError, match="at least one session"):
        anychip.InferQueue([])
