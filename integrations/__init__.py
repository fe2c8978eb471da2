"""Integrations with engines that run anychip at scale; each is its own extra.

- ``anychip.integrations.ray``: batch inference on Ray Data, one session per actor
  (``pip install anychip[ray]``).
"""

from __future__ import annotations

__all__: list[str] = []
