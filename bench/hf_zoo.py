"""A zoo of Hugging Face architectures from small ``transformers`` configs, exported to ONNX and
run on three device sets against onnxruntime: a table of pass / mismatch (max error) /
AnychipError (first line) / export failed.

    HF_HUB_OFFLINE=1 python bench/hf_zoo.py [--out /work/zoo] [--only bert,gpt2]
        [--sets "npu,cpu;cpu;opencl,cpu"] [--jobs 1] [--timeout 300] [--skip-export]
        [--table docs/perf/hf-zoo-table.md]

Needs torch, transformers and onnxscript beside anychip (a venv of its own: torch is large;
docs/perf/hf-zoo.md says how it was made). Nothing is downloaded: each model is built from its
config with seeded random weights (``torch.manual_seed(0)``; 2 layers or fewer, hidden 32,
vocabulary 128; ``bench/_hf_archs.py``). Each architecture is exported twice, with the
TorchScript exporter (``dynamo=False``, opset 17) and with ``dynamo=True`` (opset 18,
onnxscript's optimizer), shapes static, the first output only (``last_hidden_state``), into
``<out>/<arch>.<exporter>.onnx`` with its seeded inputs in ``<arch>.npz``; an export that fails
is recorded with its first line. Then every export runs once per device set, each in a
subprocess with a timeout and the compile caches on (in ``<out>/cache``):

- ``npu,cpu``: ``strict=True, failover=False, cost_model=False, background_compile=False``:
  every node on the NPU (a node it cannot run is a ``PlacementError``), compiled at load (or
  on the first run, which traces shapes onnx's inference left unknown); each partition must
  have run compiled by the second run ("host only" otherwise);
- ``cpu``: the defaults;
- ``opencl,cpu``: ``failover=False, cost_model=False`` (what OpenCL claims runs there; the rest
  on the CPU).

The reference is onnxruntime's CPU provider with its optimizations off (the model as written);
each of two runs passes within ``rtol=1e-3, atol=1e-4``. Every export and run is a subprocess
of this file (``_export``, ``_run``) so that a crash or a hang is a row, not the end of the
zoo.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

__all__ = ["EXPORTERS", "SETS", "export_one", "run_one", "table", "main"]

EXPORTERS = ("torchscript", "dynamo")
#: Device set -> the ``anychip.load`` keywords of that set.
SETS: dict[str, dict[str, Any]] = {
    "npu,cpu": dict(strict=True, failover=False, cost_model=False, background_compile=False),
    "cpu": {},
    "opencl,cpu": dict(failover=False, cost_model=False),
}
RTOL, ATOL = 1e-3, 1e-4
SEED = 0


def _first_line(e: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()  # no terminal colours
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def _fallen(message: str) -> str:
    """The ops of a strict placement's refusal, counted (its lines read ``name (Op) -> ...``)."""
    ops = re.findall(r"^\s+\S+ \((\w+)\) -> ", message, re.M)
    return " " + ", ".join(f"{op} x{ops.count(op)}" for op in sorted(set(ops))) if ops else ""


# --- export (a child process: needs torch and transformers) --------------------------------


