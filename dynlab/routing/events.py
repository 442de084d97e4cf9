"""The KV events a worker publishes when its cache changes (vLLM's and Dynamo's names)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockStored:
    """``worker`` stored ``hashes`` (block names, prefix order) in its KV cache (vLLM/Dynamo name)."""

    worker: int
    hashes: tuple


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """``worker`` evicted ``hashes`` from its KV cache (vLLM/Dynamo name)."""

    worker: int
    hashes: tuple


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """``worker`` dropped its whole KV cache (vLLM/Dynamo name)."""

    worker: int


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared
