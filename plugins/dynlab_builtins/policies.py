"""Built-in eviction policies, registered through the ``dynlab`` entry-point group.

The classes live in :mod:`dynlab.cache`; this plugin only registers them, exactly as a
third-party package would register its own.
"""
from __future__ import annotations

from dynlab import hookimpl
from dynlab.cache import FIFOCache, LFUCache, LRUCache, OptCache


@hookimpl
def dynlab_register_eviction_policies(register):
    for cls in (LRUCache, FIFOCache, LFUCache, OptCache):
        register(cls)
