"""The CPU tier's figures of a timed run (``gpu_hit_blocks``, ``cpu_hit_blocks``, ``pcie_bytes``, ``cpu_blocks``):
:class:`TierRecorder`, a :class:`~dynlab.engine.metrics.Recorder` the aggregated topology adds when the run has a
CPU tier (:mod:`dynlab.kv.cpu_tier`)."""
from __future__ import annotations

from typing import Any, Sequence

from dynlab.engine.metrics import Recorder

__all__ = ["TierRecorder"]


class TierRecorder(Recorder):
    """The CPU tier's figures of a run, summed over its engines (the tier's counters are the engines').

    ``kv_bytes_per_block``: bytes of one block's KV (:func:`dynlab.engine.serving.cpu_tier_size`).
    ``gpu_hit_blocks`` / ``cpu_hit_blocks``: prefix-hit blocks of the requests' first admissions found
    on the GPU / loaded from the CPU tier (engine blocks); ``pcie_bytes``: bytes over PCIe both ways,
    ``(blocks loaded + blocks written) * kv_bytes_per_block`` (an int); ``cpu_blocks``: blocks the CPU
    tier of each worker held at the end.
    """

    def __init__(self, kv_bytes_per_block: float):
        self.kv_bytes_per_block = kv_bytes_per_block

    def result(self, engines: Sequence) -> dict[str, Any]:
        moved = sum(e.loaded_blocks + e.offloaded_blocks for e in engines)
        return {"gpu_hit_blocks": sum(e.gpu_hit_blocks for e in engines),
                "cpu_hit_blocks": sum(e.cpu_hit_blocks for e in engines),
                "pcie_bytes": int(round(moved * self.kv_bytes_per_block)),
                "cpu_blocks": [len(e.cpu) if e.cpu is not None else 0 for e in engines]}
