"""Run one model on an NPU with CPU fallback, and check it against the CPU alone.

    python examples/quickstart.py

The model is onnx's light SqueezeNet with seeded random weights (``anychip.zoo``); the NPU is
anychip's simulated one, so this runs on any machine.
"""

from __future__ import annotations

import numpy as np

import anychip
from anychip.zoo import light_model


def main() -> None:
    model = light_model("squeezenet", seed=0)
    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    with anychip.load(model, devices=["cpu"]) as cpu:
        name = cpu.inputs[0].name
        (expected,) = cpu.run(None, {name: x})
    with anychip.load(model, devices=["npu", "cpu"]) as sess:
        (y,) = sess.run(None, {name: x})
        report = sess.placement()
        print(f"nodes per device: {report.by_device()}")
        print(f"copies per run: {report.copy_count} ({report.copy_bytes} bytes)")
        print(f"cost model: {report.decision or 'not used'}")
    print(f"top class {int(y.argmax())}, max |npu,cpu - cpu| = {np.abs(y - expected).max():.2e}")
    assert np.allclose(y, expected, rtol=1e-3, atol=1e-4)


if __name__ == "__main__":
    main()
