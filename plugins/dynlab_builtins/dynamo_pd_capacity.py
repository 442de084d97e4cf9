"""A P/D fleet's per-worker capacities for ``dynamo-throughput`` (docs/autoscaling.md, "dynamo-throughput on a P/D
fleet"), read off the run's step-latency model (:class:`~dynlab.latency.base.LatencyModel`, the calibrated one with
``--latency-profile``) instead of a pre-deployment profile.

- Prefill (:func:`prefill_tokens_per_ms`): Dynamo's profiler times one prompt of ISL tokens on an idle prefill engine
  and divides ISL by that TTFT (``PrefillInterpolator.interpolate_thpt_per_gpu`` of
  ``components/src/dynamo/planner/utils/perf_interpolation.py`` interpolates that figure at the predicted ISL). Here
  the prompt is prefilled in chunks of the step's token budget (``max_batched_tokens``), each chunk one
  :meth:`step_ms` with the earlier chunks as its context; capacity = ISL / their summed ms (tokens per ms).
- Decode (:func:`decode_tokens_per_ms`): ``DecodeInterpolator.find_best_throughput_per_gpu`` (same file) takes the
  decode context ``ISL + OSL / 2`` and the highest KV load whose ITL is within the target, and returns the
  throughput there. Here: the most concurrent requests ``B`` (at most ``max_num_seqs``, ``B x context`` at most the
  worker's KV pool) whose decode-only step ``step_ms(B requests, B x context tokens)`` is within ``itl`` ms
  (bisection: step_ms is non-decreasing in every field, the LatencyModel contract); capacity = ``B / step ms``
  (tokens per ms). When even one request misses the target, ``B = 1`` (Dynamo returns the lowest KV load's figure).

Both are per worker (a dynlab worker is one engine of ``--tp`` GPUs: Dynamo's per-GPU figure times the engine's GPUs).
"""
from __future__ import annotations

from dynlab.latency.base import StepBatch


def prefill_ms(latency, isl: int, chunk: int) -> float:
    """ms to prefill one prompt of ``isl`` tokens alone, in chunks of ``chunk`` tokens (each chunk one step whose
    context is the tokens already prefilled)."""
    total, done = 0.0, 0
    while done < isl:
        n = min(chunk, isl - done)
        total += latency.step_ms(StepBatch((n,), (done,)))
        done += n
    return total


def prefill_tokens_per_ms(latency, isl: int, chunk: int) -> float:
    """Prompt tokens per ms one prefill worker computes at a prompt length of ``isl`` tokens (module docstring)."""
    isl = max(int(isl), 1)
    return isl / prefill_ms(latency, isl, max(int(chunk), 1))


def decode_batch(latency, context: int, itl: float, max_seqs: int, kv_tokens: int) -> tuple:
    """``(B, step ms)``: the most concurrent decoding requests of ``context`` tokens each whose step is within ``itl``
    ms, at most ``max_seqs`` and ``kv_tokens // context``; ``B = 1`` when none is (module docstring)."""
    context = max(int(context), 1)
    step = lambda b: latency.step_ms(StepBatch((), (), b, b * context))  # noqa: E731
    hi = max(min(int(max_seqs), int(kv_tokens) // context), 1)
    if step(1) > itl:
        return 1, step(1)
    lo = 1  # step(lo) <= itl; find the largest such lo <= hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if step(mid) <= itl else (lo, mid - 1)
    return lo, step(lo)


def decode_tokens_per_ms(latency, isl: float, osl: float, itl: float, max_seqs: int, kv_tokens: int) -> float:
    """Output tokens per ms one decode worker generates within ``itl`` ms per token at ``isl`` prompt and ``osl``
    output tokens (context ``isl + osl / 2``, module docstring)."""
    b, ms = decode_batch(latency, round(isl + osl / 2.0), itl, max_seqs, kv_tokens)
    return b / ms