def export_one(name: str, exporter: str, out: str) -> dict[str, Any]:
    """Build ``name`` seeded and export it with ``exporter`` to ``<out>/<name>.<exporter>.onnx``;
    its inputs go to ``<out>/<name>.npz``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    import onnx
    import torch
    import transformers

    from bench._hf_archs import ARCHS, example_inputs

    arch = next(a for a in ARCHS if a.name == name)
    torch.manual_seed(SEED)
    cfg = getattr(transformers, arch.config)(
        **arch.kwargs, use_cache=False, attn_implementation="eager"
    )
    model = getattr(transformers, arch.model)(cfg)
    if arch.part == "encoder":
        model = model.get_encoder()
    model.eval()
    feeds = example_inputs(arch, SEED)
    names = list(feeds)
    np.savez(os.path.join(out, f"{name}.npz"), **feeds)

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, *tensors: Any) -> Any:
            result = self.inner(**dict(zip(names, tensors, strict=True)))
            hidden = getattr(result, "last_hidden_state", None)
            return hidden if hidden is not None else result[0]

    args = tuple(torch.from_numpy(feeds[n]) for n in names)
    path = os.path.join(out, f"{name}.{exporter}.onnx")
    with torch.no_grad():
        if exporter == "torchscript":
            torch.onnx.export(
                Wrapped(), args, path, input_names=names, output_names=["output"],
                opset_version=17, dynamo=False,
            )  # fmt: skip
        else:
            program = torch.onnx.export(
                Wrapped(), args, input_names=names, output_names=["output"],
                opset_version=18, dynamo=True, optimize=True,
            )  # fmt: skip
            program.save(path)
    proto = onnx.load(path)
    for node in proto.graph.node:  # the exporter's stack traces name this machine's paths
        del node.metadata_props[:]
    onnx.save(proto, path)
    return {"status": "ok", "path": path, "nodes": len(proto.graph.node)}


# --- run (a child process: anychip and onnxruntime) ------------------------------------------


def run_one(path: str, feeds_path: str, devices: str) -> dict[str, Any]:
    """Run the export at ``path`` on ``devices`` (a key of ``SETS``) and onnxruntime."""
    import numpy as np
    import onnxruntime as ort

    import anychip
    from anychip.errors import AnychipError

    stored = dict(np.load(feeds_path))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ref = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        feeds = {i.name: stored[i.name] for i in ref.get_inputs()}
        want = ref.run(None, feeds)
    except Exception as e:  # the reference itself cannot run it: not anychip's row
        return {"status": "ort failed", "reason": _first_line(e)}
    flat = [w for w in want if w.dtype.kind == "f" and w.size > 1 and np.ptp(w) < ATOL]
    if flat:  # a comparison with a constant says nothing: the config's weights must change
        w = flat[0]
        return {
            "status": "degenerate",
            "reason": f"onnxruntime's output is constant ({w.flat[0]:g})",
        }
    t0 = time.perf_counter()
    try:
        sess = anychip.load(path, devices=devices.split(","), **SETS[devices])
        load_s = time.perf_counter() - t0
        # Twice: a partition traced on its first run (shapes onnx's inference left unknown)
        # is compiled then, and the second run is the device's.
        runs = [sess.run(None, feeds) for _ in range(2)]
        by_device = dict(sess.placement().by_device())
        served = [sp.telemetry() for sp in sess.compiled.specialized.values()]
    except AnychipError as e:
        return {"status": "error", "reason": _first_line(e) + _fallen(str(e))}
    except Exception as e:
        return {"status": "crash", "reason": _first_line(e)}
    if any(t["hits"] + t["disk_hits"] == 0 for t in served):
        return {"status": "host only", "reason": f"a partition never ran compiled: {served}"}
    worst = 0.0
    ok = True
    for g, w in zip([g for got in runs for g in got], want * 2, strict=True):
        g = np.asarray(g)
        if g.shape != w.shape or g.dtype != w.dtype:
            return {"status": "mismatch", "reason": f"{g.dtype}{g.shape} != {w.dtype}{w.shape}"}
        if g.dtype.kind == "f":
            diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
            both_nan = np.isnan(g) & np.isnan(w)
            diff = np.where(both_nan, 0.0, diff)
            worst = max(worst, float(np.nan_to_num(diff, nan=np.inf).max(initial=0.0)))
            ok &= bool(np.allclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True))
        else:
            ok &= bool(np.array_equal(g, w))
    return {
        "status": "pass" if ok else "mismatch",
        "max_err": worst,
        "load_s": round(load_s, 2),
        "by_device": by_device,
    }


# --- the parent ------------------------------------------------------------------------------


def _child(args: list[str], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run this file with ``args`` in a subprocess; its last stdout line is the JSON result."""
    cmd = [sys.executable, os.path.abspath(__file__), *args]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env or os.environ.copy()
        )
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "reason": f"no answer in {timeout:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        try:
            return json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    err = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    last = err[-1] if err else f"exit code {proc.returncode}"
    return {"status": "crash", "reason": f"exit code {proc.returncode}: {last}"[:200]}


def _export_child(name: str, exporter: str, out: str) -> None:
    try:
        result = export_one(name, exporter, out)
    except Exception as e:
        result = {"status": "export failed", "reason": _first_line(e)}
    print(json.dumps(result))


def _run_child(path: str, feeds_path: str, devices: str) -> None:
    print(json.dumps(run_one(path, feeds_path, devices)))


def _map(jobs: int, fn: Any, items: list[Any]) -> list[Any]:
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(fn, items))


