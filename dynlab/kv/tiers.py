"""A two-tier (GPU + CPU) KV cache.

:class:`TwoTierCache` puts a CPU tier behind the GPU tier, as LMCache and vLLM's CPU KV
offloading do: what falls out of the GPU can be loaded back from CPU memory instead of being
recomputed. Each tier is an :class:`~dynlab.kv.policies.EvictionPolicy` instance.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Hashable, Optional

from dynlab.kv.policies import EvictionPolicy, FutureIndex, LRUCache

__all__ = ["TwoTierCache", "TIER_RESULTS"]

#: The three results of :meth:`TwoTierCache.access`.
TIER_RESULTS = ("gpu", "cpu", "miss")


class TwoTierCache:
    """A GPU tier backed by a CPU tier, each an eviction-policy cache (LRU by default).

    ``TwoTierCache(gpu_capacity, cpu_capacity, policy=LRUCache, future=None)``: ``gpu`` and
    ``cpu`` are ``policy(capacity, future=future)`` instances (``future`` is needed only by
    offline policies such as ``opt``; it is indexed once and shared by both tiers).
    Capacities and sizes are in the caller's unit (tokens in the seed lab). Errors are those of
    the policy (negative capacity or size -> ``ValueError``).

    ``access(key, size)`` returns:

    1. ``"gpu"``: GPU hit; the CPU tier is not touched.
    2. ``"cpu"``: GPU miss, CPU hit; the CPU copy is touched (most recent under LRU) and the
       entry is also stored on the GPU (if it fits there).
    3. ``"miss"``: both miss; the entry is stored on both tiers (each where it fits).

    The tiers are inclusive and independent: what the GPU evicts is not written to the CPU then,
    because the CPU already received a copy when the entry was first computed (LMCache's and
    vLLM's CPU offloading store on the way in). ``cpu_capacity=0`` means no CPU tier: nothing is
    stored there (not even size-0 entries), so the cache behaves exactly as a lone GPU cache.
    Source: steps 5-6 of the seed lab ``shared/seeds/002``.
    """

    def __init__(
        self,
        gpu_capacity: int,
        cpu_capacity: int,
        policy: type[EvictionPolicy] = LRUCache,
        future: Optional[Sequence[Hashable]] = None,
    ):
        if future is not None and not isinstance(future, FutureIndex):
            future = FutureIndex(future)
        self.gpu: EvictionPolicy = policy(gpu_capacity, future=future)
        self.cpu: EvictionPolicy = policy(cpu_capacity, future=future)

    def access(self, key: Hashable, size: int = 1) -> str:
        gpu, cpu = self.gpu, self.cpu
        if key in gpu:
            gpu.access(key, size)
            return "gpu"
        if key in cpu:
            cpu.access(key, size)
            gpu.access(key, size)
            return "cpu"
        gpu.access(key, size)
        if cpu.capacity:  # capacity 0 means no CPU tier, not even for size-0 entries
            cpu.access(key, size)
        return "miss"

    def tier(self, key: Hashable) -> Optional[str]:
        """``"gpu"``, ``"cpu"`` or ``None``: where ``access(key)`` would find ``key``; changes nothing."""
        if key in self.gpu:
            return "gpu"
        if key in self.cpu:
            return "cpu"
        return None

    def __contains__(self, key: object) -> bool:
        return key in self.gpu or key in self.cpu

    def __repr__(self) -> str:
        return f"<TwoTierCache gpu={self.gpu!r} cpu={self.cpu!r}>"
