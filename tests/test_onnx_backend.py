"""onnx's backend conformance suite (``onnx.backend.test.BackendTest``) run through anychip,
once per device set, in this process.

Each device set (``cpu``, ``xpu,cpu``, ``npu,cpu``) gets its own ``BackendTest`` whose "CPU"
cases run on that anychip device list, so the same ~2000 cases run with the simulated XPU and
NPU in front of the CPU fallback. A node case none of whose ops the set's accelerator claims
(``anychip.core.plugin.claims``) is left out of that set: every node of it would be placed on
the cpu, which is the cpu set's run again. Their test classes carry the set in their name
(``OnnxBackendNodeModelTest_xpu_cpu``). The guarantee is that every case passes on every set:
a case the CPU cannot pass would fail there too, so an accelerator set can never pass less
than the CPU. A set whose accelerator is unavailable here is skipped with the reason. The
"CUDA" cases run only where anychip has a cuda device. ``ANYCHIP_CONFORMANCE_DEVICES=xpu,cpu``
runs one set only (several: separate them with ``;``). ``ort:cpu,cpu`` (onnxruntime's CPU
provider in front) and ``openvino:cpu,cpu`` run one node case in eight by default, every case
when named there. At the end of the run a line per set reports how many cases passed and where
their nodes ran;
``tests/conftest.py`` fails the run when an accelerator set placed too little on its
accelerator.

Every exclusion is one line with its reason: only cases whose output is random (checked by
distribution in tests/backends/cpu/test_kernels_tail2.py) or whose expected data is itself
defective.
"""

from __future__ import annotations

import functools
import os
import re
import tempfile
import zlib
from collections import Counter
from typing import Any

import onnx.backend.test
import pytest

from anychip.onnx_backend import AnychipBackend
from anychip.zoo import LIGHT_MODELS

_NAMED = os.environ.get("ANYCHIP_CONFORMANCE_DEVICES")
DEVICE_SETS = [
    d.strip()
    for d in (
        _NAMED or "cpu;xpu,cpu;npu,cpu;ort:cpu,cpu;openvino:cpu,cpu;iree-cpu,cpu;vulkan,cpu"
    ).split(";")
    if d.strip()
]
#: Sets the default run samples: one node case in N, by a stable hash of its name. Named in
#: ANYCHIP_CONFORMANCE_DEVICES, a set runs whole (onnxruntime's CPU behind ort:cpu: 1,847
#: passed, 0 failed on the whole suite, docs/perf/ort.md; OpenVINO's CPU behind openvino:cpu:
#: 1,761 passed, 0 failed, docs/perf/openvino.md).
#: IREE's sets compile twice per case (a node probe and the partition, 1-10 s each on a busy
#: 2-core machine): one case in 40 of every suite, not only the node cases
#: (docs/decisions/029-iree-devices.md).
SAMPLED = {"ort:cpu,cpu": 8, "openvino:cpu,cpu": 8, "iree-cpu,cpu": 40, "vulkan,cpu": 40}
SAMPLED_EVERY_SUITE = {"iree-cpu,cpu", "vulkan,cpu"}

# BackendTest writes the bundled light models' data sets under ONNX_HOME; keep them out of ~.
os.environ.setdefault("ONNX_HOME", os.path.join(tempfile.gettempdir(), "anychip-onnx-home"))


def _suffix(devices: str) -> str:
    return re.sub(r"\W+", "_", devices.lower()).strip("_")


#: The placements of the running case, which tests/conftest.py attaches to its report (so the
#: counts reach the summary also from pytest-xdist workers).
CASE_PLACED: list[tuple[str, Counter]] = []


def _backend_for(devices: str) -> type[AnychipBackend]:
    """anychip's onnx backend with the suite's "CPU" device mapped to ``devices``."""

    class ConformanceBackend(AnychipBackend):
        @classmethod
        def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> Any:
            if devices.lower() != "cpu":
                # The suite's tensors are tiny: without this the cost model would (rightly)
                # keep them on the CPU, and the accelerator's kernels would never run.
                kwargs.setdefault("cost_model", False)
            rep = super().prepare(model, devices if device.upper() == "CPU" else device, **kwargs)
            placed = Counter(r.device for r in rep.session.placement().nodes)
            CASE_PLACED.append((devices, placed))
            return rep

        @classmethod
        def supports_device(cls, device: str) -> bool:
            return _supports(devices if device.upper() == "CPU" else device)

    ConformanceBackend.__name__ = f"ConformanceBackend_{_suffix(devices)}"
    return ConformanceBackend


