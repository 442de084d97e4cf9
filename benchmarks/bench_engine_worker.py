"""Throughput of one ``EngineWorker`` on the bundled Mooncake trace (not run by CI).

Feeds every ``--stride``-th request (default 8: one worker's share of an 8-worker fleet) of the
bundled Mooncake conversation trace to one worker, with a minimal event loop (finish the step
ending, submit arrivals, start the next step), once with bulk decode and once step by step, and
prints steps/s, requests/s and wall time for each (engine-block naming is timed separately), plus
a few results so the two runs can be compared. The two runs agree up to float rounding of step
boundaries: with non-dyadic step times, a request arriving within ~1e-7 ms of a step boundary
may join a different step in the two runs (on the default settings, 3 of 1,504 requests do).

The latency model is linear (``beta0 + beta1 * prefill tokens + beta2 * decodes``, ms), with
defaults fitted by eye to DESIGN.md's Qwen3-8B/H100 figures; the pool defaults to 25,000 blocks
of 16 tokens (~400k tokens of KV: an 8B model's KV on one 80 GB GPU).

    python benchmarks/bench_engine_worker.py [--stride 8] [--capacity 25000] [--block 16]
        [--budget 8192] [--max-seqs 256] [--no-step]
"""
from __future__ import annotations

import argparse
import math
import platform
import time

from dynlab.engine.names import engine_block_names
from dynlab.engine.worker import EngineRequest, EngineWorker
from dynlab.latency.base import LatencyModel, StepBatch
from dynlab.traces import load_trace


class Linear(LatencyModel):
    """step_ms = beta0 + beta1 * sum(prefill_tokens) + beta2 * decode_requests."""

    name = "bench-linear"

    def __init__(self, beta0, beta1, beta2):
        super().__init__(None, {})
        self.b0, self.b1, self.b2 = beta0, beta1, beta2

    def step_ms(self, batch: StepBatch) -> float:
        return self.b0 + self.b1 * sum(batch.prefill_tokens) + self.b2 * batch.decode_requests

    def decode_ms(self, requests, context, steps):
        return steps * (self.b0 + self.b2 * requests)


def drive(worker: EngineWorker, requests: list) -> int:
    """Run ``requests`` (arrival order) through ``worker``; returns the number of start_step calls."""
    i, n, calls = 0, len(requests), 0
    inf = math.inf
    while True:
        end = worker.step_end
        arrival = requests[i].arrival_ms if i < n else inf
        if end is None and arrival == inf:
            return calls
        if end is not None and end <= arrival:
            now = end
            worker.finish_step()
        else:
            now = arrival
            worker.submit(requests[i], now)
            i += 1
        nxt = worker.step_end
        if (nxt is not None and nxt <= now) or (i < n and requests[i].arrival_ms == now):
            continue
        if nxt is None and not worker.idle:
            worker.start_step(now)
            calls += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stride", type=int, default=8)
    ap.add_argument("--capacity", type=int, default=25_000, help="KV blocks in the pool")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--budget", type=int, default=8192, help="max_num_batched_tokens")
    ap.add_argument("--max-seqs", type=int, default=256)
    ap.add_argument("--betas", type=float, nargs=3, default=(8.0, 0.02, 0.08), metavar=("B0", "B1", "B2"))
    ap.add_argument("--no-step", action="store_true", help="skip the step-by-step run")
    args = ap.parse_args()

    trace = load_trace("mooncake-conversation")
    chosen = trace[::args.stride]
    t0 = time.perf_counter()
    specs = [(float(r.timestamp), r.input_length, max(1, r.output_length),
              engine_block_names(r.hashes, r.input_length, trace.block_tokens, args.block)) for r in chosen]
    t_names = time.perf_counter() - t0
    blocks = sum(len(s[3]) for s in specs)
    print(f"python {platform.python_version()} on {platform.machine()}; {len(specs)} requests "
          f"(every {args.stride}th), {blocks:,} engine blocks of {args.block} tokens; naming took {t_names:.2f} s")
    print(f"pool {args.capacity} blocks, budget {args.budget} tokens, max_num_seqs {args.max_seqs}, "
          f"latency betas {tuple(args.betas)}")
    modes = [True] if args.no_step else [True, False]
    outcome = {}
    for bulk in modes:
        w = EngineWorker(0, args.capacity, args.block, Linear(*args.betas), max_num_batched_tokens=args.budget,
                         max_num_seqs=args.max_seqs, bulk=bulk)
        reqs = [EngineRequest(i, a, inp, out, names) for i, (a, inp, out, names) in enumerate(specs)]
        t0 = time.perf_counter()
        calls = drive(w, reqs)
        wall = time.perf_counter() - t0
        done = [r for r in reqs if r.finish_ms is not None]
        ttft = sorted(r.first_token_ms - r.arrival_ms for r in done)
        hit = sum(r.hit_tokens for r in done) / max(1, sum(r.input_length for r in done))
        label = "bulk" if bulk else "step"
        print(f"{label}: {wall:6.2f} s wall, {w.steps:,} engine steps in {calls:,} start_step calls: "
              f"{w.steps / wall:,.0f} steps/s, {len(reqs) / wall:,.0f} requests/s")
        print(f"      finished {len(done)}, rejected {w.rejected}, preemptions {w.preemptions}, "
              f"prefix hit rate {hit:.4f}, TTFT p50 {ttft[len(ttft) // 2]:.1f} ms p99 {ttft[int(len(ttft) * .99)]:.1f} ms, "
              f"peak used {w.peak_used_blocks} blocks, mean used {w.used_block_ms() / max(r.finish_ms for r in done):.0f}")
        outcome[label] = [(r.first_token_ms, r.finish_ms) for r in reqs]
    if len(outcome) == 2:
        worst = max((abs(a - b) / max(1.0, abs(b)) for x, y in zip(outcome["bulk"], outcome["step"])
                     for a, b in zip(x, y) if a is not None), default=0.0)
        print(f"bulk vs step: worst relative difference of first-token/finish times {worst:.2e}")


if __name__ == "__main__":
    main()
