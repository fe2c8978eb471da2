"""Compatibility alias: moved to ``anychip.core.memory.report``."""

from anychip.core.memory.report import *  # noqa: F403
from anychip.core.memory.report import __all__  # noqa: F401
