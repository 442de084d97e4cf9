"""The KV events a worker publishes when its cache changes (vLLM's and Dynamo's names).

The fields follow vLLM's ``vllm/distributed/kv_events.py``: ``BlockStored`` carries the
stored blocks' names (``block_hashes``, prefix order), the name of the block before the
first one (``parent_block_hash``; ``None``: the blocks start at the root, or the publisher
does not say), their ``token_ids`` when known, the ``block_size`` they were hashed at, the
``lora_name`` and the storage ``medium``; ``BlockRemoved`` carries ``block_hashes`` and
``medium``. Events travel in per-step :class:`KvEventBatch` es (vLLM's ``KVEventBatch``:
a timestamp, the events, the data-parallel rank) with a sequence number (vLLM's ZMQ
publisher sends it in a frame of its own).

Every field after ``worker`` and the names has a default, so ``BlockStored(worker, hashes)``
is the simulator's cheap form: ``block_size=None`` means "in the receiver's own block size"
(not checked) and ``parent_block_hash=None`` means "not said" (not checked).

``runs`` (dynlab's own field, not vLLM's; ``None``: not given): the same blocks as ``hashes``, as
``(group, offset mask)`` pairs: bit ``o`` of ``mask`` names block ``(group << 10) + o`` (dynlab's
engine names, ``trace id * 1024 + offset``: :mod:`dynlab.engine.names`). dynlab's engine fills it when
its block pool works on runs (:mod:`dynlab.kv.run_pool`), for free, so that an index keyed the same
way (:class:`dynlab.routing.run_index.RunIndex`) applies the event per run; ``hashes`` stays the
source of truth (a reader may ignore ``runs``). It is not compared (``==``) nor shown (``repr``).

``dp_rank`` (every event; ``None``: not said, a worker without attention-DP ranks): the attention-DP rank of
the worker that published it, as vLLM's and SGLang's KV events carry their engine's ``data_parallel_rank``
and Dynamo's router keys its workers by ``(worker_id, dp_rank)`` (ai-dynamo/dynamo PR #3597). dynlab's
ranks (``--dp-attention``, :mod:`dynlab.engine.lockstep`) publish it; ``worker`` stays the routing target
(``worker id x dp + dp_rank``), which the router indexes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from dynlab.slots import quick_maker

#: the storage tiers events name (vLLM's ``medium``): a worker's GPU pool and its CPU tier (``--cpu-capacity``)
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"


@dataclass(frozen=True, slots=True)
class BlockStored:
    """``worker`` stored ``hashes`` (block names, prefix order) in its KV cache (vLLM/Dynamo name).

    ``hashes`` is vLLM's ``block_hashes`` (also readable under that name); the other fields are
    vLLM's (module docstring). ``token_ids``: ``len(hashes) * block_size`` ints when known.
    """

    worker: int
    hashes: tuple
    parent_block_hash: Optional[object] = None
    token_ids: Optional[tuple] = None
    block_size: Optional[int] = None
    lora_name: Optional[str] = None
    medium: str = MEDIUM_GPU
    dp_rank: Optional[int] = None
    runs: Optional[tuple] = field(default=None, compare=False, repr=False)

    @property
    def block_hashes(self) -> tuple:
        """vLLM's name for :attr:`hashes`."""
        return self.hashes


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """``worker`` evicted ``hashes`` from its KV cache ``medium`` (vLLM/Dynamo name)."""

    worker: int
    hashes: tuple
    medium: str = MEDIUM_GPU
    dp_rank: Optional[int] = None
    runs: Optional[tuple] = field(default=None, compare=False, repr=False)

    @property
    def block_hashes(self) -> tuple:
        """vLLM's name for :attr:`hashes`."""
        return self.hashes


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """``worker`` dropped its whole KV cache (vLLM/Dynamo name)."""

    worker: int
    dp_rank: Optional[int] = None


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KvEventBatch:
    """One engine step's events, as vLLM's ``KVEventBatch``: ``ts`` (seconds, the publisher's
    clock), ``events`` (a tuple of :data:`KvEvent`), ``seq`` (the publisher's sequence number,
    from 0, one per batch) and ``dp_rank`` (vLLM's ``data_parallel_rank``; ``None``: not said)."""

    ts: float
    events: tuple
    seq: int = 0
    dp_rank: Optional[int] = None


#: ``BlockStored(worker, hashes)`` and ``BlockRemoved(worker, hashes)``, about twice as fast
#: (:func:`dynlab.slots.quick_maker`): the count-based bus makes one or two per request served
stored_event = quick_maker(BlockStored, ("worker", "hashes"))
removed_event = quick_maker(BlockRemoved, ("worker", "hashes"))
