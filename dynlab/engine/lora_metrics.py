"""The ``lora`` section of a timed run's result: :class:`LoraRecorder`, a :class:`~dynlab.engine.metrics.Recorder`
the aggregated topology adds when its workers model LoRA adapters (``--max-loras``, :mod:`dynlab.engine.lora`)."""
from __future__ import annotations

from typing import Any, Sequence

from dynlab.engine.lora import LORA_ATTR, LoraSpec
from dynlab.engine.metrics import Recorder

__all__ = ["LoraRecorder"]


class LoraRecorder(Recorder):
    """The ``lora`` section of a timed run whose workers model adapters (``--max-loras``), absent (no key) when
    no request named an adapter. Keys: the settings (``max_loras``, ``max_cpu_loras``, ``max_lora_rank``,
    ``adapter_bytes`` and ``adapter_bytes_source``, ``load_ms`` and ``cold_load_ms`` per load), ``requests``
    (requests naming an adapter), ``adapters`` (distinct names), ``loads``, ``cold_loads``, ``evictions``,
    ``cpu_evictions`` (sums over workers), ``load_time_ms`` (ms steps waited for loads, summed over workers),
    ``loads_per_worker``."""

    def __init__(self, spec: LoraSpec):
        self.spec = spec
        self.requests = 0
        self.names: set = set()

    def on_arrival(self, req, t: float) -> None:
        a = req.attrs.get(LORA_ATTR)
        if a:
            self.requests += 1
            self.names.add(a)

    def result(self, engines: Sequence) -> dict[str, Any]:
        if not self.requests:
            return {}
        s = self.spec
        slots = [e.lora for e in engines]
        return {"lora": {
            "max_loras": s.max_loras, "max_cpu_loras": s.max_cpu_loras, "max_lora_rank": s.rank,
            "adapter_bytes": s.adapter_bytes, "adapter_bytes_source": s.bytes_source,
            "load_ms": round(s.load_ms, 6), "cold_load_ms": round(s.cold_ms, 6),
            "requests": self.requests, "adapters": len(self.names),
            "loads": sum(x.loads for x in slots), "cold_loads": sum(x.cold_loads for x in slots),
            "evictions": sum(x.evictions for x in slots), "cpu_evictions": sum(x.cpu_evictions for x in slots),
            "load_time_ms": round(sum(x.load_ms for x in slots), 3),
            "loads_per_worker": [x.loads for x in slots]}}
