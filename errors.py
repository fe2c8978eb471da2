"""The errors anychip raises. Every one is an ``AnychipError``.

Messages name what was wrong (the input, node, op, device), the expected and the given value,
and what to do about it. Nothing inside anychip raises a bare numpy or onnx exception at a
user: kernels' failures are re-raised as ``KernelError`` with the failing node's text.
"""

from __future__ import annotations

import sys
import warnings

__all__ = [
    "AnychipError",
    "ModelError",
    "GraphError",
    "PassLoopError",
    "UnsupportedOpError",
    "UnsupportedDTypeError",
    "InputError",
    "PlacementError",
    "KernelError",
    "BringUpError",
    "PluginError",
    "DeviceError",
    "OutOfMemoryError",
    "RunTerminatedError",
    "CompileTimeout",
]


class AnychipError(Exception):
    """Base class of every error anychip raises on purpose."""


class ModelError(AnychipError):
    """The model file or proto is malformed, truncated, or refers outside its folder."""


class GraphError(AnychipError):
    """The IR graph breaks an invariant (found by ``Graph.verify()``)."""


class PassLoopError(GraphError):
    """A graph pass did not reach a fixed point within its bound of rounds."""


class UnsupportedOpError(AnychipError):
    """No schema, or no backend among the session's devices, can run an operator."""


class UnsupportedDTypeError(AnychipError):
    """A tensor element type that anychip or a device cannot represent."""


class InputError(AnychipError, ValueError):
    """A feed passed to ``Session.run`` is missing, unknown, or of the wrong dtype or shape."""


class PlacementError(AnychipError):
    """Placement failed: a strict session would fall back, a pin is impossible, too many copies."""


class KernelError(AnychipError):
    """A kernel failed while running a node; the message carries the node's text and device."""


class BringUpError(KernelError):
    """A device kernel broke the contract the executor relies on, found by checking each call
    (``load(..., bring_up=True)``, the conformance kit): it wrote into an input, returned a
    host array or another device's handle, gave another answer than the CPU's kernel, or left
    device memory behind. The message names the node, the op and the kernel as registered."""


class PluginError(AnychipError):
    """A plugin failed to import or register, or was written for another hook API version."""


class DeviceError(AnychipError):
    """A device is unavailable or its driver reported a failure."""


class RunTerminatedError(AnychipError):
    """A request cancelled by its ``RunOptions.terminate`` (set before it or while it ran,
    from another thread); it returned nothing and the session stays usable."""


class CompileTimeout(DeviceError):
    """A graph compile ran past its ``compile_timeout`` (or its session closed) and was
    abandoned: its partition runs elsewhere, or, with ``strict``, this is raised
    (``core/plugin/budget.py``)."""

    def __init__(self, message: str, *, seconds: float | None = None) -> None:
        super().__init__(message)
        self.seconds = seconds


class OutOfMemoryError(DeviceError, MemoryError):
    """A device memory pool cannot satisfy an allocation (carries need and capacity)."""

    def __init__(
        self, message: str, *, device: str = "", need: int = 0, capacity: int = 0, in_use: int = 0
    ) -> None:
        super().__init__(message)
        self.device = device
        self.need = need
        self.capacity = capacity
        self.in_use = in_use


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` pointing at the first frame outside anychip: the user's line that
    called ``anychip.load`` (or whatever reached here), however deep inside anychip the warning
    is raised; a fixed ``stacklevel`` points into anychip's files as soon as a call is added."""
    frame = sys._getframe(1)
    level = 2  # 1 is this function; 2 its caller
    while frame is not None and _inside_anychip(frame.f_globals.get("__name__", "")):
        frame = frame.f_back  # type: ignore[assignment]
        # warnings skips the import machinery's frames as it counts: so does this
        if frame is not None and not _import_machinery(frame.f_code.co_filename):
            level += 1
    warnings.warn(message, category, stacklevel=level)


def _import_machinery(filename: str) -> bool:
    return "importlib" in filename and "_bootstrap" in filename


def _inside_anychip(module: str) -> bool:
    return module == "anychip" or module.startswith("anychip.")
