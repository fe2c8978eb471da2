"""The matrixcore plugin of issue 40 (``matrixcore.py``): with its declared "Softmax on the last
axis only" it passes the kit in strict mode, in the CLI and the pytest plugin alike; with
each of its bring-up bugs the kit fails, naming what is wrong."""

from __future__ import annotations

import json

import pytest

from anychip.cli.main import main
from anychip.conformance import (
    CRASH,
    FAIL,
    PASS_ON_DEVICE,
    REFUSED_AS_DECLARED,
    run_kit,
)
from anychip.core.plugin.host import get_registry, register_plugin, unregister_plugin
from tests.conformance import matrixcore
from tests.conformance.test_declared import pytest_kit


@pytest.fixture
def chip():
    matrixcore.CHIP.bug = ""
    matrixcore.CHIP._pool = None
    get_registry()
    register_plugin(matrixcore, "matrixcore")
    yield matrixcore.CHIP
    unregister_plugin("matrixcore")
    matrixcore.CHIP.bug = ""


def test_matrixcore_passes_strict(chip, tmp_path, capsys):
    out = tmp_path / "kit.json"
    assert main(["conformance", "--device", "matrixcore", "--strict", "--quiet",
                 "--json", str(out)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "verdict: PASS" in text
    assert "refused as declared, 4 case(s) of Softmax: axis on the last axis only" in text
    data = json.loads(out.read_text())
    statuses = {c["case"]: c["status"] for c in data["cases"]}
    assert set(statuses.values()) == {PASS_ON_DEVICE, REFUSED_AS_DECLARED}
    assert statuses["test_softmax_axis_1[f16]"] == REFUSED_AS_DECLARED
    for case in (
        "test_reshape_negative_dim",
        "test_gelu_default_2[f16]",
        "test_layer_normalization_4d_axis1[1 output][f16]",
        "test_gemm_transposeB",
    ):
        assert statuses[case] == PASS_ON_DEVICE, case  # fmt: skip
    assert {c["op"] for c in data["cases"]} == {
        "MatMul", "Gemm", "Add", "Mul", "Relu", "Gelu", "Softmax", "LayerNormalization",
        "Transpose", "Reshape",
    }  # fmt: skip
    assert all(c["ok"] for c in data["contract"])


def _same_verdict(ops: str | None, tmp_path, capsys) -> None:
    out = tmp_path / "kit.json"
    args = ["conformance", "--device", "matrixcore", "--strict", "--quiet", "--json", str(out)]
    cli = main(args + (["--ops", ops] if ops else []))
    cases = {c["case"]: c["status"] for c in json.loads(out.read_text())["cases"]}
    rc, items = pytest_kit("matrixcore", ops or "", True, tmp_path)
    capsys.readouterr()
    assert cli == 0 and rc == 0, items
    assert {c: s for c, (_, s) in items.items() if s} == cases
    assert {o for o, _ in items.values()} == {"passed"}


def test_the_cli_and_the_pytest_plugin_agree_on_matrixcore(chip, tmp_path, capsys):
    _same_verdict("Softmax,Reshape,Gelu", tmp_path, capsys)


@pytest.mark.slow  # the whole kit twice, about 45 s
def test_the_cli_and_the_pytest_plugin_agree_on_all_of_matrixcore(chip, tmp_path, capsys):
    _same_verdict(None, tmp_path, capsys)


#: bug -> (the op whose cases show it, a case that must fail, words of its detail,
#: a case of the same op that still passes)
CAUGHT = {
    "wrong_dtype": ("Mul", "test_mul[f16]", "dtype float32, expected float16", "test_mul"),
    "lost_kept_dims": (
        "LayerNormalization",
        "test_layer_normalization_4d_axis1",
        "shape [2], expected [2, 1, 1, 1]",
        "test_layer_normalization_4d_axis1[1 output]",
    ),
    "wrong_axis": (
        "LayerNormalization",
        "test_layer_normalization_4d_axis1[1 output]",
        "Mismatched elements",
        "test_layer_normalization_4d_axis3[1 output]",
    ),
    "input_mutation": ("Add", "test_add", "wrote into its input 0", None),
    "host_array": ("Relu", "test_relu", "returned a host numpy array", None),
    "leak_in_release": ("Add", "test_add[f16]", "memory still in use", "test_add"),
    "raising_kernel": ("Gemm", "test_gemm_transposeB", "transposed B", "test_gemm_transposeA"),
    "inaccurate_f16_gelu": (
        "Gelu",
        "test_gelu_default_2[f16]",
        "Mismatched",
        "test_gelu_default_2",
    ),
    "leak_1_output_layernorm": (
        "LayerNormalization",
        "test_layer_normalization_2d_axis1[1 output]",
        "memory still in use",
        "test_layer_normalization_2d_axis1",
    ),
}


@pytest.mark.parametrize("bug", sorted(CAUGHT))
def test_the_kit_catches_each_bug(chip, bug):
    op, case, words, still_passing = CAUGHT[bug]
    chip.bug = bug
    report = run_kit("matrixcore", strict=True, ops=[op], contract=bug == "leak_in_release")
    assert not report.ok
    results = {r.case: r for r in report.results}
    assert results[case].status in (FAIL, CRASH), results[case]
    assert words in results[case].detail, results[case].detail
    if still_passing is not None:
        assert results[still_passing].status == PASS_ON_DEVICE, results[still_passing]
    if bug in ("input_mutation", "host_array", "wrong_dtype"):  # named as registered
        assert f"kernel matrixcore:{op} since 14 (tests.conformance.matrixcore." in (
            results[case].detail
        )
    if bug == "leak_in_release":
        contract = {c.name: c for c in report.contract}
        assert not contract["copies/f16"].ok and contract["copies/f32"].ok
