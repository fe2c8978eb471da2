"""The pictures' and the profiler's costs: how long drawing takes and how much timing every
node slows a run, against onnxruntime's own profiler.

Drawing: for the light ResNet-50 and a transformer layer on ``npu,cpu`` and 24 stacked
transformer layers on ``xpu,cpu`` (no cost model: 96 partitions), the time to build the view
and the HTML page, its size, boxes drawn for the nodes (folds), and Graphviz's SVG time.

Profiling: a transformer layer on ``xpu,cpu`` (kernel mode: every node timed) and on
``npu,cpu`` (graph mode: partitions timed); plain runs and profiled runs interleaved in rounds,
medians (both the session's steps on checked feeds, as ``Session.profile`` times them; the
profiled ones with every timer in place); onnxruntime plain vs ``enable_profiling`` in the
same rounds. Printed as ratios (profiled / plain).

    python bench/viz.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import anychip
from anychip.viz import placement_view
from anychip.viz.dot import svg_bytes
from anychip.viz.html import placement_html
from anychip.viz.layout import layout
from anychip.zoo import light_model
from tests.models import transformer_layer


def stacked(layers: int) -> object:
    from onnx import compose

    small = {"hidden": 64, "ffn": 128, "seq": 16}
    model = compose.add_prefix(transformer_layer(seed=0, **small), "l0/")
    for i in range(1, layers):
        nxt = compose.add_prefix(transformer_layer(seed=i, **small), f"l{i}/")
        io = [(model.graph.output[0].name, nxt.graph.input[0].name)]
        model = compose.merge_models(model, nxt, io_map=io)
    return model


def drawing() -> None:
    cases = [
        ("resnet50 npu,cpu", light_model("resnet50", seed=0), ["npu", "cpu"], {}),
        ("transformer npu,cpu", transformer_layer(), ["npu", "cpu"], {}),
        ("24 layers xpu,cpu", stacked(24), ["xpu", "cpu"], {"cost_model": False}),
    ]
    print(
        f"{'model':<22} {'nodes':>5} {'boxes':>5} {'parts':>5} {'html ms':>8} {'KiB':>6} "
        f"{'svg ms':>7}"
    )
    for name, model, devices, opts in cases:
        with anychip.load(model, devices=devices, calibration="off", **opts) as sess:
            t0 = time.perf_counter()
            view = placement_view(sess)
            page = placement_html(view)
            t_html = time.perf_counter() - t0
            boxes = len(layout(view).units)
            t_svg = "-"
            if shutil.which("dot"):
                t0 = time.perf_counter()
                svg_bytes(view)
                t_svg = f"{(time.perf_counter() - t0) * 1e3:.0f}"
            print(
                f"{name:<22} {len(view.graph_nodes):>5} {boxes:>5} {len(view.partitions):>5} "
                f"{t_html * 1e3:>8.1f} {len(page) / 1024:>6.0f} {t_svg:>7}"
            )


def _ort(model: object, feeds: dict, profile: bool) -> tuple[object, str]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    ), "ort"


def profiling(rounds: int) -> None:
    model = transformer_layer()
    x = np.random.default_rng(0).standard_normal((1, 64, 256)).astype(np.float32)
    feeds = {"x": x}
    ort_plain, _ = _ort(model, feeds, False)
    ort_prof, _ = _ort(model, feeds, True)
    for devices in (["xpu", "cpu"], ["npu", "cpu"]):
        opts = {"cost_model": False}  # no feedback trials switching placements between rounds
        with anychip.load(model, devices=devices, calibration="off", **opts) as sess:
            for _ in range(20):  # past the session's feedback runs and trials
                sess.run(None, feeds)
            plain, prof, o_plain, o_prof = [], [], [], []
            arrays = sess._feeds.check(feeds)  # the same call the profiler times, untimed
            for _ in range(rounds):
                t0 = time.perf_counter()
                sess.compiled.steps.run(arrays)
                plain.append(time.perf_counter() - t0)
                prof.append(sess.profile(feeds, runs=1).run_seconds[0])
                t0 = time.perf_counter()
                ort_plain.run(None, feeds)
                o_plain.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                ort_prof.run(None, feeds)
                o_prof.append(time.perf_counter() - t0)
            m = statistics.median
            print(
                f"transformer {','.join(devices)}: anychip plain {m(plain) * 1e3:.2f} ms, "
                f"profiled {m(prof) * 1e3:.2f} ms (x{m(prof) / m(plain):.2f}); onnxruntime "
                f"plain {m(o_plain) * 1e3:.2f} ms, profiled {m(o_prof) * 1e3:.2f} ms "
                f"(x{m(o_prof) / m(o_plain):.2f})"
            )
    ort_prof.end_profiling()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    drawing()
    profiling(args.rounds)


if __name__ == "__main__":
    main()
