"""The shared fusion patterns (``ir/passes/patterns``): looked up by name, a new pass each time,
enabled per backend in the order named, and what the built-in backends enable."""

from __future__ import annotations

import pytest

from anychip.errors import PluginError
from anychip.ir.passes import patterns
from anychip.ir.passes.patterns.fuse_attention import FuseAttentionPass
from anychip.ir.passes.patterns.fuse_elementwise import FuseElementwisePass


class _Registry:
    """What ``enable`` needs of a registry: ``add_pass(pass_, backend=...)``."""

    def __init__(self) -> None:
        self.added: list[tuple[str, str]] = []
        self.passes: list[object] = []

    def add_pass(self, pass_: object, *, backend: str | None = None) -> None:
        self.added.append((backend, pass_.name))
        self.passes.append(pass_)


def test_names_and_a_new_pass_per_get() -> None:
    assert patterns.names() == ("attention", "elementwise")
    a, b = patterns.get("attention"), patterns.get("attention")
    assert isinstance(a, FuseAttentionPass) and a is not b
    e = patterns.get("elementwise")
    assert isinstance(e, FuseElementwisePass)
    assert (a.name, e.name) == ("fuse_attention", "fuse_elementwise")
    assert a.optimization and e.optimization  # optimize=False leaves them out


def test_unknown_name_lists_the_patterns_and_adds_nothing() -> None:
    with pytest.raises(PluginError, match="'attention', 'elementwise'"):
        patterns.get("softmax")
    reg = _Registry()
    with pytest.raises(PluginError, match="no fusion pattern named 'gelu'"):
        patterns.enable(reg, "elementwise", "gelu", backends=["a"])
    assert reg.added == []


def test_enable_adds_each_pattern_per_backend_in_the_order_named() -> None:
    reg = _Registry()
    patterns.enable(reg, "attention", "elementwise", backends=["a", "b"])
    assert reg.added == [
        ("a", "fuse_attention"),
        ("a", "fuse_elementwise"),
        ("b", "fuse_attention"),
        ("b", "fuse_elementwise"),
    ]
    assert len({id(p) for p in reg.passes}) == 4  # no pass object shared by two backends
    reg = _Registry()
    patterns.enable(reg, "attention", backends="xpu")
    assert reg.added == [("xpu", "fuse_attention")]


def test_a_name_taken_twice_is_refused() -> None:
    with pytest.raises(PluginError, match="already"):
        patterns.pattern("attention")(FuseElementwisePass)


def test_built_in_backends_enable_the_patterns() -> None:
    from anychip.core.plugin.host import get_registry

    registry = get_registry()

    def names(backend: str) -> list[str]:
        return [e.pass_.name for e in registry.passes_for(backend)]

    cpu = names("cpu")
    assert cpu.index("fuse_attention") < cpu.index("fuse_elementwise") == len(cpu) - 1
    assert names("xpu") == ["fuse_attention"]
    assert names("cuda") == ["fuse_elementwise"]  # registered without CuPy too
    opencl = [b for b in registry.backends if b.startswith("opencl")]
    for b in opencl:
        assert names(b) == ["fuse_attention", "fuse_elementwise"]
