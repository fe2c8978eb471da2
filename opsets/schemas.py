"""Abstract operator schemas: ``ai.onnx`` and ``ai.onnx.ml`` from ``onnx.defs``, plus our own.

Invariants:
    * ONNX schemas are never retyped here: they come from ``onnx.defs.get_schema``.
    * Schemas of other domains (``anychip`` and plugin domains) are ``onnx.defs.OpSchema``
      objects registered through ``anychip_register_ops``; they live in a ``SchemaRegistry``
      and are not pushed into onnx's global registry.
    * A node "resolves" to the schema whose ``since_version`` is the greatest one not above the
      model's opset import for the node's domain (ONNX's versioning rule).
"""

from __future__ import annotations

import functools
from typing import Any

import onnx
import onnx.defs

from anychip.errors import UnsupportedOpError

__all__ = [
    "OpSchema",
    "SchemaRegistry",
    "ANYCHIP_DOMAIN",
    "ONNX_DOMAINS",
    "resolve",
    "attribute_defaults",
    "latest_opset",
]

OpSchema = onnx.defs.OpSchema
ANYCHIP_DOMAIN = "anychip"
ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training", "ai.onnx.preview")


def latest_opset(domain: str = "") -> int:
    """The newest opset version this onnx build knows for ``domain``."""
    if domain in ("", "ai.onnx"):
        return onnx.defs.onnx_opset_version()
    return _max_version(domain)


@functools.lru_cache(maxsize=16)
def _max_version(domain: str) -> int:
    best = 1
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == domain:
            best = max(best, s.since_version)
    return best


class SchemaRegistry:
    """Schemas of non-ONNX domains, filled by plugins' ``anychip_register_ops`` hooks."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], list[OpSchema]] = {}

    def add(self, schema: OpSchema) -> None:
        if schema.domain in ONNX_DOMAINS:
            raise UnsupportedOpError(
                f"schema {schema.name} uses ONNX domain {schema.domain!r}: custom operators "
                "must live in their own domain (for example 'anychip' or 'com.vendor')"
            )
        versions = self._by_key.setdefault((schema.domain, schema.name), [])
        versions.append(schema)
        versions.sort(key=lambda s: s.since_version)

    def domains(self) -> set[str]:
        return {d for d, _ in self._by_key}

    def snapshot(self) -> dict[tuple[str, str], list[OpSchema]]:
        """The schemas as they are now; ``restore`` goes back to them."""
        return {key: list(v) for key, v in self._by_key.items()}

    def restore(self, snapshot: dict[tuple[str, str], list[OpSchema]]) -> None:
        """Back to ``snapshot``, in this same registry: schemas added since are dropped."""
        self._by_key = {key: list(v) for key, v in snapshot.items()}

    def find(self, op_type: str, domain: str, opset: int) -> OpSchema | None:
        best = None
        for s in self._by_key.get((domain, op_type), ()):
            if s.since_version <= opset:
                best = s
        return best

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_key.values())


_DEFAULT_REGISTRY = SchemaRegistry()


def resolve(
    op_type: str, domain: str, opset: int, custom: SchemaRegistry | None = None
) -> OpSchema:
    """The schema in force for ``op_type`` at ``opset`` of ``domain``.

    Raises:
        UnsupportedOpError: naming the op, domain and opset when no schema exists.
    """
    domain = "" if domain == "ai.onnx" else domain
    if domain in ONNX_DOMAINS:
        return _onnx_schema(op_type, domain, opset)
    found = (custom or _DEFAULT_REGISTRY).find(op_type, domain, opset)
    if found is None:
        known = sorted((custom or _DEFAULT_REGISTRY).domains())
        raise UnsupportedOpError(_no_schema(op_type, domain, opset, known))
    return found


# onnxruntime's contrib ops that run a decoder subgraph in a search loop (or serve one with a
# beam-reordered cache): anychip models neither the loop's state nor the cache indirection.
_GENERATION_OPS = frozenset(
    {
        "WhisperBeamSearch",
        "DecoderMaskedMultiHeadAttention",
        "DecoderMaskedSelfAttention",
    }
)


def _no_schema(op_type: str, domain: str, opset: int, known: list[str]) -> str:
    name = f"{domain}.{op_type}"
    if domain == "com.microsoft" and op_type in _GENERATION_OPS:
        return (
            f"{name} is not supported: use onnxruntime for generation loops (the op "
            "runs a decoder in a search loop, or reads its beam-reordered cache, which anychip "
            "does not model)"
        )
    if domain in known:
        return (
            f"anychip has no kernel for {name} (opset {opset} of {domain!r}); run this model "
            "with onnxruntime, or install a plugin that defines the op (see `anychip devices`)"
        )
    return (
        f"no schema for operator {domain}::{op_type} at opset {opset}; domain {domain!r} is "
        f"not registered (known custom domains: {known or 'none'}). Install or enable the "
        "plugin that defines it (see `anychip devices`)."
    )


@functools.lru_cache(maxsize=4096)
def _onnx_schema(op_type: str, domain: str, opset: int) -> OpSchema:
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        raise UnsupportedOpError(
            f"operator {domain + '::' if domain else ''}{op_type} does not exist in "
            f"{domain or 'ai.onnx'} opset {opset} (onnx {onnx.__version__}); check the op name "
            "and the model's opset_import"
        ) from None


def attribute_defaults(schema: OpSchema) -> dict[str, Any]:
    """Default attribute values of ``schema`` as Python values (numpy arrays for tensors)."""
    key = (schema.domain, schema.name, schema.since_version)
    cached = _DEFAULTS.get(key)
    if cached is None:
        cached = {}
        for name, a in schema.attributes.items():
            proto = a.default_value
            if proto is not None and proto.type != 0:
                value = onnx.helper.get_attribute_value(proto)
                if isinstance(value, bytes):
                    value = value.decode()
                elif isinstance(value, onnx.TensorProto):
                    value = onnx.numpy_helper.to_array(value)
                elif isinstance(value, list) and value and isinstance(value[0], bytes):
                    value = [x.decode() for x in value]
                cached[name] = value
        _DEFAULTS[key] = cached
    return cached


_DEFAULTS: dict[tuple[str, str, int], dict[str, Any]] = {}
