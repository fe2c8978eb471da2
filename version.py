"""anychip's version (ground floor: imports nothing; cache keys are built on it)."""

__version__ = "0.2.0"
