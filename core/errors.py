"""Compatibility alias: the errors live at the package root (``anychip.errors``).

They moved so that ``ir/`` and ``opsets/`` import nothing from ``core/``; plugins written
against ``anychip.core.errors`` keep working through this module.
"""

from anychip.errors import *  # noqa: F403
from anychip.errors import __all__  # noqa: F401
