"""Graph passes: small classes ``<VerbObject>Pass`` with ``call(graph) -> PassResult``."""

from __future__ import annotations

from anychip.ir.passes.base import Pass, PassManager, PassResult
from anychip.ir.passes.eliminate_dead_code import EliminateDeadCodePass
from anychip.ir.passes.fold_constants import FoldConstantsPass

__all__ = ["Pass", "PassManager", "PassResult", "EliminateDeadCodePass", "FoldConstantsPass"]
