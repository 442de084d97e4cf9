"""Routing: what the router knows and how it decides.

- :mod:`~dynlab.routing.hashing`: chained block hashes and prefix overlap;
- :mod:`~dynlab.routing.index`: :class:`KvIndex`, which worker holds which blocks (``find_matches``);
- :mod:`~dynlab.routing.router`: :class:`KvRouter`, the lab's KV-aware router;
- :mod:`~dynlab.routing.strategy`: the strategy interface (:class:`Strategy`, :class:`Request`,
  :class:`RunContext`, :class:`FleetView`) that routing plugins implement;
- :mod:`~dynlab.routing.events`: the KV events workers publish (``BlockStored``, ``BlockRemoved``,
  ``AllBlocksCleared``).
"""
from dynlab.routing.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from dynlab.routing.hashing import block_hashes, overlap
from dynlab.routing.index import KvIndex
from dynlab.routing.router import KvRouter
from dynlab.routing.strategy import FleetView, Request, RunContext, Strategy, StrategyOption

__all__ = [
    "block_hashes", "overlap", "KvIndex", "KvRouter", "Strategy", "StrategyOption", "RunContext", "FleetView",
    "Request", "BlockStored", "BlockRemoved", "AllBlocksCleared", "KvEvent",
]
