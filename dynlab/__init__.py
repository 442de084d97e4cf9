"""dynlab: simulate the KV-aware request router in front of a fleet of LLM serving workers.

Plugins implement the hooks in :mod:`dynlab.hookspecs` with :data:`hookimpl`.
"""
from dynlab.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = ["hookimpl", "__version__"]
