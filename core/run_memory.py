"""Compatibility alias: moved to ``anychip.core.memory.partition``."""

from anychip.core.memory.partition import *  # noqa: F403
from anychip.core.memory.partition import __all__  # noqa: F401
