"""Background compiles on IREE devices (decision 046): with ``background_compile`` each
partition compiles once, from its symbolic graph, in a thread while the CPU serves its runs;
then the device serves every shape. Under ``strict=True`` nothing runs on the host: the
partition compiles at load."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

import anychip
from tests.backends.iree.conftest import backend_or_skip, close, model, reference, weight

F = TensorProto.FLOAT


def _mlp():
    rng = np.random.default_rng(7)
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w"], ["h"]), n("Relu", ["h"], ["r"]), n("Tanh", ["r"], ["y"])]
    return model(nodes, [("x", F, ["N", 6])], [("y", F, ["N", 6])], [weight(rng, "w", 6, 6)])


def _feeds(n: int) -> dict:
    return {"x": np.random.default_rng(n).standard_normal((n, 6)).astype(np.float32)}


def test_the_cpu_serves_while_the_partition_compiles():
    backend_or_skip("iree-cpu")
    m = _mlp()
    sess = anychip.load(m, devices=["iree-cpu", "cpu"], cost_model=False, background_compile=True)
    (sp,) = sess.compiled.specialized.values()
    assert sp.dynamic and not sp.cache  # nothing compiled at load
    (part,) = sess.placement().partitions
    assert "in the background" in part.info["shapes"]
    close(sess.run(None, _feeds(2)), reference(m, _feeds(2)))
    assert sp.stats["host_runs"] == 1
    assert sp.wait(300)
    assert sp.info["checked"] == "at its first run"  # the CPU's kernels never ran beside it
    for n in (1, 3, 5):  # one executable for every batch
        close(sess.run(None, _feeds(n)), reference(m, _feeds(n)))
    assert sp.stats["host_runs"] == 1 and sp.stats["compiles"] + sp.stats["disk_hits"] == 1
    assert len(sp.cache) == 1
    sess.close()


def test_strict_compiles_at_load():
    backend_or_skip("iree-cpu")
    m = _mlp()
    sess = anychip.load(m, devices=["iree-cpu"], strict=True, background_compile=True)
    assert not sess.compiled.specialized
    (part,) = sess.placement().partitions
    # compiled and checked now, or loaded from the disk cache, which holds only checked
    # compiles (the test above's background compile was stored after its checked first run)
    assert part.info.get("checked") == "matched the CPU" or "load_ms" in part.info, part.info
    close(sess.run(None, _feeds(4)), reference(m, _feeds(4)))
    sess.close()
