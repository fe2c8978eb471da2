"""Device memory shared by every backend: pools, and the liveness-based planner.

Pools (``pool.py``, ``caching.py``, ``arena.py``) wrap a backend's raw allocation
(``_alloc(nbytes)`` / ``_free(buffer)``) with statistics, a capacity and a strategy:

* ``MemoryPool``: no pooling, one raw allocation per block;
* ``CachingPool``: freed blocks cached per size class and reused (PyTorch / tinygrad style);
* ``ArenaPool``: best fit with coalescing inside large regions (onnxruntime BFC style).

Every pool class is built as ``PoolClass(device_name, capacity=..., allocator=...,
alignment=64)``; ``pool_factory(PoolClass, **options)`` turns it into the ``factory(backend)``
that ``registry.add_pool(kind, factory)`` expects. ``host.py`` has the numpy raw allocator and
``as_array`` for typed views of blocks.

Planning (``liveness.py``, ``planner.py``, ``plan_cache.py``): ``lifetimes(steps, sizes)``
gives each tensor's first and last step, ``plan_memory`` packs them into one block (greedy by
size), ``check_plan`` verifies a plan, ``PlanCache`` keeps plans per input-shape signature.
"""

from __future__ import annotations

from anychip.core.memory.arena import ArenaPool
from anychip.core.memory.caching import CachingPool, size_class
from anychip.core.memory.host import NumpyAllocator, as_array
from anychip.core.memory.liveness import Step, lifetimes
from anychip.core.memory.plan_cache import PlanCache, shape_signature
from anychip.core.memory.planner import (
    STRATEGIES,
    MemoryPlan,
    MemoryPlanError,
    TensorLifetime,
    check_plan,
    lower_bound,
    plan_memory,
)
from anychip.core.memory.pool import (
    Block,
    MemoryPool,
    PoolFactory,
    RawAllocator,
    align_up,
    pool_factory,
)
from anychip.core.memory.stats import MemoryStats

__all__ = [
    "RawAllocator",
    "Block",
    "MemoryPool",
    "CachingPool",
    "ArenaPool",
    "MemoryStats",
    "PoolFactory",
    "pool_factory",
    "align_up",
    "size_class",
    "NumpyAllocator",
    "as_array",
    "Step",
    "lifetimes",
    "TensorLifetime",
    "MemoryPlan",
    "MemoryPlanError",
    "plan_memory",
    "check_plan",
    "lower_bound",
    "STRATEGIES",
    "PlanCache",
    "shape_signature",
]
