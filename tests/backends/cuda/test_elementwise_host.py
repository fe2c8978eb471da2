"""The arithmetic of the emitted CUDA expressions, checked without a GPU: the very lines the
emitter writes (``body_lines``) are compiled as host C++ (the system's C++ compiler, as the XPU
simulator's driver is) and run on seeded random inputs, against onnxruntime running the same
ops as an ONNX graph. Only the math library differs (glibc's instead of CUDA's)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from anychip.backends.cuda.elementwise import OPS, Chain, Step, body_lines

#: attributes other than the defaults, so they are seen to be used
ATTRS = {
    "LeakyRelu": {"alpha": 0.3}, "Elu": {"alpha": 0.7}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4},
    "Clip": {"min": -0.8, "max": 0.9},
}  # fmt: skip


def _chain(op: str) -> Chain:
    """``op`` on the inputs, then one more step on its result."""
    args = (0,) if OPS[op][0] == 1 else (0, 1)
    steps = (Step(op, args, tuple(ATTRS.get(op, {}).items())), Step("Add", (2, 1)))
    return Chain(2, steps, (2, 3))


def _function(name: str, chain: Chain) -> str:
    n_in, n_out = chain.n_inputs, len(chain.outputs)
    params = [f"const T* x{i}" for i in range(n_in)] + [f"T* y{k}" for k in range(n_out)]
    body = body_lines(chain, [f"x{i}[i]" for i in range(n_in)], [f"y{k}[i]" for k in range(n_out)])
    return (
        f'extern "C" void {name}({", ".join(params)}, long n) {{\n'
        "  for (long i = 0; i < n; ++i) {\n" + "\n".join("    " + b for b in body) + "\n  }\n}\n"
    )


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> ctypes.CDLL:
    """Every op's chain as one host function, compiled once."""
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    assert cxx, "a C++ compiler is needed (the XPU simulator's driver needs one too)"
    tmp = tmp_path_factory.mktemp("emitted")
    src = "#include <cmath>\nusing namespace std;\ntypedef float T;\ntypedef float C;\n"
    src += "".join(_function(f"run_{op}", _chain(op)) for op in sorted(OPS))
    (tmp / "k.cpp").write_text(src)
    out = tmp / "k.so"
    subprocess.run([cxx, "-O1", "-shared", "-fPIC", "-o", str(out), str(tmp / "k.cpp")], check=True)
    return ctypes.CDLL(str(out))


def _onnx_chain(chain: Chain) -> bytes:
    names = [f"v{i}" for i in range(chain.n_inputs + len(chain.steps))]
    nodes, inits = [], []
    for j, st in enumerate(chain.steps):
        ins = [names[a] for a in st.args]
        attrs = dict(st.attrs)
        if st.op == "Clip":
            lo, hi = f"lo{j}", f"hi{j}"
            inits += [onnx.numpy_helper.from_array(np.float32(attrs["min"]), lo),
                      onnx.numpy_helper.from_array(np.float32(attrs["max"]), hi)]  # fmt: skip
            ins, attrs = ins + [lo, hi], {}
        nodes.append(h.make_node(st.op, ins, [names[chain.n_inputs + j]], **attrs))
    g = h.make_graph(
        nodes, "chain",
        [h.make_tensor_value_info(f"v{i}", T.FLOAT, [64]) for i in range(chain.n_inputs)],
        [h.make_tensor_value_info(names[o], T.FLOAT, [64]) for o in chain.outputs], inits,
    )  # fmt: skip
    return h.make_model(g, opset_imports=[h.make_opsetid("", 20)]).SerializeToString()


@pytest.mark.parametrize("op", sorted(OPS))
def test_each_expression_computes_what_onnx_says(op, lib):
    chain = _chain(op)
    rng = np.random.default_rng(sorted(OPS).index(op))
    x0 = rng.uniform(-3, 3, 64).astype(np.float32)
    x1 = rng.uniform(0.5, 2, 64).astype(np.float32)
    if op in ("Log", "Sqrt", "Pow"):
        x0 = np.abs(x0) + 0.1
    ys = [np.zeros(64, np.float32) for _ in chain.outputs]
    ptr = [a.ctypes.data_as(ctypes.c_void_p) for a in (x0, x1, *ys)]
    getattr(lib, f"run_{op}")(*ptr, ctypes.c_long(64))
    want = ort.InferenceSession(_onnx_chain(chain), providers=["CPUExecutionProvider"]).run(
        None, {"v0": x0, "v1": x1}
    )
    for got, w in zip(ys, want):
        np.testing.assert_allclose(got, w, rtol=2e-6, atol=2e-6)
