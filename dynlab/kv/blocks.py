"""Block arithmetic, written once: the blocks a number of tokens occupies and the most full blocks a
prompt may hit. The KV cache manager (:mod:`dynlab.kv.cache_manager`) answers the scheduler in tokens with
these; a fleet's router estimate (:mod:`dynlab.engine.timed`) and the labs (:mod:`dynlab.labs.on_engine`)
use the same functions.
"""
from __future__ import annotations

__all__ = ["FullAttentionGroup"]


class FullAttentionGroup:
    """The full-attention KV cache group (vLLM's ``FullAttentionManager``): every token's KV is kept,
    so ``tokens`` need ``ceil(tokens / block)`` blocks. ``block``: tokens per block."""

    kind = "full_attention"

    def __init__(self, block: int):
        self.block = block

    def blocks_needed(self, tokens: int) -> int:
        """Blocks ``tokens`` tokens occupy in this group: ``ceil(tokens / block)`` (THE blocks-needed formula)."""
        return -(-tokens // self.block)

    def hit_cap(self, tokens: int) -> int:
        """The most leading full blocks a request of ``tokens`` tokens may hit: ``(tokens - 1) // block`` (THE
        last-token cap: vLLM recomputes the last token, ``max_cache_hit_length = request.num_tokens - 1`` in
        ``vllm/v1/core/kv_cache_manager.py:KVCacheManager.get_computed_blocks``, vLLM 0.33.0)."""
        return (tokens - 1) // self.block
