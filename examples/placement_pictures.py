"""Draw where each node of a model runs: an HTML page (always) and an SVG (with Graphviz).

    python examples/placement_pictures.py [OUT_DIR]

Writes ``squeezenet-npu.html`` and ``squeezenet-xpu.html`` (and ``.svg`` where Graphviz's
``dot`` is installed) into OUT_DIR (default: the current folder). On ``xpu,cpu`` the XPU has
no Conv kernel, so the page shows fallbacks, their reasons and the copies between devices.
Open the pages in a browser: search a node by name, zoom with the wheel, drag to pan.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import anychip
from anychip.viz import save_placement
from anychip.zoo import light_model


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model = light_model("squeezenet", seed=0)
    for accel in ("npu", "xpu"):
        # prefer-first: the accelerator takes every node it can (no cost model), so the
        # picture shows what it can and cannot run.
        with anychip.load(model, devices=[accel, "cpu"], placement_policy="prefer-first") as s:
            report = s.placement()
            page = save_placement(s, out_dir / f"squeezenet-{accel}.html")
            print(
                f"{page}: {report.by_device()}, {len(report.fallbacks())} fallbacks, "
                f"{report.copy_count} copies/run"
            )
            if shutil.which("dot"):
                print(save_placement(s, out_dir / f"squeezenet-{accel}.svg"))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("."))
