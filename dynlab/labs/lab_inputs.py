"""The inputs of the two seed labs as :mod:`dynlab.labs.reproduce` runs them (``shared/seeds/000`` steps 4-6,
``shared/seeds/002`` steps 2-7: capacities in tokens, link bandwidths in GB/s = 1e9 B/s) and the figures lab
000 quotes from its own measurements, which the report compares against.
"""
from __future__ import annotations

from dynlab.labs.scenario import DEFAULT_DOCS, DEFAULT_TOKENS

#: lab 002's GPU capacities (``cliff.json``) and CPU-tier capacities (``cpu_cliff.json``), in tokens, and the
#: CPU capacity of its offload run (``offload.json``)
GPU_SWEEP = ("21520", "30000", "40000", "45000", "50109", "50110")
CPU_SWEEP = ("0", "20000", "30000", "40000", "50109", "50110", "56000")
OFFLOAD_CPU = 56000
#: lab 000's KV-cost prompt (tokens) and link bandwidths (GB/s) of ``kvcost.json``
KV_TOKENS = 1500
KV_GBPS = ("0.112", "0.608", "13.4")
#: What each bandwidth of ``kvcost.json`` is, as lab 000 step 6 explains it.
KV_LINKS = {
    "0.112": "TCP between servers",
    "0.608": "the disaggregated KV transfer measured in the lab's reading",
    "13.4": "PCIe Gen4 x8, host to GPU",
}
#: Beyond the labs: worker capacities in blocks (``unbounded``: the labs' simulator) and strategies.
BOUNDED_CAPACITIES = ("unbounded", "60", "42")
BOUNDED_MODES = ("rr", "random", "kv", "kv-events")
#: Hits of 60 repeat requests that lab 000 quotes from its 2026-10-07 measurement (real, bounded caches).
LAB000_MEASURED = {"rr": (35, 43), "kv": (53, 60)}
#: Hits lab 000 quotes for ``--router-mode kv`` with workers that publish no KV events.
LAB000_MEASURED_NO_EVENTS = (39, 44, 41)


def total_tokens() -> int:
    """The tokens of lab 002's documents: :data:`~dynlab.labs.scenario.DEFAULT_DOCS` x
    :data:`~dynlab.labs.scenario.DEFAULT_TOKENS` (the mark on both cliff plots and the report's "all of them")."""
    return DEFAULT_DOCS * DEFAULT_TOKENS
