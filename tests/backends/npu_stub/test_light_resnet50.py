"""The light ResNet-50 on ``npu,cpu``: every Conv on the NPU, outputs match the CPU, and the
report shows the partitions and copies."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

import anychip

PATH = os.path.join(
    os.path.dirname(onnx.__file__), "backend", "test", "data", "light", "light_resnet50.onnx"
)


@pytest.fixture(scope="module")
def sessions():
    return anychip.load(PATH, devices=["npu", "cpu"]), anychip.load(PATH, devices=["cpu"])


def test_every_conv_runs_on_the_npu_and_outputs_match(sessions):
    npu, cpu = sessions
    rep = npu.placement()
    convs = [n for n in rep.nodes if n.op_type == "Conv"]
    assert len(convs) == 53
    assert all(n.device == "npu" for n in convs), [n for n in convs if n.device != "npu"][:3]
    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    feeds = {npu.inputs[0].name: x}
    np.testing.assert_allclose(
        npu.run(None, feeds)[0], cpu.run(None, feeds)[0], rtol=1e-4, atol=1e-6
    )


def test_report_shows_partitions_and_copies(sessions):
    npu, _ = sessions
    rep = npu.placement()
    devices = [p.device for p in rep.partitions]
    assert "npu" in devices
    # The image goes in and the class scores come out: at least two copies per run, all
    # between host and NPU, with their sizes known.
    assert rep.copy_count >= 2 and rep.copy_bytes > 0
    assert all({c.src, c.dst} == {"cpu", "npu"} for c in rep.copies)
    assert any(c.tensor == npu.inputs[0].name and c.dst == "npu" for c in rep.copies)
    assert rep.load_copies, "weights move to the NPU once, at load"
    text = str(rep)
    assert "partitions:" in text and "copies per run:" in text
    for c in rep.copies:
        print(c)
    print(f"copies/run={rep.copy_count} bytes/run={rep.copy_bytes} partitions={devices}")
