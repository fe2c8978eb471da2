"""The command in the shape of onnxruntime_perf_test / benchmark_app: --shape for symbolic
dimensions, run's first/mean/percentile/throughput line, one --json [FILE], -q everywhere,
plain-text help."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from anychip.cli.main import _parser, free_dims, main
from anychip.errors import InputError


def _model(tmp_path) -> str:
    """y = Softmax(x @ W) with x: [batch, seq, 8] symbolic in batch and seq."""
    w = np.random.default_rng(5).standard_normal((8, 3)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 3])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Softmax", ["h"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y], [numpy_helper.from_array(w, "w")])
    path = tmp_path / "m.onnx"
    path.write_bytes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    )
    return str(path)


def test_shape_by_input_or_by_dimension_name(tmp_path) -> None:
    path = _model(tmp_path)
    assert free_dims(path, ["x=[2,128,8]"]) == {"batch": 2, "seq": 128}
    assert free_dims(path, ["seq=64"]) == {"seq": 64}
    with pytest.raises(InputError, match="has shape"):
        free_dims(path, ["x=[2,128]"])
    with pytest.raises(InputError, match="is fixed"):
        free_dims(path, ["x=[2,128,9]"])
    with pytest.raises(InputError, match="expects name="):
        free_dims(path, ["x:[1]"])


def test_run_with_shape_prints_first_mean_percentiles_throughput(tmp_path, capsys) -> None:
    path = _model(tmp_path)
    assert main(["run", path, "--devices", "cpu", "--shape", "x=[2,16,8]", "--repeat", "4"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"output y: float32\[2, 16, 3\]", out), out
    assert re.search(
        r"time: first run [\d.]+ ms, runs 2-10 mean [\d.]+ ms, steady [\d.]+ ms \(median of 4 "
        r"runs after run 10\)\nafter the first: p50 [\d.]+ ms, p90 [\d.]+ ms, p99 [\d.]+ ms, best "
        r"[\d.]+ ms "
        r"over runs 2-14; [\d.]+ runs/s",
        out,
    ), out


def test_json_goes_to_stdout_alone_or_to_a_file(tmp_path, capsys) -> None:
    path = _model(tmp_path)
    assert main(["run", path, "--devices", "cpu", "--repeat", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["runs"] == 3 and result["outputs"][0]["shape"] == [1, 1, 3]
    assert {"first_ms", "mean_2_10_ms", "p50_ms", "p90_ms", "p99_ms", "throughput_per_s"} <= set(
        result
    )
    dest = tmp_path / "devices.json"
    assert main(["devices", "--json", str(dest), "-q"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^cpu\s", out, re.M)  # the text as usual
    assert "cpu" in {r["name"] for r in json.loads(dest.read_text())}


def test_quiet_and_plain_help_on_every_command() -> None:
    parser = _parser()
    assert "``" not in parser.format_help()
    sub = next(a for a in parser._actions if a.dest == "cmd")
    for name, p in sub.choices.items():
        assert "-q" in p._option_string_actions, name
        assert "``" not in p.format_help(), name
        json_opt = p._option_string_actions.get("--json")
        if json_opt is not None:
            assert json_opt.nargs == "?" and json_opt.const == "-", name


def test_inspect_counts_flops_once_symbolic_dimensions_have_sizes(tmp_path, capsys) -> None:
    path = _model(tmp_path)
    assert main(["inspect", path, "--devices", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "FLOPs: at least" in out and "--shape" in out, out
    assert main(["inspect", path, "--devices", "cpu", "--shape", "x=[2,16,8]", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["flops_by_op"]["MatMul"] == 2 * 2 * 16 * 8 * 3 and not summary["unknown_flops"]


def test_progress_in_a_notebook_through_tqdm_auto(tmp_path, monkeypatch) -> None:
    import sys
    import types

    import anychip

    tqdm_auto = pytest.importorskip("tqdm.auto")
    bars: list[tuple] = []

    class Bar:
        def __init__(self, total=None, desc="", leave=True) -> None:
            self.desc, self.n = desc, 0
            bars.append((desc, total))

        def update(self, n: int = 1) -> None:
            self.n += n

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

    monkeypatch.setattr(tqdm_auto, "tqdm", Bar)
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    sess = anychip.load(_model(tmp_path), devices=["cpu"])
    assert ("loading the model", None) in bars, bars
    x = np.random.default_rng(1).standard_normal((1, 2, 8)).astype(np.float32)
    assert sess.run(None, {"x": x})[0].shape == (1, 2, 3)
    bars.clear()
    monkeypatch.setenv("ANYCHIP_PROGRESS", "0")
    anychip.load(_model(tmp_path), devices=["cpu"])
    assert bars == []


def test_run_with_concurrency_reports_throughput_and_p99(tmp_path, capsys) -> None:
    path = _model(tmp_path)
    argv = ["run", path, "--devices", "cpu", "--repeat", "5", "--concurrency", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"concurrency 3 \(3 sessions\): 15 requests in [\d.]+ s, [\d.]+ runs/s; latency p50 "
        r"[\d.]+ ms, p90 [\d.]+ ms, p99 [\d.]+ ms",
        out,
    ), out
    assert main([*argv, "--json"]) == 0
    c = json.loads(capsys.readouterr().out)["concurrent"]
    assert c["concurrency"] == 3 and c["requests"] == 15 and c["throughput_per_s"] > 0
    assert c["p50_ms"] <= c["p90_ms"] <= c["p99_ms"]
    assert main(["run", path, "--devices", "cpu", "--concurrency", "0"]) == 2
    assert "--concurrency must be >= 1, got 0" in capsys.readouterr().err


def test_percentiles_and_the_concurrent_phase_on_xpu(tmp_path) -> None:
    """Each of the phase's sessions runs its requests, at once (a barrier starts them)."""
    import anychip
    from anychip.cli.concurrency import concurrent_runs, percentiles

    assert percentiles([0.001 * i for i in range(1, 101)]) == pytest.approx(
        {"p50_ms": 50.5, "p90_ms": 90.1, "p99_ms": 99.01}
    )
    path = _model(tmp_path)
    ran: list[int] = []

    def load():
        s = anychip.load(path, devices=["xpu", "cpu"], free_dimension_overrides={"batch": 2})
        real = s.run
        s.run = lambda *a: (ran.append(id(s)), real(*a))[1]
        return s

    first = load()
    feeds = {"x": np.ones((2, 4, 8), np.float32)}
    c = concurrent_runs(first, load, feeds, 3, 4)
    assert c["requests"] == 12 and c["concurrency"] == 3
    counts = sorted(ran.count(k) for k in set(ran))
    assert counts == [4, 7, 7], counts  # the loaded ones' 3 warm-up runs, then 4 each
