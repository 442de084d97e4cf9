"""The cache lab's document scenario served by one timed engine worker: the CPU tier checked against the lab.

:func:`dynlab.labs.scenario.run_scenario` (the seed lab ``shared/seeds/002``) caches whole documents of
tokens in a GPU tier backed by an inclusive CPU tier. :func:`scenario_on_engine` serves the same reads
on one :class:`~dynlab.engine.worker.EngineWorker` (vLLM's block pool, a CPU tier behind it) and
reports them in the lab's shape, so the two can be compared pass by pass (``tests/engine/test_tiers.py``,
``benchmarks/fidelity_tiers.py``, docs/tiers.md).

The mapping (the two models' units differ):

- Each read of document ``d`` is a request of ``tokens`` prompt tokens and one output token, whose full
  blocks are named ``d * 2**20 + j``; it arrives after the previous read has finished (one request
  at a time, as the lab reads).
- A lab GPU capacity of ``C`` tokens holds ``floor(C / tokens)`` whole documents; the engine's pool gets
  ``floor(C / tokens) * (ceil(tokens / block) + 1)`` blocks: a document's blocks, plus one for the new
  block a hit needs (vLLM recomputes the last prompt token into a fresh block, taken from the free
  queue's head: without the spare, a hit would evict another document's tail).
- A lab CPU capacity of ``C`` tokens becomes ``floor(C / tokens) * (tokens // block)`` blocks (the tier
  holds named, full blocks only).
- A read counts as a hit when all its cacheable blocks (``(tokens - 1) // block``, the last-token cap of
  :meth:`~dynlab.kv.blocks.FullAttentionGroup.hit_cap`)
  hit: on the GPU (``gpu_hits``) or partly from the CPU tier (``cpu_hits``); as a miss when none does;
  otherwise as ``partial`` (a key the lab never has: its entries are whole documents).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from dynlab.engine.worker import EngineRequest, EngineWorker
from dynlab.kv.blocks import FullAttentionGroup
from dynlab.labs.scenario import DEFAULT_DOCS, DEFAULT_PASSES, DEFAULT_TOKENS, pass_docs
from dynlab.latency.base import LatencyModel, StepBatch

__all__ = ["scenario_on_engine", "engine_blocks"]

_DOC_STRIDE = 1 << 20  # block names of document d: d * _DOC_STRIDE + j


class _FixedStep(LatencyModel):
    """Every step takes 10 ms: one read at a time, so durations never change what is cached."""

    name = "fixed-step"

    def step_ms(self, batch: StepBatch) -> float:
        return 10.0


def engine_blocks(gpu: int, cpu: int, tokens: int = DEFAULT_TOKENS, block: int = 16) -> tuple[int, int]:
    """``(GPU pool blocks, CPU tier blocks)`` for lab capacities ``gpu`` and ``cpu`` in tokens (see the module
    docstring). Raises ``ValueError`` when ``tokens`` or ``block`` is < 1 or a capacity is negative."""
    if tokens < 1 or block < 1:
        raise ValueError(f"tokens and block must be >= 1, got {tokens} and {block}")
    if gpu < 0 or cpu < 0:
        raise ValueError(f"capacities must be >= 0 tokens, got gpu={gpu}, cpu={cpu}")
    group = FullAttentionGroup(block)
    return (gpu // tokens) * (group.blocks_needed(tokens) + 1), (cpu // tokens) * (tokens // block)


def _serve_alone(engine: EngineWorker, req: EngineRequest, now: float) -> float:
    """Submit ``req`` at ``now`` (ms) to an idle engine and run it to the end; returns the end (ms)."""
    engine.submit(req, now)
    t = now
    while not engine.idle:
        end = engine.start_step(t)
        if end is None:  # waiting for its CPU hits to load
            t = engine.next_ready
            continue
        engine.finish_step()
        t = end
    return t


def scenario_on_engine(gpu: int, cpu: int = 0, passes: Sequence[str] = DEFAULT_PASSES, docs: int = DEFAULT_DOCS,
                       tokens: int = DEFAULT_TOKENS, block: int = 16, cpu_write: str = "compute",
                       load_ms_per_block: float = 0.005, gpu_blocks: Optional[int] = None) -> dict:
    """Read the lab's documents pass after pass on one engine worker; count hits per pass as the lab does.

    ``gpu`` and ``cpu`` are the lab's capacities in tokens (mapped by :func:`engine_blocks`);
    ``cpu_write`` the CPU tier's write rule (``compute``: write-through, the lab's rule; ``evict``: a
    victim tier); ``gpu_blocks`` (given) the pool's size in blocks instead of the mapping's. Returns ``{"passes": [{"order", "gpu_hits", "cpu_hits", "misses", "hit_docs",
    "partial"}, ...], "gpu_hit_blocks": int, "cpu_hit_blocks": int}``: per pass,
    :func:`~dynlab.labs.scenario.run_scenario`'s keys plus ``partial``; then the blocks every read's
    lookup found on each tier (the run's ``gpu_hit_blocks`` / ``cpu_hit_blocks``).
    Raises ``ValueError`` for a document that cannot fit the pool (``gpu`` < ``tokens``) or a bad order.
    """
    mapped, cpu_blocks = engine_blocks(gpu, cpu, tokens, block)
    gpu_blocks = mapped if gpu_blocks is None else gpu_blocks
    if gpu_blocks == 0:
        raise ValueError(f"a GPU capacity of {gpu} tokens holds no document of {tokens} tokens")
    engine = EngineWorker(0, gpu_blocks, block, _FixedStep(None, {}), cpu_capacity=cpu_blocks,
                          load_ms_per_block=load_ms_per_block, cpu_write=cpu_write)
    cacheable = FullAttentionGroup(block).hit_cap(tokens)  # (never above tokens // block, the named blocks)
    t, out, tiers = 0.0, [], {"gpu_hit_blocks": 0, "cpu_hit_blocks": 0}
    for order in passes:
        counts = {"order": order, "gpu_hits": 0, "cpu_hits": 0, "misses": 0, "hit_docs": [], "partial": 0}
        for d in pass_docs(order, docs):
            req = EngineRequest(d, t, tokens, 1, [d * _DOC_STRIDE + j for j in range(tokens // block)])
            t = _serve_alone(engine, req, t) + 1.0
            cpu_hit = req.cpu_hit_blocks or 0
            hit = min(req.hit_tokens // block, cacheable)
            tiers["gpu_hit_blocks"] += req.hit_tokens // block - cpu_hit
            tiers["cpu_hit_blocks"] += cpu_hit
            if hit == cacheable and cacheable:
                counts["cpu_hits" if cpu_hit else "gpu_hits"] += 1
                counts["hit_docs"].append(d)
            elif hit == 0:
                counts["misses"] += 1
            else:
                counts["partial"] += 1
        out.append(counts)
    return {"passes": out, **tiers}
