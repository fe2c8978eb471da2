"""The OpenVINO plugin for the tests, whether or not anychip's installed metadata lists it.

An anychip installed before ``backends/openvino`` existed has no ``openvino`` entry point
(``pip install -e .`` again adds it); the tests then register the plugin in-process, which
is the same module under the same name.
"""

from __future__ import annotations

__all__ = ["ensure_registered"]


def ensure_registered() -> None:
    """Register ``anychip.backends.openvino`` as plugin ``openvino`` unless it is found."""
    from anychip.core.plugin.discovery import discover
    from anychip.core.plugin.host import register_plugin

    if any(c.name == "openvino" for c in discover()):
        return
    import anychip.backends.openvino as plugin

    register_plugin(plugin, "openvino")
