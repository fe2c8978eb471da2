"""oneDNN primitives run on a thread other than the one that made them (decision 057).

oneDNN's library-managed scratchpad is a buffer per thread, found in the running thread's
thread-local storage: a cached primitive (a GEMM convolution's im2col) run on another thread
wrote to that thread's buffer, NULL there (a SIGSEGV that killed the host process: a CPU
reference in a new thread after IREE's checks) or sized for other primitives (a silent heap
overflow). Every primitive now asks for a user scratchpad and its ``Prim`` owns it. The
crashing scenarios run in a fresh interpreter, so a segfault fails the test instead of
killing pytest.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.cpu.onednn import _lib
from anychip.backends.cpu.onednn import _prim as P
from anychip.backends.cpu.onednn._lib import C

F = TensorProto.FLOAT

#: Made and run in a fresh interpreter: a 1x1 stride-2 Conv on a plain NCHW source (oneDNN's
#: ``gemm:jit`` with an im2col scratchpad here, ResNet-50's downsampling convs) evaluated node
#: by node as the IREE probes' CPU reference does, first on one thread then on others; a
#: thread that made a smaller GEMM convolution first (its own buffer too small for the big
#: one's im2col) runs the big one last. Each result is compared with numpy's.
_SCRIPT = r"""
import sys, threading, faulthandler
faulthandler.enable()
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import anychip
from anychip.core.plugin.host import get_registry
from anychip.core.run.kernel_call import evaluate_node
from anychip.ir.onnx import import_model

mode = sys.argv[1]
if mode == "iree":  # IREE's runtime runs a module in this process first (how it was found)
    from anychip.core.plugin.host import get_registry as _reg
    b = _reg(["iree-cpu"]).backends.get("iree-cpu")
    ok, why = (False, "no iree-cpu device registered") if b is None else b.available()
    if not ok:
        print("SKIP", why)
        sys.exit(0)
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    s = anychip.load(m, devices=["iree-cpu"], strict=True, cost_model=False)
    assert s.run(None, {"x": np.ones((4, 4), np.float32)})[0].sum() == 16

rng = np.random.default_rng(0)
table = get_registry(["cpu"]).kernel_table("cpu")


def conv_node(c_in, c_out, h):
    w = (rng.standard_normal((c_out, c_in, 1, 1)) * 0.1).astype(np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2])], "c",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, h, h])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")])
    node = import_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    x = rng.standard_normal((1, c_in, h, h)).astype(np.float32)
    want = np.einsum("oc,nchw->nohw", w[:, :, 0, 0], x[:, :, ::2, ::2])
    return node.graph.nodes[0], x, w, want


big, small = conv_node(256, 512, 56), conv_node(8, 16, 8)


def run(case, where):
    node, x, w, want = case
    y = np.asarray(evaluate_node(node, [x, w], table)[0])
    err = float(np.abs(y - want).max())
    assert err < 1e-3, (where, err)
    print(where, "ok", err, flush=True)


def in_thread(*steps):
    errors = []
    def go():
        try:
            for case, where in steps:
                run(case, where)
        except BaseException as e:
            errors.append(e)
    t = threading.Thread(target=go)
    t.start()
    t.join()
    if errors:
        raise errors[0]


in_thread((big, "made on a thread"))
in_thread((big, "run on another thread"))
run(big, "run on the main thread")
in_thread((small, "a small one made"), (big, "run where a small one was made"))

# a session made on this thread, run on others (run_async, a server's workers)
nhwc = helper.make_graph(
    [helper.make_node("Conv", ["x", "w"], ["a"], strides=[2, 2]),
     helper.make_node("Relu", ["a"], ["r"]),
     helper.make_node("Conv", ["r", "w3"], ["y"], pads=[1, 1, 1, 1])], "s",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 56, 56])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    [numpy_helper.from_array((rng.standard_normal(s) * 0.1).astype(np.float32), k)
     for k, s in (("w", (128, 64, 1, 1)), ("w3", (32, 128, 3, 3)))])
sess = anychip.load(helper.make_model(nhwc, opset_imports=[helper.make_opsetid("", 17)]),
                    devices=["cpu"])
feeds = {"x": rng.standard_normal((1, 64, 56, 56)).astype(np.float32)}
first = np.asarray(sess.run(None, feeds)[0]).copy()
outs = []
for _ in range(2):
    t = threading.Thread(target=lambda: outs.append(np.asarray(sess.run(None, feeds)[0]).copy()))
    t.start()
    t.join()
