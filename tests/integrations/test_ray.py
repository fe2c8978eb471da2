"""``anychip.integrations.ray`` on a real local Ray cluster (two CPUs, two actors).

Every prediction of a Ray job is compared with a single-process anychip run of the same model
on the same rows, and with onnxruntime. The models are small (a seeded random MLP with a
symbolic batch, a BERT-like layer of sequence 8 with a fixed batch of 1), so the module costs
Ray's start-up and a few actor starts. The checks that need a cluster run in one test
(``test_on_one_local_ray_cluster``) on one cluster started by a module fixture and shut down
after, so the parallel suite (pytest-xdist, ``-n auto``) starts one cluster in one worker, not
one per worker (``xdist_group`` with ``--dist loadgroup`` did not group them with pytest 9.2
and pytest-xdist 3.8 here).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.errors import AnychipError, ModelError, UnsupportedOpError
from anychip.integrations.ray import (
    ActorLoadError,
    BatchError,
    BatchInference,
    resources_for,
)
from tests.models import transformer_layer

ray = pytest.importorskip("ray")  # in the test extra: CI runs these

# two one-CPU actors on two CPUs: the warning is for pipelines that read files (these data
# sets are in memory)
pytestmark = pytest.mark.filterwarnings("ignore:the 2 actors ask for 2")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
def test_on_one_local_ray_cluster(cluster: object, tmp_path: Path) -> None:
    """Every check that needs the cluster, in one test: one cluster in one pytest-xdist worker
    (the suite runs with -n auto, and Ray's start-up is the cost)."""
    check_the_example_runs_as_written(tmp_path)  # first: its one actor needs a CPU free
    check_two_actors_match_one_process_on_every_row()
    check_per_row_tensors_on_the_npu_resource()
    check_a_failing_batch_names_the_batch_rows_and_actor()
    check_a_model_an_actor_cannot_load_fails_with_the_anychip_error()
    check_a_missing_chip_resource_is_named_before_the_job_starts()


def mlp(seed: int = 0, features: int = 16) -> onnx.ModelProto:
    """x[N, features] -> MatMul, Add, Relu, MatMul -> y[N, 4]; seeded random weights."""
    rng = np.random.default_rng(seed)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [w("w1", features, 32), w("b1", 32), w("w2", 32, 4)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def cluster():
    for attempt in (1, 2):  # Ray gives its node 30 s to start; a busy shared machine can miss it
        try:
            ray.init(
                address="local",
                num_cpus=2,
                resources={"anychip_npu": 2},  # the simulated NPU, declared like a real chip's
                include_dashboard=False,
                log_to_driver=False,
                logging_level="ERROR",
            )
            break
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


def _rows(ds_out: object, column: str) -> tuple[np.ndarray, np.ndarray]:
    parts = ray.get(ds_out.to_numpy_refs())
    ids = np.concatenate([p["id"] for p in parts])
    ys = np.concatenate([p[column] for p in parts])
    order = np.argsort(ids)
    return ids[order], ys[order]


def check_two_actors_match_one_process_on_every_row() -> None:
    model = mlp()
    x = np.random.default_rng(1).standard_normal((3000, 16)).astype(np.float32)
    ds = ray.data.from_items([{"id": i, "x": x[i]} for i in range(len(x))], override_num_blocks=12)
    job = BatchInference(
        model,
        ["cpu"],
        concurrency=2,
        threads=1,
        batch_size=250,
        keep_columns=["id"],
        outputs={"y": "pred"},
    )
    ids, pred = _rows(job.run(ds), "pred")
    assert ids.tolist() == list(range(len(x)))
    (alone,) = anychip.load(model, ["cpu"]).run(None, {"x": x})
    # Batches of 250 or fewer rows against one batch of 3000: a row's dot products are summed
    # in the same order, but BLAS may pick another kernel for another row count.
    np.testing.assert_allclose(pred, alone, rtol=1e-5, atol=1e-5)
    (ort,) = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(pred, ort, rtol=1e-4, atol=1e-4)
    stats = job.stats()
    assert len(stats) == 2 and all(s.rows > 0 for s in stats), job.summary()
    assert sum(s.rows for s in stats) == len(x)
    assert all(s.blas_threads == 1 for s in stats), job.summary()
    assert {s.actor for s in stats} and all(s.placement == {"cpu": 4} for s in stats)
    assert "rows/s" in job.summary()


def check_per_row_tensors_on_the_npu_resource() -> None:
    """A fixed-batch transformer (one row per run) over rows stored as arrays, on actors that
    ask for the ``anychip_npu`` resource and place the layer on the (simulated) NPU."""
    model = transformer_layer(seq=8, hidden=32, heads=2, ffn=64, seed=3)
    x = np.random.default_rng(2).standard_normal((120, 8, 32)).astype(np.float32)
    ds = ray.data.from_items([{"id": i, "x": x[i]} for i in range(len(x))], override_num_blocks=6)
    # prefer-first: the NPU takes every node it can. Under the default policy the feedback may
    # measure this small layer faster on the CPU alone and keep that, as it should.
    job = BatchInference(
        model,
        ["npu", "cpu"],
        concurrency=2,
        batch_size=16,
        keep_columns=["id"],
        load_options={"placement_policy": "prefer-first"},
    )
    assert job.map_batches_kwargs()["resources"] == {"anychip_npu": 1}
    ids, y = _rows(job.run(ds), "y")
    alone = anychip.load(model, ["npu", "cpu"], placement_policy="prefer-first")
    expected = np.concatenate([alone.run(None, {"x": x[i : i + 1]})[0] for i in range(len(x))])
    # Not bit for bit: the host serves a signature's runs while the NPU compiles it, so a row may
    # have run on the cpu's kernels in one process and on the NPU's in the other.
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    ort = onnxruntime.InferenceSession(model.SerializeToString())
    ref = np.concatenate([ort.run(None, {"x": x[i : i + 1]})[0] for i in range(len(x))])
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    assert all(s.placement.get("npu", 0) > 0 for s in job.stats()), job.summary()


def check_a_failing_batch_names_the_batch_rows_and_actor() -> None:
    rows = [{"id": i, "x": np.ones(15 if i == 130 else 16, np.float32)} for i in range(200)]
    ds = ray.data.from_items(rows, override_num_blocks=4)
    job = BatchInference(mlp(), ["cpu"], concurrency=1, batch_size=50, id_column="id")
    with pytest.raises(BatchError) as info:
        job.run(ds)
    message = str(info.value)
    assert "id 100..149" in message and "50 rows" in message, message
    assert "of actor " in message and "different shapes" in message, message


def check_a_model_an_actor_cannot_load_fails_with_the_anychip_error() -> None:
    # strict npu: the Erf-free graph below has an op the NPU lacks (validate=None lets it by)
    graph = helper.make_graph(
        [helper.make_node("Sin", ["x"], ["y"])],
        "sin",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ds = ray.data.from_items([{"x": np.ones(4, np.float32)}] * 8)
    job = BatchInference(model, ["npu"], validate=None, load_options={"strict": True})
    with pytest.raises(ActorLoadError, match="could not load the model.*Sin"):
        job.run(ds)
    with pytest.raises(AnychipError, match="Sin"):  # checked in the driver by default
        BatchInference(model, ["npu"], load_options={"strict": True})


def check_a_missing_chip_resource_is_named_before_the_job_starts() -> None:
    job = BatchInference(mlp(), ["xpu", "cpu"])
    with pytest.raises(AnychipError, match="anychip_xpu.*ray start --resources"):
        job.map(ray.data.from_items([{"x": np.ones(16, np.float32)}]))


def check_the_example_runs_as_written(tmp_path: Path) -> None:
    # On this module's cluster (2 CPUs: one actor, one CPU left for the parquet reads and
    # writes); run alone, the example starts its own local cluster.
    address = ray.get_runtime_context().gcs_address
    script = ROOT / "examples" / "ray_batch_inference.py"
    args = ["--rows", "300", "--actors", "1", "--address", address, "--out", str(tmp_path / "p")]
    done = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "300 predictions" in done.stdout and "identical" in done.stdout, done.stdout


def test_a_bad_model_fails_in_the_driver_without_ray() -> None:
    with pytest.raises(ModelError, match="not an ONNX model"):
        BatchInference(b"not a model")
    bad = mlp()
    bad.graph.node[2].op_type = "NoSuchOp"
    with pytest.raises((UnsupportedOpError, ModelError)):
        BatchInference(bad, ["cpu"])


def test_resources_follow_the_device_kinds() -> None:
    assert resources_for(["cpu"], threads=2) == {"num_cpus": 2}
    assert resources_for(None) == {"num_cpus": 1}
    assert resources_for("cuda:0,cpu") == {"num_cpus": 1, "num_gpus": 1}
    assert resources_for(["npu:1", "xpu", "cpu"]) == {
        "num_cpus": 1,
        "resources": {"anychip_npu": 1, "anychip_xpu": 1},
    }


def test_the_public_names_are_documented() -> None:
    import anychip.integrations.ray as module

    assert module.__doc__
    for name in module.__all__:
        assert getattr(module, name).__doc__, name


def test_without_ray_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from anychip.integrations import _ray_support

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(AnychipError, match=r"pip install 'anychip\[ray\]'"):
        _ray_support.import_ray()