def export_all(out: str, names: list[str], timeout: float, jobs: int) -> dict[str, Any]:
    """Export every architecture with both exporters; ``<out>/manifest.json``."""
    manifest_path = os.path.join(out, "manifest.json")
    manifest: dict[str, Any] = {}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
    items = [(n, e) for n in names for e in EXPORTERS]

    def one(item: tuple[str, str]) -> tuple[str, str, dict[str, Any]]:
        n, e = item
        t0 = time.perf_counter()
        r = _child(["_export", n, e, out], timeout)
        if r["status"] == "crash":
            r["status"] = "export failed"
        r["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"export {n:16s} {e:11s} {r['status']} {r.get('reason', '')}", flush=True)
        return n, e, r

    for n, e, r in _map(jobs, one, items):
        manifest.setdefault(n, {})[e] = r
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return manifest


def run_all(
    out: str, manifest: dict[str, Any], names: list[str], sets: list[str], timeout: float,
    jobs: int,
) -> dict[str, Any]:  # fmt: skip
    """Run each export on each device set; ``<out>/results.json``."""
    env = {**os.environ, "ANYCHIP_CACHE_DIR": os.path.join(out, "cache")}
    items = [
        (n, e, s)
        for n in names
        for e in EXPORTERS
        if manifest.get(n, {}).get(e, {}).get("status") == "ok"
        for s in sets
    ]

    def one(item: tuple[str, str, str]) -> tuple[str, str, str, dict[str, Any]]:
        n, e, s = item
        path = os.path.join(out, f"{n}.{e}.onnx")
        r = _child(["_run", path, os.path.join(out, f"{n}.npz"), s], timeout, env)
        err = f" {r['max_err']:.1e}" if "max_err" in r else ""
        print(f"run {n:16s} {e:11s} {s:11s} {r['status']}{err} {r.get('reason', '')}", flush=True)
        return n, e, s, r

    results: dict[str, Any] = {}
    path = os.path.join(out, "results.json")
    if os.path.exists(path):  # an --only run updates its rows
        with open(path) as f:
            results = json.load(f)
    for n in names:
        results.pop(n, None)
    for n, e, s, r in _map(jobs, one, items):
        results.setdefault(n, {}).setdefault(e, {})[s] = r
    with open(path, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    return results


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    status = r["status"]
    if status == "pass":
        return f"pass ({r['max_err']:.0e})"
    if status == "mismatch" and "max_err" in r:
        return f"**mismatch** max err {r['max_err']:.2e}"
    reason = r.get("reason", "").replace("|", "\\|")
    return f"**{status}**: {reason}" if reason else f"**{status}**"


def table(manifest: dict[str, Any], results: dict[str, Any], sets: list[str]) -> str:
    """Markdown: counts, then one row per architecture and exporter."""
    from bench._hf_archs import ARCHS

    kinds = {a.name: a.kind for a in ARCHS}
    rows = []
    passed: set[str] = set()
    counts = {s: 0 for s in sets}
    runs = 0
    for n in sorted(manifest, key=lambda k: (kinds.get(k, ""), k)):
        for e in EXPORTERS:
            ex = manifest[n].get(e)
            if ex is None:
                continue
            if ex["status"] != "ok":
                cells = [_cell(ex)] + [""] * (len(sets) - 1)
            else:
                got = results.get(n, {}).get(e, {})
                cells = [_cell(got.get(s)) for s in sets]
                runs += 1
                for s in sets:
                    counts[s] += got.get(s, {}).get("status") == "pass"
                if all(got.get(s, {}).get("status") == "pass" for s in sets):
                    passed.add(n)
            rows.append(f"| {n} | {kinds.get(n, '')} | {e} | " + " | ".join(cells) + " |")
    exported = {n for n in manifest if any(v["status"] == "ok" for v in manifest[n].values())}
    head = [
        f"Architectures: {len(manifest)}; exported by at least one exporter: {len(exported)}; "
        f"passing on every set with at least one export: {len(passed)}.",
        "",
        f"Exports run: {runs}; passing per set: "
        + ", ".join(f"`{s}` {counts[s]}/{runs}" for s in sets)
        + ".",
        "",
        "| architecture | kind | exporter | " + " | ".join(f"`{s}`" for s in sets) + " |",
        "|---|---|---|" + "---|" * len(sets),
    ]
    return "\n".join(head + rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_export"]:
        return _export_child(*argv[1:4])
    if argv[:1] == ["_run"]:
        return _run_child(*argv[1:4])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="/work/zoo", help="the folder of the exports (not the repo)")
    ap.add_argument("--only", default="", help="comma-separated architectures (default: all)")
    ap.add_argument("--sets", default=";".join(SETS), help="device sets, ';'-separated")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per export or run")
    ap.add_argument("--jobs", type=int, default=1, help="subprocesses at once")
    ap.add_argument("--skip-export", action="store_true", help="reuse <out>/manifest.json")
    ap.add_argument("--table", default="", help="also write the table to this file")
    args = ap.parse_args(argv)
    from bench._hf_archs import ARCHS

    known = [a.name for a in ARCHS]
    names = [n for n in args.only.split(",") if n] or known
    unknown = sorted(set(names) - set(known))
    if unknown:
        ap.error(f"unknown architecture(s) {unknown}; known: {', '.join(known)}")
    sets = [s for s in args.sets.split(";") if s]
    bad = sorted(set(sets) - set(SETS))
    if bad:
        ap.error(f"unknown device set(s) {bad}; known: {'; '.join(SETS)}")
    os.makedirs(args.out, exist_ok=True)
    if args.skip_export:
        with open(os.path.join(args.out, "manifest.json")) as f:
            manifest = json.load(f)
    else:
        manifest = export_all(args.out, names, args.timeout, args.jobs)
    manifest = {n: manifest[n] for n in names if n in manifest}
    results = run_all(args.out, manifest, names, sets, args.timeout, args.jobs)
    text = table(manifest, results, sets)
    print(text)
    if args.table:
        with open(args.table, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