assert len(outs) == 2 and all(np.array_equal(o, first) for o in outs), "session on threads"
print("DONE")
"""


def _fresh(mode: str) -> subprocess.CompletedProcess:
    # this anychip first (its folder's parent: the one that imports it as ``anychip``)
    here = str(Path(anychip.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, *sys.path])}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SCRIPT), mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def _check(proc: subprocess.CompletedProcess) -> None:
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, f"exit {proc.returncode} (-11: SIGSEGV):\n{tail}"
    if proc.stdout.startswith("SKIP"):
        pytest.skip(proc.stdout.strip())
    assert "DONE" in proc.stdout, tail


def test_a_primitive_runs_on_threads_other_than_its_maker() -> None:
    assert _lib.available(), _lib.unavailable_reason()
    _check(_fresh("threads"))


@pytest.mark.skipif(
    importlib.util.find_spec("iree") is None or importlib.util.find_spec("iree.runtime") is None,
    reason="IREE is not installed (pip install 'anychip[iree]')",
)
def test_the_cpu_reference_in_a_thread_after_iree_ran() -> None:
    """The scenario that killed the process: ``anychip.load(..., devices=["iree-cpu"])``
    first, then the probes' CPU reference on new threads."""
    assert _lib.available(), _lib.unavailable_reason()
    _check(_fresh("iree"))


def _model() -> tuple:
    rng = np.random.default_rng(3)
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1"], ["a"], strides=[2, 2]),  # 1x1 stride 2: GEMM, im2col
        n("Conv", ["a", "w3"], ["b"], pads=[1, 1, 1, 1]),
        n("MaxPool", ["b"], ["c"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Flatten", ["c"], ["d"]),
        n("MatMul", ["d", "wm"], ["y"]),
    ]
    weights = {
        "w1": rng.standard_normal((32, 16, 1, 1)) * 0.2,
        "w3": rng.standard_normal((32, 32, 3, 3)) * 0.1,
        "wm": rng.standard_normal((32 * 7 * 7, 10)) * 0.05,
    }
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, [1, 16, 28, 28])],
        [helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model, {"x": rng.standard_normal((1, 16, 28, 28)).astype(np.float32)}


def test_every_primitive_has_a_user_scratchpad() -> None:
    """Every primitive alive after a model's run (convolutions, a pooling, a product, their
    reorders, others' tests') asks for its scratchpad as an argument; a GEMM convolution's
    is its own buffer, as large as oneDNN asks."""
    assert _lib.available(), _lib.unavailable_reason()
    import onnxruntime as ort

    model, feeds = _model()
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    got = anychip.load(model, devices=["cpu"]).run(None, feeds)[0]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
    live = list(P._LIVE)
    assert live
    assert all(P.scratchpad_mode(p.pd) == C.scratchpad_mode_user for p in live)
    gemm = [p for p in live if "gemm" in p.info and p.scratch is not None]
    for p in gemm:  # bound once, to its own buffer
        assert p.scratch.nbytes >= P.md_size(P.query_md(p.pd, C.query_scratchpad_md))


def test_make_pd_wants_the_attribute_last() -> None:
    assert _lib.available(), _lib.unavailable_reason()
    L = P.lib()
    src = P.md((1, 4), C.ab)
    with pytest.raises(TypeError, match="primitive attribute"):
        P.make_pd(L.dnnl.dnnl_reorder_primitive_desc_create, src, L.engine, src, L.engine)
    pd = P.make_pd(
        L.dnnl.dnnl_reorder_primitive_desc_create, src, L.engine, src, L.engine, L.ffi.NULL
    )
    assert P.scratchpad_mode(pd) == C.scratchpad_mode_user


def test_a_library_scratchpad_descriptor_is_refused() -> None:
    """A descriptor made around ``make_pd`` (oneDNN's per-thread scratchpad) is no ``Prim``."""
    assert _lib.available(), _lib.unavailable_reason()
    L = P.lib()
    src = P.md((1, 4), C.ab)
    out = L.ffi.new("dnnl_primitive_desc_t *")
    status = L.dnnl.dnnl_reorder_primitive_desc_create(
        out, src, L.engine, src, L.engine, L.ffi.NULL
    )
    assert status == 0
    pd = L.ffi.gc(out[0], L.dnnl.dnnl_primitive_desc_destroy)
    with pytest.raises(anychip.errors.KernelError, match="library scratchpad"):
        P.Prim(pd, {C.arg_src: src, C.arg_dst: src})
