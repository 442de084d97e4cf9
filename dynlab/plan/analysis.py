"""What the latency model says of a trace before any replay: each prompt's own prefill, the work against
one worker's capacity (the bracket's lower end), and the share of requests no worker count can serve in time.

Every figure here is a *floor*: a request served alone on an idle worker, with an infinite prefix cache
(every leading block some earlier request named is a hit). A request whose floor misses the TTFT target
misses it at any number of workers.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from dynlab.engine.config import SimConfig
from dynlab.latency.base import LatencyModel, StepBatch


def prefill_alone_ms(latency: LatencyModel, input_length: int, hit_tokens: int, chunk: int) -> float:
    """ms to prefill one prompt of ``input_length`` tokens alone, its first ``hit_tokens`` cached, in
    chunks of at most ``chunk`` tokens (the step budget, ``--max-num-batched-tokens``): the sum of
    ``latency.step_ms`` over its chunk steps. The step that computes the last prompt token emits the
    first output token, so this is the request's TTFT on an idle worker."""
    total, ctx = 0.0, min(hit_tokens, max(input_length - 1, 0))
    while ctx < input_length:
        c = min(chunk, input_length - ctx)
        total += latency.step_ms(StepBatch((c,), (ctx,), 0, 0))
        ctx += c
    return total


