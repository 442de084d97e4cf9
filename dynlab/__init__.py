"""dynlab: simulate the KV-aware request router in front of a fleet of LLM serving workers.

The stable public API: ``__version__`` and, imported on first use so that ``import dynlab`` imports
nothing (the console script's first import, :mod:`dynlab._entry`, must be quick), :data:`hookimpl`,
:func:`block_hashes`, :func:`dynamo_local_hashes`,
:func:`overlap`, :class:`KvRouter`, :class:`KvIndex`, :class:`SimConfig` and :func:`run`.

Plugins implement the hooks in :mod:`dynlab.hookspecs` with :data:`hookimpl`.
"""
__version__ = "0.1.0"

#: public name -> the module that defines it, imported on first access
_LAZY = {
    "hookimpl": "dynlab.hookspecs",
    "block_hashes": "dynlab.routing.hashing",
    "overlap": "dynlab.routing.hashing",
    "dynamo_local_hashes": "dynlab.routing.hashing",
    "KvRouter": "dynlab.routing.router",
    "KvIndex": "dynlab.routing.index",
    "SimConfig": "dynlab.engine.config",
    "run": "dynlab.sim.runner",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dynlab' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))
