"""Package list for the `anychip` package whose source is this folder.

The repository root *is* the package (``package-dir = {"anychip": "."}``), so setuptools'
automatic discovery would install ``core``, ``ir`` and ``backends`` as top-level packages.
This file finds the sub-packages and prefixes them, so adding a folder needs no edit here.
"""

from setuptools import find_packages, setup

_SKIP = ["tests*", "examples*", "bench*", "build*", "dist*", "docs*", "venv*", "*.egg-info"]

setup(packages=["anychip"] + ["anychip." + p for p in find_packages(".", exclude=_SKIP)])
