"""The ``anychip`` command, run in process: devices, run, demo, and bad input."""

from __future__ import annotations

import importlib.util
import json
import re

import numpy as np

from anychip.cli.main import main
from tests.core.test_placement import three_nodes


def test_devices_lists_every_backend(capsys) -> None:
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    for name in ("cpu", "xpu", "npu"):
        assert re.search(rf"^{name}\s", out, re.M), out


def test_devices_as_json(capsys) -> None:
    assert main(["devices", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} >= {"cpu", "xpu", "npu"}
    assert all(isinstance(r["available"], bool) for r in rows)
    assert all(isinstance(r["about"], str) for r in rows)  # Backend.about, often empty


def test_run_prints_outputs_placement_and_memory(tmp_path, capsys) -> None:
    path = tmp_path / "three.onnx"
    path.write_bytes(three_nodes())
    assert main(["run", str(path), "--devices", "xpu,cpu", "--placement", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "devices: xpu,cpu" in out
    assert re.search(r"output y: float32\[4, 8\] \w+", out)
    assert "fallback: xpu: no kernel for Sin" in out


def test_partition_prints_the_placement_as_json_without_running(tmp_path, capsys) -> None:
    path = tmp_path / "three.onnx"
    path.write_bytes(three_nodes())
    args = ["partition", str(path), "--devices", "xpu,cpu", "--calibration", "off"]
    assert main([*args, "--placement-policy", "prefer-first", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    where = {n["name"]: n["device"] for n in report["nodes"]}
    assert where == {"relu": "xpu", "middle": "cpu", "softmax": "xpu"}
    assert report["summary"]["fallback"] == 1
    assert report["copy_count"] == 4  # x up, a down, b up, y down
    assert [c["bytes"] for c in report["copies"]] == [128] * report["copy_count"]
    # Strict: the node the XPU cannot run is named, status 2, no traceback.
    assert main([*args, "--strict"]) == 2
    assert "middle" in capsys.readouterr().err


def test_run_takes_an_input_file(tmp_path, capsys) -> None:
    model, x = tmp_path / "m.onnx", tmp_path / "x.npy"
    model.write_bytes(three_nodes())
    arr = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    np.save(x, arr)
    assert main(["run", str(model), "--devices", "cpu", "--input", f"x={x}"]) == 0
    first = capsys.readouterr().out
    np.save(x, arr * 2)
    assert main(["run", str(model), "--devices", "cpu", "--input", f"x={x}"]) == 0
    # The checksum follows the input given: the file was really read.
    checksum = re.compile(r"sha1=(\w+)")
    assert checksum.search(first).group(1) != checksum.search(capsys.readouterr().out).group(1)


def test_demo_agrees_with_onnxruntime_on_random_weights(capsys) -> None:
    # The default model (ResNet-50) runs in .ci/run's smoke step; a smaller one here.
    assert main(["demo", "--model", "squeezenet"]) == 0
    out = capsys.readouterr().out
    assert "light squeezenet (seeded random weights)" in out
    # Without onnxruntime (a base install, .ci/run's first step) the CPU run is the reference.
    ref = "onnxruntime" if importlib.util.find_spec("onnxruntime") else "cpu"
    diffs = [float(d) for d in re.findall(rf"max\|diff vs {ref}\|=(\S+)", out)]
    assert len(diffs) >= 3  # cpu, npu+cpu, xpu+cpu
    assert all(d < 1e-4 for d in diffs), out


def test_bad_input_is_a_message_and_status_2_not_a_traceback(tmp_path, capsys) -> None:
    assert main(["run", str(tmp_path / "missing.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("anychip: error:") and "missing.onnx" in err
    path = tmp_path / "m.onnx"
    path.write_bytes(three_nodes())
    assert main(["run", str(path), "--devices", "tpu"]) == 2
    err = capsys.readouterr().err
    assert "unknown device 'tpu'" in err and "Traceback" not in err
    assert main(["run", str(path), "--input", "x"]) == 2
    assert "name=file.npy" in capsys.readouterr().err


def test_partition_draws_html_svg_and_dot(tmp_path, capsys) -> None:
    import shutil

    path = tmp_path / "three.onnx"
    path.write_bytes(three_nodes())
    graphviz = importlib.util.find_spec("graphviz") is not None  # the viz extra
    outs = [tmp_path / "p.html"]
    if graphviz:
        outs.append(tmp_path / "p.dot")
    if graphviz and shutil.which("dot"):
        outs.append(tmp_path / "p.svg")
    args = ["partition", str(path), "--devices", "xpu,cpu", "--calibration", "off"]
    assert main([*args, "--placement-policy", "prefer-first", *(f"-o{o}" for o in outs)]) == 0
    captured = capsys.readouterr()
    assert "fallback: xpu: no kernel for Sin" in captured.out  # the text table, always
    for o in outs:
        assert f"wrote {o}" in captured.err and o.stat().st_size > 500
    assert main([*args, "-o", str(tmp_path / "p.pdf")]) == 2
    assert "must end in" in capsys.readouterr().err
    if not graphviz:  # a base install: the extra to install, not a traceback
        assert main([*args, "-o", str(tmp_path / "p.dot")]) == 2
        assert "pip install 'anychip[viz]'" in capsys.readouterr().err


def test_inspect_prints_text_and_json(tmp_path, capsys) -> None:
    path = tmp_path / "three.onnx"
    path.write_bytes(three_nodes())
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "opsets: ai.onnx" in out and "FLOPs" in out and re.search(r"^Sin\s+1\s", out, re.M)
    assert main(["inspect", str(path), "--json", "--devices", "xpu,cpu"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["devices"]["xpu"]["Sin"]["can"] == 0 and data["devices"]["cpu"]["Sin"]["can"] == 1
    assert main(["inspect", str(path), "--devices", "tpu"]) == 2


def test_run_json_profile_and_quiet(tmp_path, capsys) -> None:
    path = tmp_path / "three.onnx"
    path.write_bytes(three_nodes())
    prof = tmp_path / "prof.html"
    args = ["run", str(path), "--devices", "xpu,cpu", "--repeat", "2", "--json", "--quiet"]
    args += ["--placement-policy", "prefer-first"]
    assert main([*args, "--profile", str(prof)]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["devices"] == ["xpu", "cpu"] and data["outputs"][0]["shape"] == [4, 8]
    assert captured.err == ""  # --quiet: no notes, no fallback warning
    trace = json.loads((tmp_path / "prof.json").read_text())
    assert any(e.get("cat") == "copy" for e in trace["traceEvents"])
    assert "<svg" in prof.read_text()


def test_quiet_is_per_call(tmp_path) -> None:
    import logging

    path = tmp_path / "three.onnx"
    path.write_bytes(three_nodes())
    logger = logging.getLogger("anychip")
    before = logger.level
    assert main(["partition", str(path), "--devices", "xpu,cpu", "--quiet", "--json"]) == 0
    assert logger.level == before


def test_run_reports_the_first_run_runs_2_to_10_and_the_steady_time(tmp_path, capsys, monkeypatch):
    from anychip.core.api.session import Session

    path = tmp_path / "three.onnx"
    path.write_bytes(three_nodes())
    calls = []
    run = Session.run
    monkeypatch.setattr(Session, "run", lambda self, *a, **k: calls.append(1) or run(self, *a, **k))
    args = ["run", str(path), "--devices", "xpu,cpu", "--repeat", "3"]
    assert main(args) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("time:")]
    assert re.fullmatch(
        r"time: first run [\d.]+ ms, runs 2-10 mean [\d.]+ ms, steady [\d.]+ ms "
        r"\(median of 3 runs after run 10\)",
        line[0],
    ), line
    assert len(calls) == 1 + 9 + 3
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert all(data[k] > 0 for k in ("first_ms", "runs_2_10_mean_ms", "steady_ms"))
    assert data["runs"] == 3


def test_calibrate_measures_again_one_version_on(tmp_path, capsys, monkeypatch) -> None:
    """``anychip calibrate`` is the one way a calibration changes: each run numbers it."""
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(
        "anychip.core.plan.calibration_probes.measure_class",
        lambda backend, cls, repeat: [(1e3, 1e-6), (1e6, 1e-3)],
    )
    for version in (1, 2):
        assert main(["calibrate", "--device", "cpu"]) == 0
        assert f"cpu: calibration {version}, measured in" in capsys.readouterr().out


def test_demo_runs_the_default_devices_and_names_the_others(capsys) -> None:
    """Devices that join a session only when named (vendor runtimes, IREE, a CPU's OpenCL)
    are listed, not run, by default; ``--devices`` runs the ones named beside the cpu."""
    import anychip

    assert main(["demo", "--model", "squeezenet", "--devices", "xpu"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^  (\S+) +first run", out, flags=re.M)
    assert rows == ["cpu", "xpu+cpu"], out
    named = [d.name for d in anychip.devices() if d.available and not d.auto_select]
    if named:
        assert main(["demo", "--model", "squeezenet"]) == 0
        out = capsys.readouterr().out
        assert "used when named:" in out
        assert not any(f"{n}+cpu" in out for n in named), out
