"""What the host CPU offers the CPU backend: its model and the instruction sets that decide
its kernels (AVX2, AVX-512, VNNI, BF16, AMX), read once from ``/proc/cpuinfo``."""

from __future__ import annotations

import functools
import platform

__all__ = ["FEATURES", "bf16_math", "cpu_flags", "cpu_model", "summary"]

#: The flags shown by ``anychip devices`` and the report, in this order.
FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


@functools.cache
def _cpuinfo() -> tuple[str, frozenset[str]]:
    model, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = frozenset(value.split())
    except OSError:
        pass
    # platform.processor() runs `uname -p` in a subprocess on Linux: only when /proc says nothing
    return model or platform.processor() or platform.machine(), flags


def cpu_model() -> str:
    """The CPU's model name (``lscpu``'s "Model name")."""
    return _cpuinfo()[0]


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (empty where ``/proc/cpuinfo`` is not readable)."""
    return _cpuinfo()[1]


def summary() -> str:
    """``"Intel(R) Xeon(R) Processor: avx2 avx512f ... amx_bf16"``: the model and the
    ``FEATURES`` it has."""
    have = [f for f in FEATURES if f in cpu_flags()]
    return f"{cpu_model()}: {' '.join(have) or 'none of ' + ', '.join(FEATURES)}"


def bf16_math() -> tuple[bool, str]:
    """Whether oneDNN can run float32 products in bfloat16 here, and the instructions it
    would use (or why not)."""
    flags = cpu_flags()
    if "amx_bf16" in flags:
        return True, "AMX tiles (amx_bf16)"
    if "avx512_bf16" in flags:  # measured on an AMD EPYC (Zen 4): oneDNN 2023.2's fpmath
        # mode bf16 left its products in float32 (4e-7 off float64), so none is claimed
        return False, "bf16 not used: AVX-512 BF16 without AMX, oneDNN keeps float32 math here"
    return False, "this CPU has neither AMX nor AVX-512 BF16 instructions (float32 math kept)"