@functools.cache
def _supports(device: str) -> bool:
    """Asked once per case and device (12,000 times at collection): answered once each."""
    return AnychipBackend.supports_device(device)


def _cuda_available() -> bool:
    import anychip

    return any(d.name.startswith("cuda") and d.available for d in anychip.devices())


_has_cuda = _cuda_available()


def _all_on_cpu(devices: str) -> set[str]:
    """Cases another test runs already, left out of ``devices``' run. On an accelerator set:
    node cases none of whose ops the accelerator claims (placement puts every node of them on
    the cpu: the cpu set's run again); empty (run everything) when a device states no claims."""
    if devices.lower() == "cpu":
        # onnx's light models with their expected outputs on the cpu alone are
        # tests/test_light_models.py's first test: the same models, data and check.
        return {f"test_{name}" for name in LIGHT_MODELS}
    from anychip.conformance.cases import all_cases, ops_of
    from anychip.core.plugin.claims import claims_of
    from anychip.core.plugin.host import get_registry

    registry = get_registry()
    claimed: set[str] = set()
    for name in devices.lower().split(","):
        backend = registry.backends.get(name.strip())
        if backend is None or name.strip() == "cpu":
            continue
        ops = {c.op for c in claims_of(backend)}
        if not ops:
            return set()
        claimed |= ops
    return {c.name for c in all_cases("node") if not (ops_of(c) & claimed)}


def _sampled_out(devices: str, suite: str, attr: str) -> bool:
    """Whether the default run leaves this node case of ``devices`` out (``SAMPLED``)."""
    every = SAMPLED.get(devices.lower())
    if _NAMED or every is None:
        return False
    if suite != "OnnxBackendNodeModelTest" and devices.lower() not in SAMPLED_EVERY_SUITE:
        return False
    return zlib.crc32(attr.encode()) % every != 0


def _suite(devices: str) -> dict[str, Any]:
    backend_test = onnx.backend.test.BackendTest(_backend_for(devices), __name__)
    # fmt: off
    backend_test.exclude(r"^test_bernoulli")  # random output: tested by distribution in tail2
    backend_test.exclude(r"^test_loop16_seq_none_")  # runner defect: len() of a 0-d tensor
    backend_test.exclude(r"^test_squeezenet_")  # equal 1e10 logits: see test_light_models
    backend_test.xfail(r"^test_gradient_of_add")  # autodiff; onnxruntime and onnx reference fail
    # fmt: on
    cases = {}
    same_as_cpu = _all_on_cpu(devices)
    for name, case in backend_test.enable_report().test_cases.items():
        for attr in [a for a in vars(case) if a.startswith("test_")]:
            if attr.endswith("_cuda") and not _has_cuda:
                delattr(case, attr)  # no cuda device here: 2,000 items per set, all skips
            elif attr.endswith("_cpu") and attr[: -len("_cpu")] in same_as_cpu:
                delattr(case, attr)
            elif _sampled_out(devices, name, attr):
                delattr(case, attr)
            elif name == "OnnxBackendRealModelTest" and devices.lower() != "cpu":
                # whole CNNs (VGG-19, DenseNet-121, ...) through an accelerator: seconds each,
                # the slow tier (the cpu set runs them in the default one)
                setattr(case, attr, pytest.mark.slow(getattr(case, attr)))
        renamed = f"{name}_{_suffix(devices)}"
        case.__name__ = case.__qualname__ = renamed
        cases[renamed] = case
    return cases


for _devices in DEVICE_SETS:
    globals().update(_suite(_devices))


# Longest first: "xpu_cpu" also ends with "_cpu".
_BY_SUFFIX = {_suffix(d): d for d in sorted(DEVICE_SETS, key=len, reverse=True)}


def CASE_DEVICES(item: pytest.Item) -> str | None:
    """The device set a conformance case runs on (None for other tests)."""
    cls = getattr(item, "cls", None)
    name = cls.__name__ if cls is not None else ""
    return next((d for s, d in _BY_SUFFIX.items() if name.endswith("_" + s)), None)
