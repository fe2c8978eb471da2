"""Batch inference over a parquet data set on Ray Data, one anychip session per actor.

    pip install "anychip[ray]"
    python examples/ray_batch_inference.py                      # a local Ray cluster, 2 CPUs
    python examples/ray_batch_inference.py --devices npu,cpu    # actors on the (simulated) NPU
    python examples/ray_batch_inference.py --address auto       # an existing cluster (ray start)

Without ``--data`` it writes a data set first: ``--rows`` images of 3x32x32 (seeded random
pixels) with an ``id``, as parquet. Without ``--model`` it builds a small CNN classifier with
seeded random weights (Conv, Relu, GlobalAveragePool, Gemm, Softmax; a symbolic batch). Two
actors (``--actors``) of one thread each run it over the data set; the class probabilities are
written as parquet to ``--out`` with each row's ``id``, read back, and compared with one
anychip process running the same model over the same images.

On a cluster, start the head (``ray start --head``) and the workers (``ray start
--address=HEAD:6379``), declaring on each node that has a chip its resource:
``ray start --address=HEAD:6379 --resources='{"anychip_npu": 1}'``. Then run this script on
the head with ``--address auto --devices npu,cpu``; the actors are placed only on those nodes.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import onnx
import ray
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.integrations.ray import BatchInference


def small_cnn(classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """image[N, 3, 32, 32] -> probs[N, classes]: Conv 3x3, Relu, GlobalAveragePool, Gemm."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (16, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(0, 0.1, 16).astype(np.float32), "b"),
        numpy_helper.from_array(rng.normal(0, 0.5, (16, classes)).astype(np.float32), "fc"),
        numpy_helper.from_array(rng.normal(0, 0.1, classes).astype(np.float32), "fcb"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "small_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", classes])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def write_dataset(folder: str, rows: int) -> None:
    """``rows`` images with an ``id`` column, as parquet files in ``folder``."""
    images = np.random.default_rng(1).random((rows, 3, 32, 32), dtype=np.float32)
    items = [{"id": i, "image": images[i]} for i in range(rows)]
    ray.data.from_items(items, override_num_blocks=4).write_parquet(folder)


def check(model: str, devices: list[str], data: str, out: str) -> str:
    """The predictions in ``out`` against one anychip process over the images in ``data``."""
    images = ray.data.read_parquet(data).to_pandas().sort_values("id")
    predictions = ray.data.read_parquet(out).to_pandas().sort_values("id")
    probs = np.stack(predictions["probs"].to_numpy())
    x = np.stack(images["image"].to_numpy()).astype(np.float32)
    (alone,) = anychip.load(model, devices).run(None, {"image": x})
    diff = float(np.abs(probs - alone).max())
    verdict = "identical" if diff == 0 else f"max |difference| {diff:.2g}"
    return f"{len(probs)} predictions in {out}; against one anychip process: {verdict}"


def main() -> None:
    ap = argparse.ArgumentParser(description="anychip batch inference on Ray Data")
    ap.add_argument("--data", help="a parquet folder with 'id' and 'image' columns")
    ap.add_argument("--model", help="an .onnx file (default: a small CNN built here)")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "anychip-predictions"))
    ap.add_argument("--rows", type=int, default=2000, help="rows of the data set written here")
    ap.add_argument("--devices", default="cpu", help="each actor's devices, e.g. npu,cpu")
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--address", help="an existing Ray cluster ('auto'); default: a local one")
    args = ap.parse_args()

    if args.address:
        ray.init(address=args.address, log_to_driver=False, logging_level="ERROR")
    else:
        # A local cluster: a CPU per actor and one for Ray Data's read and write tasks (actors
        # holding every CPU would leave the reads waiting forever); the simulated NPU is
        # declared like a real chip's resource.
        ray.init(
            num_cpus=args.actors + 1,
            resources={"anychip_npu": args.actors},
            include_dashboard=False,
            log_to_driver=False,
            logging_level="ERROR",
        )
    ray.data.DataContext.get_current().enable_progress_bars = False
    work = tempfile.mkdtemp(prefix="anychip-ray-")
    model = args.model or os.path.join(work, "small_cnn.onnx")
    if not args.model:
        onnx.save(small_cnn(), model)
    data = args.data or os.path.join(work, "images")
    if not args.data:
        write_dataset(data, args.rows)

    job = BatchInference(
        model,
        args.devices.split(","),
        concurrency=args.actors,
        threads=1,
        batch_size=128,
        inputs={"image": "image"},
        keep_columns=["id"],
    )
    with job.errors():  # an actor's anychip error, raised as itself
        job.map(ray.data.read_parquet(data)).write_parquet(args.out)
    print(job.summary())

    print(check(model, args.devices.split(","), data, args.out))
    ray.shutdown()


if __name__ == "__main__":
    main()
