"""Bring-up (``load(..., bring_up=True)``, ``anychip run --bring-up``) turns matrixcore's
bugs that failover hides into errors naming the node and the kernel as registered; outside
bring-up, failover is loud (the placement report's and ``anychip run``'s first line)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.cli.main import main
from anychip.core.plugin.host import get_registry, register_plugin, unregister_plugin
from anychip.errors import BringUpError, KernelError
from tests.conformance import matrixcore

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


@pytest.fixture
def chip():
    matrixcore.CHIP.bug = ""
    matrixcore.CHIP._pool = None
    get_registry()
    register_plugin(matrixcore, "matrixcore")
    yield matrixcore.CHIP
    unregister_plugin("matrixcore")
    matrixcore.CHIP.bug = ""


def _model(nodes, inputs, output, inits=(), opset=20):
    g = helper.make_graph(nodes, "g", inputs, [output], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _case(bug: str):
    """A two-node model showing ``bug``, its feeds (seeded), and the node and kernel the error
    must name."""
    rng = np.random.default_rng(7)
    if bug == "raising_kernel":
        w = numpy_helper.from_array(rng.standard_normal((6, 8)).astype(np.float32), "w")
        nodes = [
            helper.make_node("Gemm", ["x", "w"], ["g"], name="proj", transB=1),
            helper.make_node("Relu", ["g"], ["y"], name="act"),
        ]
        model = _model(nodes, [_vi("x", F32, [4, 8])], _vi("y", F32, [4, 6]), [w])
        feeds = {"x": rng.standard_normal((4, 8)).astype(np.float32)}
        return model, feeds, "proj", "matrixcore:Gemm since 13 (tests.conformance.matrixcore.gemm)"
    if bug == "wrong_dtype":
        nodes = [
            helper.make_node("Mul", ["x", "s"], ["m"], name="scale"),
            helper.make_node("Relu", ["m"], ["y"], name="act"),
        ]
        inputs = [_vi("x", F16, [3, 5]), _vi("s", F16, [3, 5])]
        model = _model(nodes, inputs, _vi("y", F16, [3, 5]))
        feeds = {n: rng.standard_normal((3, 5)).astype(np.float16) for n in "xs"}
        return model, feeds, "scale", "matrixcore:Mul since 14 (tests.conformance.matrixcore.mul)"
    first = "Relu" if bug == "host_array" else "Transpose"
    nodes = [
        helper.make_node(first, ["x"], ["r"], name="first"),
        helper.make_node("Add", ["r", "b"], ["y"], name="bias"),
    ]
    model = _model(nodes, [_vi("x", F32, [4, 4]), _vi("b", F32, [4, 4])], _vi("y", F32, [4, 4]))
    feeds = {n: rng.standard_normal((4, 4)).astype(np.float32) for n in "xb"}
    fn = first.lower()
    since = 14 if first == "Relu" else 13
    return (
        model,
        feeds,
        "first",
        f"matrixcore:{first} since {since} (tests.conformance.matrixcore.{fn})",
    )


HIDDEN = ["raising_kernel", "wrong_dtype", "host_array", "foreign_handle"]


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]


@pytest.mark.parametrize("bug", HIDDEN)
def test_failover_answers_right_and_says_so_first(chip, bug):
    model, feeds, node, kernel = _case(bug)
    chip.bug = bug
    sess = anychip.load(model, ["matrixcore", "cpu"], cost_model=False)
    assert set(sess.placement().by_device()) == {"matrixcore"}
    (y,) = sess.run(None, feeds)  # the CPU answers in the device's place
    np.testing.assert_allclose(y.astype(np.float32), _ort(model, feeds).astype(np.float32),
                               rtol=2e-3, atol=2e-3)  # fmt: skip
    report = sess.placement()
    first = str(report).splitlines()[0]
    assert first.startswith("DEVICE FAILED: matrixcore failed during a run"), first
    assert node in first and kernel in first, first
    assert report.summary()["failover"] == 2 and report.summary()["chosen"] == 0
    assert all(n.reason.startswith("failover: matrixcore failed") for n in report.nodes)


@pytest.mark.parametrize("bug", HIDDEN)
def test_bring_up_turns_each_hidden_bug_into_an_error_naming_node_and_kernel(chip, bug):
    model, feeds, node, kernel = _case(bug)
    chip.bug = bug
    sess = anychip.load(model, ["matrixcore", "cpu"], cost_model=False, bring_up=True)
    with pytest.raises(KernelError) as err:
        sess.run(None, feeds)
    text = str(err.value)
    assert f"node {node!r}" in text and kernel in text, text
    assert sess.unhealthy == {}  # no failover in bring-up


def test_anychip_run_says_first_that_a_device_failed_and_bring_up_stops(chip, tmp_path, capsys):
    model, _, node, kernel = _case("raising_kernel")
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    chip.bug = "raising_kernel"
    run = ["run", str(path), "--devices", "matrixcore,cpu", "--placement-policy", "prefer-first"]
    assert main(run + ["--repeat", "1"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("DEVICE FAILED: matrixcore failed during a run") and kernel in first
    assert main(run + ["--bring-up"]) == 2
    err = capsys.readouterr().err
    assert "firmware" in err and f"node {node!r}" in err and kernel in err


def test_bring_up_reports_the_first_node_that_differs_from_the_cpu(chip):
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
        helper.make_node("Gelu", ["h"], ["g"], name="gelu"),
        helper.make_node("Relu", ["g"], ["y"], name="act"),
    ]
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float16), "w")
    model = _model(nodes, [_vi("x", F16, [4, 8])], _vi("y", F16, [4, 8]), [w])
    feeds = {"x": rng.standard_normal((4, 8)).astype(np.float16)}
    chip.bug = "inaccurate_f16_gelu"
    sess = anychip.load(model, ["matrixcore", "cpu"], cost_model=False)
    sess.run(None, feeds)  # outside bring-up a wrong answer is just an answer
    sess = anychip.load(model, ["matrixcore", "cpu"], cost_model=False, bring_up=True)
    with pytest.raises(BringUpError) as err:
        sess.run(None, feeds)
    text = str(err.value)
    assert "node 'gelu' (Gelu)" in text and "differs from the CPU kernel" in text, text
    assert "max |error|" in text and "kernel matrixcore:Gelu since 20" in text
    chip.bug = ""
    with anychip.load(model, ["matrixcore", "cpu"], cost_model=False, bring_up=True) as sess:
        (y,) = sess.run(None, feeds)  # a right device passes bring-up
    np.testing.assert_allclose(y.astype(np.float32), _ort(model, feeds).astype(np.float32),
                               rtol=1e-2, atol=1e-2)  # fmt: skip


def test_bring_up_catches_an_input_written_and_memory_kept_at_close(chip):
    rng = np.random.default_rng(4)
    f = {n: rng.standard_normal((3, 4)).astype(np.float32) for n in "ab"}
    model = _model(
        [helper.make_node("Add", ["a", "b"], ["s"], name="sum"),
         helper.make_node("Mul", ["a", "s"], ["y"], name="prod")],
        [_vi("a", F32, [3, 4]), _vi("b", F32, [3, 4])], _vi("y", F32, [3, 4]),
    )  # fmt: skip
    chip.bug = "input_mutation"  # 'prod' would read the a that 'sum' overwrote
    sess = anychip.load(model, ["matrixcore", "cpu"], cost_model=False, bring_up=True)
    with pytest.raises(
        BringUpError, match="node 'sum' \\(Add\\).*wrote into its input 0 \\('a'\\)"
    ):
        sess.run(None, f)

    scale = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "g")
    ln = _model(
        [helper.make_node("LayerNormalization", ["a", "g"], ["y"], name="ln")],
        [_vi("a", F32, [3, 4])], _vi("y", F32, [3, 4]), [scale],
    )  # fmt: skip
    chip.bug = "leak_1_output_layernorm"
    sess = anychip.load(ln, ["matrixcore", "cpu"], cost_model=False)
    sess.run(None, {"a": f["a"]})
    sess.close()  # outside bring-up: nothing said
    chip._pool = None
    sess = anychip.load(ln, ["matrixcore", "cpu"], cost_model=False, bring_up=True)
    np.testing.assert_allclose(sess.run(None, {"a": f["a"]})[0], _ort(ln, {"a": f["a"]}),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    with pytest.raises(BringUpError, match="matrixcore has [0-9]+ B more in use than when"):
        sess.close()


def test_the_kit_in_bring_up_names_the_node_that_differs(chip):
    from anychip.conformance import FAIL, run_kit

    chip.bug = "inaccurate_f16_gelu"
    report = run_kit("matrixcore", ops=["Gelu"], contract=False, bring_up=True)
    cases = {r.case: r for r in report.results}
    assert cases["test_gelu_default_2[f16]"].status == FAIL
    assert "differs from the CPU kernel" in cases["test_gelu_default_2[f16]"].detail
    assert cases["test_gelu_default_2"].status != FAIL
