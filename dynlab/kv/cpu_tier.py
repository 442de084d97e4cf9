"""A serving engine's CPU (host-memory) KV tier: blocks the GPU pool evicts, kept for reloading over PCIe.

The model of vLLM's CPU KV offloading and LMCache behind one engine
(:class:`dynlab.engine.worker.EngineWorker` with ``cpu_capacity > 0``):

- The tier holds at most ``capacity`` blocks, by name, in LRU order (an ``OrderedDict``, least
  recently used first).
- :meth:`offload`: names written here in order: the names the GPU pool evicted in a step (a victim
  tier, the engine's ``cpu_write="evict"``) or the blocks a step computed (write-through,
  ``cpu_write="compute"``); a name already here is touched (most recent). When the tier is full the least recently used
  name is dropped. The net change is returned as ``(stored, removed)``: names that were not here
  before and are now, names that were here before and are not any more (a name written and
  dropped again in the same call is in neither), the payloads of ``BlockStored(medium="CPU")`` and
  ``BlockRemoved(medium="CPU")``.
- :meth:`lookup`: a prefix-cache lookup continues here where the GPU hits end: how many names
  from ``start`` on are held here, contiguously (the first name missing ends the hit, as in
  :class:`dynlab.kv.tiers.TwoTierCache`'s document lookup).
- :meth:`touch`: a CPU hit makes the names most recent (their copies stay here: a block loaded
  back to the GPU keeps its host copy, as the cache lab's two-tier rule says).

**Load rule** (vLLM v1's asynchronous KV-connector loads: a request whose external blocks are in
transit waits in ``WAITING_FOR_REMOTE_KVS`` and is skipped by the scheduler until they have
arrived): a request with ``c`` CPU hits is admitted at ``now`` with its GPU hits taken and the blocks
for its loads and first chunk allocated, but it is not scheduled: its load occupies the worker's
host-to-device link from ``max(now, link free)`` for ``c * load_ms_per_block`` ms (loads queue on
the link, FIFO), and it joins the first step that starts at or after the load's end (scheduled
before the waiting queue, the loaded blocks named then). Other requests' steps go on meanwhile; a
bulk decode run is cut at the load's end. Its TTFT thus includes the wait for the load plus its
own prefill of the remaining tokens; ``first_scheduled_ms`` (queue wait) is the admission. Writes
(GPU -> CPU) use the other direction of the link and take no step time.

``capacity`` 0 is a tier that holds nothing (every offload is dropped, nothing is returned).
Sizes are in blocks; converting bytes to blocks is the caller's (:func:`cpu_blocks`).
"""
from __future__ import annotations

import math

from collections import OrderedDict
from itertools import compress, count, islice
from operator import not_
from typing import Sequence

__all__ = ["CpuTier", "cpu_blocks", "queue_load", "DEFAULT_PCIE_GBPS"]

#: GB/s per direction between host and GPU memory. PCIe Gen4 x16 signals 16 GT/s on 16 lanes with
#: 128b/130b coding: 16 * 16 * 128 / 130 / 8 = 31.5 GB/s raw per direction (PCI-SIG, PCI Express Base
#: Specification 4.0); after packet overheads, copies from pinned host memory reach about 25 GB/s in
#: practice (what CUDA's ``bandwidthTest`` sample typically reports on Gen4 x16 hosts). Gen5 doubles both.
DEFAULT_PCIE_GBPS = 25.0


def cpu_blocks(memory_gb: float, kv_bytes_per_block: float) -> int:
    """Blocks of ``kv_bytes_per_block`` bytes that fit in ``memory_gb`` GB (10^9 bytes): floor of the ratio.

    Raises ``ValueError`` when ``memory_gb`` < 0 or ``kv_bytes_per_block`` <= 0, or when the count is
    not a finite number (``memory_gb`` so large that ``memory_gb * 1e9`` overflows).
    """
    if memory_gb < 0:
        raise ValueError(f"cpu memory must be >= 0 GB, got {memory_gb}")
    if kv_bytes_per_block <= 0:
        raise ValueError(f"KV bytes per block must be > 0, got {kv_bytes_per_block}")
    blocks = memory_gb * 1e9 // kv_bytes_per_block
    if not math.isfinite(blocks):
        raise ValueError(f"--cpu-memory-gb {memory_gb:g} is too large: its bytes overflow a float")
    return int(blocks)


def queue_load(kv, req, blocks: int, now: float) -> None:
    """Queue the load of ``blocks`` blocks of ``req`` from the CPU tier on ``kv``'s host-to-device link (a KV
    cache manager's ``link_free``, ms: loads queue FIFO from ``max(now, link free)``, ``load_ms_per_block`` ms
    each): ``req.ready_ms`` (ms) is its end; counted in ``kv.loaded_blocks``. Every KV cache manager's rule."""
    start = kv.link_free if kv.link_free > now else now
    req.ready_ms = kv.link_free = start + blocks * kv.load_ms_per_block
    kv.loaded_blocks += blocks


class CpuTier:
    """An LRU set of at most ``capacity`` block names (see the module docstring).

    Raises ``ValueError`` for a negative ``capacity``.
    """

    __slots__ = ("capacity", "_lru")

    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError(f"cpu capacity must be >= 0 blocks, got {capacity}")
        self.capacity = capacity
        self._lru: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, name) -> bool:
        return name in self._lru

    def names(self) -> set:
        """The names held (a copy)."""
        return set(self._lru)

    def lookup(self, names: Sequence[int], start: int, max_blocks: int) -> int:
        """How many of ``names[start:]`` (at most ``max_blocks``) are held here contiguously from ``start``."""
        if max_blocks <= 0 or not self._lru:
            return 0
        window = list(islice(names, start, start + max_blocks))
        misses = compress(count(), map(not_, map(self._lru.__contains__, window)))
        return next(misses, len(window))

    def touch(self, names: Sequence[int]) -> None:
        """Make held ``names`` the most recently used, in the order given."""
        move = self._lru.move_to_end
        for name in names:
            move(name)

    def offload(self, names: Sequence[int]) -> tuple[tuple, tuple]:
        """Write ``names`` (in order); returns ``(stored, removed)``, the net change."""
        cap = self.capacity
        if not names or not cap:
            return (), ()
        lru = self._lru
        before: dict = {}  # name -> held before this call, for every name this call changed
        for name in names:
            if name in lru:
                lru.move_to_end(name)
                continue
            before.setdefault(name, False)
            lru[name] = None
            if len(lru) > cap:
                gone = lru.popitem(last=False)[0]
                before.setdefault(gone, True)
        if not before:
            return (), ()
        stored = tuple(n for n, held in before.items() if not held and n in lru)
        removed = tuple(n for n, held in before.items() if held and n not in lru)
        return stored, removed
