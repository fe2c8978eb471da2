"""A new device's first load, timed in this process: ``python bench/first_load.py MODE``.

MODE is ``nocost`` (``cost_model=False``) or a calibration mode (``auto``, ``cached``,
``off``). Loads onnx's light ResNet-50 (seeded weights) on ``["xpu", "cpu"]`` once and prints
the time of ``anychip.load`` alone; with calibrations measured in the background, waits for
them and times a second load on the measured figures. Run it with ``ANYCHIP_CACHE_DIR`` set
to a folder whose ``calibration/`` was removed (docs/perf/first-load-calibration.md).
"""

from __future__ import annotations

import sys
import threading
import time

import anychip
from anychip.core.plugin.host import get_registry
from anychip.zoo import light_model


def _load(model: bytes, mode: str) -> tuple[float, object]:
    t0 = time.perf_counter()
    if mode == "nocost":
        sess = anychip.load(model, ["xpu", "cpu"], cost_model=False)
    else:
        sess = anychip.load(model, ["xpu", "cpu"], calibration=mode)
    return time.perf_counter() - t0, sess


def main(mode: str) -> None:
    model = light_model("resnet50", seed=0).SerializeToString()
    get_registry(["xpu"])  # the plugin's import is not the load's
    seconds, sess = _load(model, mode)
    print(f"{mode}: first load {seconds:.2f} s {sess.placement().by_device()}", flush=True)
    running = [t for t in threading.enumerate() if t.name.startswith("anychip-calibrate-")]
    if running:
        t0 = time.perf_counter()
        for t in running:
            t.join()
        names = ", ".join(t.name for t in running)
        print(f"  background calibration ({names}) done {time.perf_counter() - t0:.2f} s later")
        seconds, sess = _load(model, mode)
        print(f"  second load {seconds:.2f} s {sess.placement().by_device()}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "auto")
