"""Routing: what the router knows and how it decides.

- :mod:`~dynlab.routing.hashing`: chained block hashes and prefix overlap;
- :mod:`~dynlab.routing.index`: :class:`KvIndex`, which worker holds which blocks (``find_matches``);
- :mod:`~dynlab.routing.router`: :class:`KvRouter`, the lab's KV-aware router;
- :mod:`~dynlab.routing.strategy`: the strategy interface (:class:`Strategy`, :class:`Request`,
  :class:`RunContext`, :class:`FleetView`) that routing plugins implement;
- :mod:`~dynlab.routing.events`: the KV events workers publish (``BlockStored``, ``BlockRemoved``,
  ``AllBlocksCleared``).
"""
#: public name -> the module that defines it, imported on first access: the engine imports
#: ``dynlab.routing.strategy`` at start-up, which must not pull in the router and hashlib
_LAZY = {
    "block_hashes": "dynlab.routing.hashing",
    "overlap": "dynlab.routing.hashing",
    "dynamo_local_hashes": "dynlab.routing.hashing",
    "HASH_SCHEMES": "dynlab.routing.hashing",
    "KvIndex": "dynlab.routing.index",
    "KvRouter": "dynlab.routing.router",
    "Strategy": "dynlab.routing.strategy",
    "StrategyOption": "dynlab.routing.strategy",
    "RunContext": "dynlab.routing.strategy",
    "FleetView": "dynlab.routing.strategy",
    "Request": "dynlab.routing.strategy",
    "BlockStored": "dynlab.routing.events",
    "BlockRemoved": "dynlab.routing.events",
    "AllBlocksCleared": "dynlab.routing.events",
    "KvEvent": "dynlab.routing.events",
    "KvEventBatch": "dynlab.routing.events",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dynlab.routing' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))
