"""KV caches: the eviction-policy interface with the LRU cache the core needs, and GPU/CPU tiers.

- :mod:`~dynlab.kv.policies`: :class:`EvictionPolicy` (what policy plugins implement),
  :class:`LRUCache` and :class:`FutureIndex` (the indexed future of offline policies);
- :mod:`~dynlab.kv.tiers`: :class:`TwoTierCache`, a GPU tier backed by a CPU tier.

The other built-in policies (``fifo``, ``lfu``, ``opt``) are plugins, in ``dynlab_builtins.policies``.
"""
from dynlab.kv.policies import EvictionPolicy, FutureIndex, LRUCache
from dynlab.kv.tiers import TIER_RESULTS, TwoTierCache

__all__ = ["EvictionPolicy", "LRUCache", "FutureIndex", "TwoTierCache", "TIER_RESULTS"]
