"""Built-in engine kinds (``--engine``), registered through the ``dynlab`` entry-point group.

``vllm`` and ``sglang`` live in :mod:`dynlab.engine.kinds` (the core's default); this plugin registers it exactly as a
third-party package would register its own kind.
"""
from __future__ import annotations

from dynlab import hookimpl
from dynlab.engine.kinds import Sglang, Vllm


@hookimpl
def dynlab_register_engine_kinds(register):
    register(Vllm)
    register(Sglang)
