"""``anychip bench`` (``cli/bench.py``), the CPU model set (``bench/cpu_models.py``) and the
dispatch benchmark (``bench/dispatch.py``), on small models with few runs: outputs compared
with onnxruntime and OpenVINO, no timing asserted."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import onnxruntime as ort
import pytest

from anychip.cli.main import main
from bench import cpu_models
from bench.dispatch import chain_model, measure


def test_bench_against_both_peers_writes_json(tmp_path, capsys):
    path = tmp_path / "chain.onnx"
    path.write_bytes(chain_model(30).SerializeToString())
    out = tmp_path / "r.json"
    # a model by name that an installed anychip has too (bench/'s set is the repository's)
    argv = ["bench", str(path), "squeezenet", "--against", "onnxruntime", "openvino"]
    argv += ["--runs", "2", "--warmup", "1", "--threads", "1", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "onnxruntime ms" in text and "openvino ms" in text and "geomean" in text
    result = json.loads(out.read_text())
    assert [r["model"] for r in result["models"]] == ["chain.onnx", "squeezenet"]
    assert result["threads"] == 1 and result["runs"] == 2
    engines = {"anychip", "onnxruntime", "openvino"}
    for row in result["models"]:
        assert set(row["ms"]) == set(row["load_ms"]) == set(row["first_run_ms"]) == engines
        assert all(v > 0 for key in ("ms", "load_ms", "first_run_ms") for v in row[key].values())
        assert set(row["p99_ms"]) == engines
        assert all(row["ms"][k] <= row["p90_ms"][k] <= row["p99_ms"][k] for k in engines)
        assert f"{row['model']}: p90/p99 ms onnxruntime " in text
        for peer in ("onnxruntime", "openvino"):
            assert row["ratio"][peer] == pytest.approx(row["ms"]["anychip"] / row["ms"][peer])
            assert row["max_abs_diff"][peer] < 1e-4
    assert set(result["geomean_ratio"]) == {"onnxruntime", "openvino"}
    for peer, ratio in result["cold_geomean_ratio"].items():  # the rows' sums, geomean
        want = [
            (r["load_ms"]["anychip"] + r["first_run_ms"]["anychip"])
            / (r["load_ms"][peer] + r["first_run_ms"][peer])
            for r in result["models"]
        ]
        assert ratio == pytest.approx(float(np.exp(np.mean(np.log(want)))))
        assert f"anychip/{peer} {ratio:.2f}" in text.split("load + first run")[1]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "no_such_model"], "unknown model 'no_such_model'"),
        (["bench", "missing/file.onnx"], "no model file"),
        (["bench", "mlp", "--runs", "0"], "--runs must be >= 1"),
        (["bench", "mlp", "--threads", "0"], "--threads must be >= 1"),
    ],
)
def test_bad_arguments_are_clear_errors(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "build, size",
    [
        (cpu_models.mobilenet_like, 32),
        (cpu_models.resnet_like, 32),
        (cpu_models.shufflenet_like, 64),
        (cpu_models.densenet_like, 32),
    ],
)
def test_model_set_cnns_match_onnxruntime(build, size):
    import anychip

    model = build(size=size, seed=1)
    x = np.random.default_rng(2).standard_normal((1, 3, size, size)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    got = anychip.load(model, devices=["cpu"]).run(None, {"x": x})[0]
    assert got.shape == want.shape == (1, 1000)
    assert np.std(want) > 1e-3  # logits that differ from class to class
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_model_set_names_build_with_their_inputs():
    assert len(cpu_models.MODELS) == 19
    model, feeds = cpu_models.build("hf_gpt2_tiny")
    assert feeds["input_ids"].dtype == np.int64 and feeds["input_ids"].max() < 128


def test_dispatch_benchmark_runs_and_agrees():
    r = measure(nodes=20, rounds=2, warmup=1)
    assert r["max_abs_diff"] == 0.0
    assert set(r["us_per_node"]) == {"anychip", "anychip_fused", "ort_no_opt", "ort_all_opt"}


def test_devices_reach_anychip(tmp_path, capsys):
    path = tmp_path / "chain.onnx"
    path.write_bytes(chain_model(10).SerializeToString())
    out = tmp_path / "r.json"
    argv = ["bench", str(path), "--devices", "xpu,cpu", "--runs", "1", "--warmup", "0"]
    assert main(argv + ["--json", str(out), "--quiet"]) == 0
    result = json.loads(out.read_text())
    assert result["devices"] == ["xpu", "cpu"] and result["peers"] == ["onnxruntime"]
    assert result["models"][0]["max_abs_diff"]["onnxruntime"] < 1e-6
    assert "anychip devices: xpu,cpu" in capsys.readouterr().out


def test_cpu_time_clock_is_recorded(tmp_path, capsys):
    path = tmp_path / "chain.onnx"
    path.write_bytes(chain_model(10).SerializeToString())
    out = tmp_path / "r.json"
    argv = ["bench", str(path), "--runs", "2", "--warmup", "0", "--cpu-time", "--quiet"]
    assert main(argv + ["--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["clock"] == "process CPU time"
    assert all(v >= 0 for v in result["models"][0]["ms"].values())
    assert "(process CPU time clock)" in capsys.readouterr().out


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
def test_threads_limit_reaches_the_onednn_openmp_team_in_a_fresh_process() -> None:
    """``--threads 1`` must bind oneDNN's OpenMP team too, though oneDNN loads lazily (a limit
    set before the library loads is lost: the LSTM ran on 2 threads at 4x its 1-thread time)."""
    import subprocess
    import sys

    code = (
        "from anychip.cli.bench import _thread_limit\n"
        "from anychip.backends.cpu.onednn import _lib\n"
        "with _thread_limit(1):\n"
        "    print(_lib.omp_threads())\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "1"


def test_rounds_vary_the_order_and_run_each_engine_twice_in_a_row() -> None:
    """Each round runs the engines in a new seeded order, each twice in a row (an untimed
    run, then the timed one), so no engine's timed run follows another engine's."""
    from anychip.cli.bench import _time_model

    calls: list[str] = []

    def engine(name: str):
        def run(feeds: dict) -> list:
            calls.append(name)
            return [np.zeros(2, np.float32)]

        return run

    names = ["anychip", "onnxruntime", "openvino"]
    _time_model({n: engine(n) for n in names}, {}, runs=12, warmup=0)
    rounds = [calls[3 + 6 * r : 9 + 6 * r] for r in range(12)]  # after the 3 first runs
    assert all(rd[0::2] == rd[1::2] and sorted(rd[0::2]) == names for rd in rounds)
    before_anychip = {rd[rd.index("anychip") - 1] if rd.index("anychip") else None for rd in rounds}
    assert len({tuple(rd[0::2]) for rd in rounds}) > 2 and len(before_anychip) > 1


def test_the_default_warmup_outlasts_anychips_thread_choice():
    """The timed rounds come after the session settled its threads, even when one thread
    wins and is measured twice (the longest the choice takes)."""
    from anychip.backends.cpu.native import omp
    from anychip.backends.cpu.thread_choice import ThreadChoice
    from anychip.cli.bench import WARMUP

    seen: list[int] = []

    def program(tensors: list) -> list:  # slower on two threads: one thread is chosen
        seen.append(omp.max_threads())
        if omp.max_threads() >= 2:
            time.sleep(0.003)
        return tensors

    kept = omp.max_threads()
    omp.set_threads(2)
    try:
        run = ThreadChoice(program)
        for _ in range(1 + WARMUP):  # the bench's first run (the compared outputs), its warm-up
            run([np.zeros(2, np.float32)])
        timed = len(seen)
        for _ in range(10):
            run([np.zeros(2, np.float32)])
    finally:
        omp.set_threads(kept)
    assert 2 in seen[:timed] and seen[timed:] == [1] * 10


def test_a_rows_thread_choice_is_reported(tmp_path, capsys):
    from anychip.cli.bench import WARMUP

    path = tmp_path / "chain.onnx"
    path.write_bytes(chain_model(30).SerializeToString())
    out = tmp_path / "r.json"
    argv = ["bench", str(path), "--runs", "1", "--threads", "2", "--quiet", "--json", str(out)]
    assert main(argv) == 0
    assert f"warm-up: {WARMUP} runs each" in capsys.readouterr().out
    (note,) = json.loads(out.read_text())["models"][0]["anychip_threads"]
    assert note.split(" for inputs ")[0] in ("1 of 2", "2 of 2") and "measured median" in note


def test_bench_resolves_the_repository_model_set_by_name():
    """``anychip bench bert_like`` from a checkout: the names of ``bench/cpu_models.py``
    (the renovation moved the command into ``cli/``, and the lookup went one folder short)."""
    from pathlib import Path

    import anychip
    from anychip.cli.bench import _model_set, resolve_model

    _model_set.cache_clear()
    here = Path(anychip.__file__).resolve().parent / "bench" / "cpu_models.py"
    if not here.exists():  # an installed wheel (CI's venv): no bench/ beside the package
        assert _model_set() is None
        return
    assert _model_set() is not None
    data, feeds = resolve_model("bert_like")
    assert data[:2] and feeds is not None and set(feeds)
