"""onnxruntime's execution providers as anychip devices, and the options each device takes.

One device per provider the installed onnxruntime offers (``get_available_providers()``):
``ort:cpu``, and ``ort:cuda``, ``ort:tensorrt``, ``ort:dml``, ``ort:coreml``, ``ort:qnn``,
``ort:openvino``, ``ort:migraphx``, ``ort:cann`` where the build has them (another provider it
offers becomes ``ort:<name>``: ``DnnlExecutionProvider`` is ``ort:dnnl``). The well-known ones
it lacks are still registered, unavailable, with the reason, so ``anychip devices`` shows what
another onnxruntime package would add. ``AzureExecutionProvider`` (remote endpoints, no device)
is left out.

``memory`` is the ``OrtDevice`` type of the provider's own memory, where it has one that
Python can bind (CUDA, TensorRT, DirectML, CANN): tensors stay there between partitions as
``OrtValue``s, and anychip copies only at the edges. Providers that read host memory (CPU,
CoreML, QNN, OpenVINO, MIGraphX through Python) take numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from anychip.errors import DeviceError

__all__ = [
    "Provider",
    "WELL_KNOWN",
    "ANYCHIP_OPTIONS",
    "SessionSettings",
    "provider_for",
    "all_providers",
    "settings_from",
]


@dataclass(frozen=True)
class Provider:
    """One onnxruntime execution provider as one anychip device (``ort:<key>``).

    Attributes:
        key: the device name's suffix (``cuda`` in ``ort:cuda``).
        ep: onnxruntime's provider name (``CUDAExecutionProvider``).
        memory: the ``OrtDevice`` type of the provider's memory for IO binding (``cuda``,
            ``dml``, ``cann``), or None where it takes host arrays.
        about: what it runs on, for ``anychip devices``.
    """

    key: str
    ep: str
    memory: str | None = None
    about: str = ""

    @property
    def device(self) -> str:
        return f"ort:{self.key}"


WELL_KNOWN = (
    Provider("cpu", "CPUExecutionProvider", None, "onnxruntime's CPU kernels"),
    Provider("cuda", "CUDAExecutionProvider", "cuda", "NVIDIA GPUs"),
    Provider("tensorrt", "TensorrtExecutionProvider", "cuda", "NVIDIA GPUs through TensorRT"),
    Provider("dml", "DmlExecutionProvider", "dml", "DirectX 12 GPUs on Windows"),
    Provider("coreml", "CoreMLExecutionProvider", None, "Apple's Neural Engine and GPU"),
    Provider("qnn", "QNNExecutionProvider", None, "Qualcomm NPUs (HTP) and GPUs"),
    Provider("openvino", "OpenVINOExecutionProvider", None, "Intel CPUs, GPUs and NPUs"),
    Provider("migraphx", "MIGraphXExecutionProvider", None, "AMD GPUs"),
    Provider("cann", "CANNExecutionProvider", "cann", "Huawei Ascend NPUs"),
)
#: Providers that are no device: left out.
_NOT_DEVICES = {"AzureExecutionProvider"}


def provider_for(ep: str) -> Provider:
    """The well-known provider of that onnxruntime name, else ``ort:<name in lower case>``."""
    for p in WELL_KNOWN:
        if p.ep == ep:
            return p
    key = ep.removesuffix("ExecutionProvider").lower()
    return Provider(key, ep, None, f"onnxruntime's {ep}")


def all_providers() -> tuple[list[Provider], str]:
    """The providers to register, well-known first, and why none is available (empty when
    onnxruntime imports). Without onnxruntime, every well-known one (unavailable)."""
    try:
        import onnxruntime
    except ImportError as e:
        return list(WELL_KNOWN), (
            f"onnxruntime is not installed ({e}); pip install 'anychip[ort]' "
            "(or a provider's package: onnxruntime-gpu, onnxruntime-directml, ...)"
        )
    offered = [ep for ep in onnxruntime.get_available_providers() if ep not in _NOT_DEVICES]
    out = list(WELL_KNOWN)
    out += [provider_for(ep) for ep in offered if all(p.ep != ep for p in WELL_KNOWN)]
    return out, ""


# -- options -------------------------------------------------------------------------------------
#: anychip's own options; every other ``device_options`` key goes to the provider as is.
ANYCHIP_OPTIONS = {
    "threads": "onnxruntime's intra-op threads (0: its choice, one per physical core)",
    "optimization": "graph optimization level: disable, basic, extended, layout or all",
    "spinning": "let idle intra-op threads spin (True) or sleep at once (False, the default)",
}
_LEVELS = ("disable", "basic", "extended", "layout", "all")


@dataclass(frozen=True)
class SessionSettings:
    """How each partition's ``InferenceSession`` is made (from ``device_options``)."""

    threads: int = 0
    optimization: str = "all"
    spinning: bool = False
    provider_options: tuple[tuple[str, str], ...] = ()

    @property
    def device_id(self) -> int:
        """The provider's device (``device_id`` provider option; 0 by default)."""
        return int(dict(self.provider_options).get("device_id", 0))

    def session_options(self, ep: str) -> Any:
        """onnxruntime ``SessionOptions`` for one partition on provider ``ep``.

        Every provider but the CPU gets ``session.disable_cpu_ep_fallback``: a partition with a
        node it cannot take fails to load instead of running that node on onnxruntime's CPU.
        """
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 4  # refusals come back as exceptions with the reason
        level = ort.GraphOptimizationLevel
        so.graph_optimization_level = {
            "disable": level.ORT_DISABLE_ALL,
            "basic": level.ORT_ENABLE_BASIC,
            "extended": level.ORT_ENABLE_EXTENDED,
            "layout": getattr(level, "ORT_ENABLE_LAYOUT", level.ORT_ENABLE_ALL),
            "all": level.ORT_ENABLE_ALL,
        }[self.optimization]
        spin = "1" if self.spinning else "0"
        so.add_session_config_entry("session.intra_op.allow_spinning", spin)
        if ep != "CPUExecutionProvider":
            # onnxruntime refuses this entry together with an explicit CPU provider
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        return so