def ideal_hit_tokens(requests: Sequence, trace_block: int, block: int) -> list[int]:
    """Per request, the prompt tokens an infinite prefix cache could hit: its leading trace blocks named
    by an earlier request, in whole engine blocks of ``block`` tokens, at most ``input_length - 1``
    (vLLM recomputes the last prompt token)."""
    seen: set = set()
    out = []
    for req in requests:
        k = 0
        for h in req.hashes:
            if h not in seen:
                break
            k += 1
        tokens = min(k * trace_block, max(req.input_length - 1, 0))
        out.append(tokens // block * block)
        seen.update(req.hashes)
    return out


def tpot_alone_ms(latency: LatencyModel, input_length: int, output_length: int) -> Optional[float]:
    """A request's TPOT decoding alone: one decode step at its mean context (``input + output / 2``
    tokens); ``None`` for a one-token request (no TPOT)."""
    if output_length <= 1:
        return None
    return latency.step_ms(StepBatch((), (), 1, input_length + output_length // 2))


@dataclass(frozen=True)
class Floors:
    """Per-request floors of one shape (ms): ``ttft`` (prefill alone, ideal prefix hits) and ``tpot``
    (``None`` for one-token requests)."""

    ttft: tuple
    tpot: tuple

    def never_share(self, slo_ttft_ms: Optional[float], slo_tpot_ms: Optional[float]) -> float:
        """Share of requests (0..1) whose floor misses an SLO given: none can meet it at any worker count."""
        if not self.ttft:
            return 0.0
        miss = sum(1 for t, p in zip(self.ttft, self.tpot)
                   if (slo_ttft_ms is not None and t > slo_ttft_ms)
                   or (slo_tpot_ms is not None and p is not None and p > slo_tpot_ms))
        return miss / len(self.ttft)

    def ttft_quantile(self, q: float) -> float:
        """The ``q`` (0..1) quantile of the TTFT floors (nearest rank): the lowest TTFT target a
        ``q`` percentile can meet on this shape."""
        return _quantile(self.ttft, q) or 0.0

    def per_slo(self, slo: str, target_ms: Optional[float], q: float) -> Optional[dict]:
        """One SLO's floor, ``slo`` ``"ttft"`` or ``"tpot"``: ``never_share``, the share of all requests (0..1)
        whose floor alone misses ``target_ms`` (``None`` without that SLO); ``lowest_ms``, the ``q`` quantile
        of the floors (nearest rank over the requests that have one: the lowest target of that SLO alone a
        ``q`` percentile can meet here); ``worst_ms``, the longest floor. ``None`` when no request has a
        floor of it (a TPOT with speculative decoding, or one-token requests only)."""
        values = [v for v in (self.ttft if slo == "ttft" else self.tpot) if v is not None]
        if not values:
            return None
        miss = None if target_ms is None else sum(1 for v in values if v > target_ms) / len(self.ttft)
        return {"never_share": None if miss is None else round(miss, 6), "lowest_ms": round(_quantile(values, q), 3),
                "worst_ms": round(max(values), 3)}


def _quantile(values: Sequence[float], q: float) -> Optional[float]:
    """The ``q`` (0..1) quantile of ``values`` by nearest rank; ``None`` for no value."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] if ordered else None


def client_ms(config: SimConfig) -> float:
    """ms a request's first token spends outside the engine: the server's front end
    (``config.request_overhead_ms``) and its detokenisation (``config.detok_us_per_token``)."""
    return config.request_overhead_ms + config.detok_ms


def prefill_chunk(config: SimConfig, latency: LatencyModel) -> int:
    """Tokens of a prompt one step prefills at most: vLLM's step budget (``--max-num-batched-tokens``), or
    with ``--engine sglang`` its chunk (``--chunked-prefill-size``, by default by the GPU's memory as SGLang
    sets it: :func:`dynlab.engine.sglang.defaults.chunked_prefill_default`; ``-1``: no chunking, the whole
    prompt in one pass)."""
    if config.engine_kind != "sglang":
        return config.max_num_batched_tokens
    from dynlab.engine.sglang.defaults import chunked_prefill_default

    chunk = config.chunked_prefill_size
    if chunk is None:
        chunk = chunked_prefill_default(latency.hardware.gpu.memory_gb)
    return sys.maxsize if chunk == -1 else chunk


def floors(requests: Sequence, latency: LatencyModel, config: SimConfig, trace_block: int) -> Floors:
    """The :class:`Floors` of ``requests`` on ``latency`` (one worker of the shape), chunked at
    :func:`prefill_chunk`, each TTFT with what its first token spends outside the engine (:func:`client_ms`), each TPOT with
    the detokenisation per token. Distinct (length, hit) pairs are computed once. With speculative
    decoding (``config.spec_tokens`` > 0) a step may emit several tokens, so no TPOT floor is set (all
    ``None``): only the TTFT floors can make such a shape compute-bound."""
    hits = ideal_hit_tokens(requests, trace_block, config.block)
    cache: dict = {}
    ttft = []
    for req, hit in zip(requests, hits):
        key = (req.input_length, hit)
        if key not in cache:
            cache[key] = prefill_alone_ms(latency, req.input_length, hit, prefill_chunk(config, latency))
        ttft.append(cache[key] + client_ms(config))
    if config.spec_tokens:  # several tokens per step: one plain decode step is no floor of the TPOT
        tpot = tuple(None for _ in requests)
    else:
        token = config.detok_ms
        alone = (tpot_alone_ms(latency, r.input_length, max(r.output_length, 1)) for r in requests)
        tpot = tuple(None if t is None else t + token for t in alone)  # None: a one-token request has no TPOT
    return Floors(tuple(ttft), tpot)


def span_ms(requests: Sequence, config: SimConfig) -> float:
    """The arrivals' span in ms as the engine will see them: ``(last - first timestamp) * time_scale``,
    or ``n / rate`` seconds for a workload without timestamps (Poisson arrivals)."""
    if not requests:
        return 0.0
    if requests[0].timestamp is None:
        return len(requests) / config.rate * 1000.0
    return (float(requests[-1].timestamp) - float(requests[0].timestamp)) * config.time_scale


def _decode_ms_per_token(requests: Sequence, latency: LatencyModel, config: SimConfig) -> float:
    """ms of one output token in a full decode batch (``max_num_seqs`` requests at the mean context)."""
    seqs = config.max_num_seqs
    mean_ctx = sum(r.input_length + r.output_length / 2 for r in requests) / len(requests)
    return latency.step_ms(StepBatch((), (), seqs, int(seqs * mean_ctx))) / seqs


def work_ms(requests: Sequence, latency: LatencyModel, config: SimConfig, fl: Floors) -> tuple[float, float]:
    """The trace's work in ms of one worker, ``(prefill, decode)``: every prompt's prefill floor (``fl.ttft`` less :func:`client_ms`)
    and every output token past the first at the cost of one token in a full decode batch (``max_num_seqs``
    requests at the trace's mean context). ``(0.0, 0.0)`` for an empty trace. Computed once per shape,
    read by :func:`workers_lower_bound` and :func:`prefill_share`."""
    if not requests:
        return 0.0, 0.0
    decode = _decode_ms_per_token(requests, latency, config) * sum(max(r.output_length, 1) - 1 for r in requests)
    return sum(fl.ttft) - client_ms(config) * len(fl.ttft), decode  # the front end is no GPU work


def prefill_share(work: tuple[float, float]) -> float:
    """The prefill's share (0..1) of the trace's ``work`` (:func:`work_ms`: the prompts' TTFT floors against
    the output tokens in full decode batches): where a P/D shape's split search starts (prefill workers =
    share x total). 0.5 for no work (an empty trace)."""
    prefill, decode = work
    return prefill / (prefill + decode) if prefill + decode > 0 else 0.5


def workers_lower_bound(requests: Sequence, config: SimConfig, work: tuple[float, float]) -> int:
    """The bracket's lower end: ``ceil(work / span)``, at least 1, where work (ms of one worker) is the sum
    of :func:`work_ms`'s ``work`` and span the arrivals' (:func:`span_ms`); a fleet of fewer workers would
    have to be busy more than all of the time. Not a guarantee (batching prefill chunks with decodes can
    beat the sum), so the search replays it."""
    if not requests:
        return 1
    prefill, decode = work
    span = span_ms(requests, config)
    return max(1, math.ceil((prefill + decode) / span)) if span > 0 else 1


def help_shares(requests: Sequence, config: SimConfig, trace_block: int, slo_ttft_ms: Optional[float],
                slo_tpot_ms: Optional[float], latency_for) -> dict:
    """What would lower the share that can never meet the SLOs: ``{"tp X": share, "chunk Y": share}`` at
    twice the TP (when the model's heads split) and twice the step budget (SGLang's chunk: :func:`prefill_chunk`). ``latency_for(config)``
    builds a shape's latency model (``ValueError`` when the hardware refuses it: left out)."""
    out = {}
    ep = config.ep * 2 if config.ep > 1 else 1  # expert parallelism over the worker's TP GPUs: doubled with them
    if config.engine_kind == "sglang":  # SGLang's chunk (none to double when chunking is off)
        chunk = prefill_chunk(config, latency_for(config))
        bigger = [(f"chunked-prefill-size {chunk * 2}", replace(config, chunked_prefill_size=chunk * 2))] \
            if chunk != sys.maxsize else []
    else:
        bigger = [(f"max-num-batched-tokens {config.max_num_batched_tokens * 2}",
                   replace(config, max_num_batched_tokens=config.max_num_batched_tokens * 2))]
    for label, changed in [(f"tp {config.tp * 2}" + (f" ep {ep}" if ep > 1 else ""),
                            replace(config, tp=config.tp * 2, ep=ep)), *bigger]:
        try:
            lat = latency_for(changed)
        except ValueError:
            continue
        out[label] = floors(requests, lat, changed, trace_block).never_share(slo_ttft_ms, slo_tpot_ms)
    return out
