"""The forms of onnx's cases the kit derives, and what each catches on ``badchip``: int64
shapes fed as constants, float16 forms, single-output forms; every case run twice with its
inputs, constants and the device's memory checked."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import TensorProto, helper

from anychip.cli.main import main
from anychip.conformance import FAIL, PASS_ON_DEVICE, KitReport, OpClaim, run_kit
from anychip.conformance.variants import convert_model, first_output_only
from anychip.core.plugin.host import register_plugin, unregister_plugin
from anychip.ir.dtypes import DType
from tests.conformance import badchip


@pytest.fixture
def chip():
    badchip.CHIP.mode = "ok"
    badchip.CHIP._pool = None
    badchip.CHIP.scratch.clear()
    register_plugin(badchip, "badchip")
    yield badchip.CHIP
    unregister_plugin("badchip")
    badchip.CHIP.mode = "ok"


def _by_case(report):
    return {r.case: r for r in report.results}


def test_int64_shapes_are_fed_as_constants_and_the_report_says_so(chip):
    report = run_kit("badchip", ops=["Reshape"], strict=True)
    assert report.ok, str(report)
    reshape = [r for r in report.results if r.op == "Reshape"]
    assert len(reshape) >= 10 and all(r.status == PASS_ON_DEVICE for r in reshape)
    assert all("'shape' (i64) fed as constants: badchip computes no i64" in r.note for r in reshape)
    text = str(report)
    assert "ran with inputs fed as constants (badchip computes no i64)" in text
    assert "claims no op" not in text


def test_float16_forms_run_and_catch_an_inaccurate_float16_kernel(chip):
    report = run_kit("badchip", ops=["Relu"], contract=False)
    cases = _by_case(report)
    assert cases["test_relu[f16]"].status == PASS_ON_DEVICE
    assert "the float32 case in f16" in cases["test_relu[f16]"].note
    chip.mode = "f16_inaccurate"
    cases = _by_case(run_kit("badchip", ops=["Relu"], contract=False))
    assert cases["test_relu"].status == PASS_ON_DEVICE  # float32 is right
    assert cases["test_relu[f16]"].status == FAIL, cases["test_relu[f16]"]
    assert cases["test_relu[f16]"].max_error > 2**-8


def test_a_kernel_writing_into_its_input_fails_naming_the_kernel(chip):
    chip.mode = "mutate_input"
    add = [r for r in run_kit("badchip", ops=["Add"], contract=False).results]
    assert add and all(r.status == FAIL for r in add), [(r.case, r.status) for r in add]
    detail = add[0].detail
    assert "wrote into its input 0" in detail and "kernel badchip:Add since 7" in detail
    assert "tests.conformance.badchip.add" in detail


def test_a_kernel_that_keeps_state_fails_on_the_second_run(chip):
    chip.mode = "stateful"
    (relu,) = [r for r in run_kit("badchip", ops=["Relu"], contract=False).results
               if r.case == "test_relu"]  # fmt: skip
    assert relu.status == FAIL and "the second run of the same inputs" in relu.detail


def test_a_release_that_leaks_fails_each_case(chip):
    chip.mode = "leak"
    results = run_kit("badchip", ops=["Relu"], contract=False).results
    assert results and all(r.status == FAIL for r in results)
    assert "memory still in use after the case's sessions were closed" in results[0].detail


def test_details_are_whole_in_json_and_cut_in_the_text(chip, tmp_path, capsys):
    chip.mode = "wrong_result"
    out = tmp_path / "kit.json"
    assert main(["conformance", "--device", "badchip", "--ops", "Relu", "--quiet",
                 "--json", str(out)]) == 1  # fmt: skip
    longest = max(len(c["detail"]) for c in json.loads(out.read_text())["cases"])
    assert longest > 600
    assert "--json has them all" in capsys.readouterr().out


def _layer_norm(outputs: int) -> onnx.ModelProto:
    names = ["y", "mean", "inv"][:outputs]
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], names, axis=-1)
    f = TensorProto.FLOAT
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, f, [2, 3] if n == "x" else [3]) for n in "xsb"],
        [helper.make_tensor_value_info(n, f, [2, 3] if n == "y" else [2, 1]) for n in names],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_single_output_forms_and_conversions():
    single = first_output_only(_layer_norm(3), "LayerNormalization")
    assert [o.name for o in single.graph.output] == ["y"]
    assert list(single.graph.node[0].output) == ["y"]
    assert first_output_only(_layer_norm(1), "LayerNormalization") is None
    f16 = convert_model(single, DType.FLOAT16)
    assert f16.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    cast = helper.make_model(
        helper.make_graph(
            [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        )
    )
    assert convert_model(cast, DType.FLOAT16) is None  # a node naming a dtype is not converted


def test_a_device_whose_claims_match_no_case_is_told_why():
    report = KitReport("nochip", claims=[OpClaim("", "Relu", 6, None, frozenset({DType.INT8}))])
    text = str(report)
    assert "it claims Relu, but no ONNX node case" in text and "claims no op" not in text
    assert "it claims no op" in str(KitReport("nochip"))


def test_no_single_output_form_where_onnx_needs_every_output():
    """BatchNormalization in training mode must give its running statistics (onnx's shape
    inference says so): no single-output form; in inference mode there is nothing to drop."""
    f = TensorProto.FLOAT
    names = ["x", "s", "b", "m", "v"]
    inputs = [helper.make_tensor_value_info("x", f, [2, 3, 4])]
    inputs += [helper.make_tensor_value_info(n, f, [3]) for n in names[1:]]
    outs = [helper.make_tensor_value_info("y", f, [2, 3, 4])]
    outs += [helper.make_tensor_value_info(n, f, [3]) for n in ("rm", "rv")]
    node = helper.make_node("BatchNormalization", names, ["y", "rm", "rv"], training_mode=1)
    model = helper.make_model(
        helper.make_graph([node], "g", inputs, outs),
        opset_imports=[helper.make_opsetid("", 15)],
    )
    onnx.checker.check_model(model, full_check=True)
    assert first_output_only(model, "BatchNormalization") is None
