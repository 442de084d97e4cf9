"""LoRA adapters on a timed worker (``--max-loras``): GPU and CPU adapter slots, load times, the batch rule, figures.

A request names its adapter by its ``lora_name`` attribute (a trace field, or a workload spec's ``adapters``;
:data:`LORA_ATTR`); a request without one runs on the base model. The rules, each from vLLM 0.33.0:

- **Slots** (``vllm/lora/worker_manager.py``, ``LRUCacheWorkerLoRAManager.add_adapter``;
  ``vllm/lora/model_manager.py``, ``LRUCacheLoRAModelManager``): a worker holds at most ``max_loras`` adapters
  in GPU slots and ``max_cpu_loras`` in host memory, each an LRU cache. Each step activates the adapters of the
  requests it schedules (vLLM's model runner calls ``set_active_adapters`` with the batch's adapters before the
  forward pass): one already in a GPU slot is touched; one in host memory is copied to a GPU slot (a **load**);
  one in neither is first read from disk into host memory (a **cold load**, evicting the least recently used
  adapter there, which also leaves its GPU slot: vLLM's ``AdapterLRUCache._on_remove`` deactivates it), then
  copied. A full set of GPU slots evicts its least recently used adapter (an **eviction**). dynlab touches the
  batch's resident adapters before loading its missing ones, so a batch never evicts an adapter of its own
  (vLLM walks a set, whose order could; at most ``max_loras`` distinct adapters make a batch, so it never must).
- **Load time** (dynlab's model, from the same calls): the loads are synchronous before the step's forward pass,
  so the step starts that much later: a load from host memory takes ``bytes / tp / pcie`` (each GPU copies its
  share over its own link, as the CPU KV tier's loads: :func:`dynlab.engine.serving.cpu_tier_size`), a cold
  load ``bytes / disk + bytes / tp / pcie``; ``bytes`` is :func:`dynlab.models.lora.adapter_bytes` at
  ``max_lora_rank`` (every adapter at the maximum rank: an upper bound), ``pcie`` ``--pcie-gbps`` (default 25
  GB/s, PCIe Gen4 x16 in practice), ``disk`` ``--lora-disk-gbps`` (:data:`DISK_GBPS`).
- **The batch rule** (``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``): after the running requests
  are scheduled, the adapters of every running request (scheduled in this step or not) are the step's adapters;
  the waiting loop **skips** a request whose adapter is not among them when they already number ``max_loras``
  (it stays in the queue, in its place, and the loop goes on with the next request); each admitted request
  adds its adapter. Running requests are never preempted or held back for it.
- ``max_cpu_loras`` defaults to ``max_loras`` and may not be smaller (``vllm/config/lora.py``,
  ``LoRAConfig.__post_init__``); ``max_lora_rank`` defaults to 16 and is one of vLLM's ``MaxLoRARanks``.

Not modelled (refused, :func:`check_config`): a P/D split, a CPU KV tier (its loaded requests re-enter through
their own queue) and async scheduling.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["DISK_GBPS", "LORA_ATTR", "AdaptersInFlight", "LoraSpec", "LoraSlots", "check_config", "lora_spec"]

#: the request attribute naming its adapter (vLLM's ``LoRARequest.lora_name``; :mod:`dynlab.traces.format`)
LORA_ATTR = "lora_name"
#: GB/s (1e9 B/s) a cold adapter is read from disk at: the link of a PCIe 4.0 x4 NVMe drive, 16 GT/s x 4 lanes
#: x 128/130 encoding = 7.88 GB/s, which such drives' sequential reads approach; an upper bound (vLLM also
#: parses the safetensors file on the CPU): calibrate it with ``--lora-disk-gbps``
DISK_GBPS = 7.0


@dataclass(frozen=True)
class LoraSpec:
    """A run's adapter settings: ``max_loras`` GPU slots and ``max_cpu_loras`` host slots per worker,
    ``rank``, ``adapter_bytes`` (bytes of one adapter) and ``bytes_source`` (its derivation), ``load_ms``
    (host memory -> GPU, ms) and ``cold_ms`` (disk -> host -> GPU, ms)."""

    max_loras: int
    max_cpu_loras: int
    rank: int
    adapter_bytes: int
    bytes_source: str
    load_ms: float
    cold_ms: float


def lora_spec(config, model) -> Optional[LoraSpec]:
    """The :class:`LoraSpec` of ``config`` (a ``SimConfig``) serving ``model`` (a
    :class:`~dynlab.models.spec.ModelSpec`), ``None`` without ``--max-loras``. Raises ``ValueError`` as
    :func:`dynlab.models.lora.adapter_bytes`."""
    if config.max_loras is None:
        return None
    from dynlab.models.lora import adapter_bytes

    size, how = adapter_bytes(model, config.max_lora_rank)
    load_ms = size / config.tp / (config.pcie_gbps * 1e9) * 1000.0
    cold_ms = size / (config.lora_disk_gbps * 1e9) * 1000.0 + load_ms
    cpu = config.max_cpu_loras if config.max_cpu_loras is not None else config.max_loras
    return LoraSpec(config.max_loras, cpu, config.max_lora_rank, size, how, load_ms, cold_ms)


def check_config(config) -> None:
    """Raise ``ValueError`` (one line) for adapter settings dynlab does not model or vLLM refuses:
    ``max_cpu_loras < max_loras``, a rank vLLM does not accept, a P/D split, a CPU KV tier, async scheduling."""
    from dynlab.models.lora import VLLM_LORA_RANKS

    if config.max_lora_rank not in VLLM_LORA_RANKS:
        raise ValueError(f"--max-lora-rank must be one of vLLM's {', '.join(map(str, VLLM_LORA_RANKS))}, "
                         f"got {config.max_lora_rank}")
    if config.max_loras is None:
        return
    if config.max_cpu_loras is not None and config.max_cpu_loras < config.max_loras:
        raise ValueError(f"--max-cpu-loras ({config.max_cpu_loras}) must be >= --max-loras ({config.max_loras}), "
                         "as vLLM requires")
    for given, what in ((config.pd() is not None, "a P/D split"),
                        (config.cpu_capacity is not None or config.cpu_memory_gb is not None, "a CPU KV tier"),
                        (config.async_scheduling, "--async-scheduling")):
        if given:
            raise ValueError(f"--max-loras: dynlab does not model LoRA adapters with {what}")


class LoraSlots:
    """One worker's adapter slots (the module docstring's rules). Counters: ``loads`` (copies to a GPU slot),
    ``cold_loads`` (of which read from disk first), ``evictions`` (adapters leaving a GPU slot: its LRU, or
    leaving host memory), ``cpu_evictions``, ``load_ms``
    (ms the worker's steps waited for loads)."""

    __slots__ = ("spec", "gpu", "cpu", "loads", "cold_loads", "evictions", "cpu_evictions", "load_ms")

    def __init__(self, spec: LoraSpec):
        self.spec = spec
        self.gpu: OrderedDict = OrderedDict()  # adapter -> None, least recently used first
        self.cpu: OrderedDict = OrderedDict()
        self.loads = self.cold_loads = self.evictions = self.cpu_evictions = 0
        self.load_ms = 0.0

    @staticmethod
    def adapters(sched: Sequence) -> list:
        """The distinct adapters of a step's ``(request, tokens)`` pairs, in schedule order."""
        out: list = []
        for req, _ in sched:
            a = req.attrs.get(LORA_ATTR)
            if a and a not in out:
                out.append(a)
        return out

    def activate(self, sched: Sequence) -> float:
        """Activate the adapters of the step ``sched`` (its ``(request, tokens)`` pairs); returns the ms its
        loads take (0.0 when every adapter is in a GPU slot)."""
        wanted = self.adapters(sched)
        if not wanted:
            return 0.0
        gpu, cpu = self.gpu, self.cpu
        missing = []
        for a in wanted:  # the batch's resident adapters first: none of them is evicted by the loads below
            if a in cpu:
                cpu.move_to_end(a)
            if a in gpu:
                gpu.move_to_end(a)
            else:
                missing.append(a)
        ms = 0.0
        for a in missing:
            ms += self._load(a)
        self.load_ms += ms
        return ms

    def _load(self, a) -> float:
        """Copy adapter ``a`` to a GPU slot (from disk first when host memory lacks it); its ms."""
        spec, gpu, cpu = self.spec, self.gpu, self.cpu
        ms = spec.load_ms
        if a not in cpu:
            if len(cpu) >= spec.max_cpu_loras:
                old, _ = cpu.popitem(last=False)
                self.cpu_evictions += 1
                if old in gpu:  # leaving host memory deactivates it (vLLM's AdapterLRUCache._on_remove)
                    del gpu[old]
                    self.evictions += 1
            cpu[a] = None
            self.cold_loads += 1
            ms = spec.cold_ms
        if len(gpu) >= spec.max_loras:
            gpu.popitem(last=False)
            self.evictions += 1
        gpu[a] = None
        self.loads += 1
        return ms


class AdaptersInFlight:
    """The router's book of LoRA adapters in flight: ``per_worker[w]`` maps each adapter (a request's
    :data:`LORA_ATTR`) to its requests routed to worker ``w`` and not yet finished, rejected or requeued (an
    adapter with none is left out). :class:`~dynlab.engine.timed.TimedFleet` keeps it beside its load counts and
    its :class:`~dynlab.routing.strategy.FleetView` shows ``per_worker`` as ``lora_adapters``: what vLLM's
    ``vllm:lora_requests_info`` metric (running and waiting adapters) tells llm-d's router."""

    __slots__ = ("per_worker",)

    def __init__(self, workers: int):
        self.per_worker: list = [{} for _ in range(workers)]

    def add_worker(self) -> None:
        """A worker joined (its id the next one): no adapter in flight there yet."""
        self.per_worker.append({})

    def add(self, attrs, w: int) -> None:
        """A request with attributes ``attrs`` (``None`` or a mapping) was routed to worker ``w``."""
        if attrs and (a := attrs.get(LORA_ATTR)):
            held = self.per_worker[w]
            held[a] = held.get(a, 0) + 1

    def remove(self, attrs, w: int) -> None:
        """A request :meth:`add` counted on worker ``w`` left it."""
        if attrs and (a := attrs.get(LORA_ATTR)):
            held = self.per_worker[w]
            held[a] -= 1
            if not held[a]:
                del held[a]