def settings_from(device: str, ep: str, options: dict[str, Any]) -> SessionSettings:
    """``device_options`` of one ``ort:`` device as ``SessionSettings``.

    Raises:
        DeviceError: a value of the wrong kind, or provider options given to ``ort:cpu``
            (its provider takes none: onnxruntime would ignore them silently).
    """
    known = ", ".join(f"{k} ({v})" for k, v in ANYCHIP_OPTIONS.items())
    threads = options.get("threads", 0)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise DeviceError(f"{device}: option threads must be an int >= 0, got {threads!r}")
    level = str(options.get("optimization", "all")).lower()
    if level not in _LEVELS:
        raise DeviceError(
            f"{device}: option optimization must be one of {list(_LEVELS)}, got "
            f"{options['optimization']!r}"
        )
    spinning = options.get("spinning", False)
    if not isinstance(spinning, bool):
        raise DeviceError(f"{device}: option spinning must be True or False, got {spinning!r}")
    rest = {k: v for k, v in options.items() if k not in ANYCHIP_OPTIONS}
    if rest and ep == "CPUExecutionProvider":
        raise DeviceError(
            f"{device}: unknown option(s) {sorted(rest)}; onnxruntime's CPU provider takes no "
            f"provider options; known: {known}"
        )
    provider = tuple(sorted((str(k), _option_text(v)) for k, v in rest.items()))
    if "device_id" in rest and not str(rest["device_id"]).isdigit():
        raise DeviceError(f"{device}: device_id must be an int >= 0, got {rest['device_id']!r}")
    return SessionSettings(int(threads), level, spinning, provider)


def _option_text(value: Any) -> str:
    """onnxruntime takes provider options as strings: booleans as 1/0."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
