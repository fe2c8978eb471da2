"""Racing first use: a script that loads its first session from 8 threads at once.

Run in a brand-new process (``tests/test_threads.py`` starts it with ``python -P``)::

    python -P tests/thread_race.py npu,cpu [threads] [runs]

Every thread waits at one barrier, then loads its own session of a small MLP on the given
devices (the process's first: the backends' lazily created device objects, the NPU's memory
and the XPU driver, are created by whichever thread gets there first) and runs it ``runs``
times on seeded random inputs. Afterwards the main thread runs every input again, serially, on
a fresh session, and compares bit for bit. The exit status is 0 only when every thread
succeeded, placed nodes on the accelerator, had no device fail during its runs (failover would
otherwise hide a failure by re-running on the host), and matched the serial results; failures
are printed one per line.

The model builder is shared with ``tests/test_threads.py``.
"""

from __future__ import annotations

import sys
import threading
import traceback

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["mlp_model", "feeds_for", "load_session", "race"]

BATCH, HIDDEN, OUT = 16, 64, 32


def mlp_model(seed: int = 0) -> bytes:
    """MatMul + Add + Relu + MatMul + Add + Softmax (opset 17): ops both the XPU and the NPU
    claim, with seeded random weights."""
    rng = np.random.default_rng(seed)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        n("Add", ["h0", "b1"], ["h1"], name="bias1"),
        n("Relu", ["h1"], ["h2"], name="relu"),
        n("MatMul", ["h2", "w2"], ["h3"], name="fc2"),
        n("Add", ["h3", "b2"], ["h4"], name="bias2"),
        n("Softmax", ["h4"], ["y"], axis=-1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, OUT])],
        [w("w1", HIDDEN, HIDDEN), w("b1", HIDDEN), w("w2", HIDDEN, OUT), w("b2", OUT)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


def feeds_for(seed: int) -> dict[str, np.ndarray]:
    """The seeded random input of one run."""
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((BATCH, HIDDEN)).astype(np.float32)}


def load_session(model: bytes, devices: list[str]):
    import anychip

    # cost_model=False: so small a model would be kept on the host by the cost model, and the
    # point is to exercise the accelerators.
    return anychip.load(model, devices=devices, calibration="off", cost_model=False)


def race(devices: list[str], threads: int = 8, runs: int = 3) -> list[str]:
    """Races the first load of ``devices`` across ``threads``; returns the failures."""
    model = mlp_model()
    barrier = threading.Barrier(threads)
    results: dict[tuple[int, int], np.ndarray] = {}
    failures: list[str] = []

    def work(t: int) -> None:
        try:
            barrier.wait()
            sess = load_session(model, devices)
            placed = sess.placement().by_device()
            if not placed.get(devices[0]):
                failures.append(f"thread {t}: nothing placed on {devices[0]}: {placed}")
            for r in range(runs):
                results[t, r] = sess.run(None, feeds_for(1000 * t + r))[0]
            if sess.unhealthy:  # a device failed and failover hid it by re-running elsewhere
                failures.append(f"thread {t}: devices failed during runs: {sess.unhealthy}")
        except Exception:
            failures.append(f"thread {t}: {traceback.format_exc(limit=3)}")

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    serial = load_session(model, devices)
    for (t, r), got in sorted(results.items()):
        want = serial.run(None, feeds_for(1000 * t + r))[0]
        if not np.array_equal(got, want):
            failures.append(f"thread {t} run {r}: differs from the serial run")
    return failures


def main(argv: list[str]) -> int:
    devices = argv[0].split(",")
    threads = int(argv[1]) if len(argv) > 1 else 8
    runs = int(argv[2]) if len(argv) > 2 else 3
    failures = race(devices, threads, runs)
    for f in failures:
        print(f.replace("\n", " | "))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
