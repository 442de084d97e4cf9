"""Speed of the timed serving engine (``--timing``) on the bundled Mooncake trace (not run by CI).

Replays the bundled ``mooncake-conversation`` trace (12,031 requests) through the timed fleet
with ``--timing`` defaults (roofline latency, llama-3.1-8b on h100, the hardware-derived pool,
engine blocks of 16 tokens, trace blocks of 512) routed by ``--mode`` (default ``kv-cost``), for
each configuration of ``--configs`` (default: 8 workers with and without bulk decode, 128
workers with bulk decode; ``8:async`` runs ``--async-scheduling`` with its bulk decode runs,
``8:async-step`` the same one step at a time). The
trace is loaded once, outside the timed part. Prints, per
configuration: CPU seconds (``time.process_time``: this process only, so a loaded machine
inflates it less than wall time) and wall seconds of the replay, simulated requests per CPU
second, engine steps (iterations) per CPU second, ``start_step`` calls (a bulk decode run is
one call), and CPU microseconds per request (flat in workers when the cost grows with the
work, not the fleet). Best (lowest CPU) of ``--repeat`` runs; one core.

    python benchmarks/bench_engine.py [--mode kv-cost] [--repeat 1] [--configs 8:bulk,8:step,128:bulk]
"""
from __future__ import annotations

import argparse
import platform
import random
import time

from dynlab.engine.async_steps import AsyncEngineWorker
from dynlab.engine.config import SimConfig
from dynlab.engine.run import build_strategy
from dynlab.engine.serving import build_engines
from dynlab.engine.worker import EngineWorker
from dynlab.sim.topology import serve, topology_for
from dynlab.traces.reader import load_trace

TRACE = "mooncake-conversation"


def replay_once(requests, workers: int, bulk: bool, mode: str,
                async_scheduling: bool = False) -> tuple[float, float, int, dict]:
    """``(cpu s, wall s, start_step calls, run JSON)`` of one timed replay, as ``dynlab sim`` seeds it
    (``async_scheduling``: ``--async-scheduling``; ``bulk``: with its bulk decode runs)."""
    config = SimConfig(mode=mode, workers=workers, trace=TRACE, timing=True, async_scheduling=async_scheduling)
    config.validate()
    setup = build_engines(config, requests.own_block_tokens, bulk=bulk)
    rng = random.Random(config.seed)
    strategy = build_strategy(config, rng, block_tokens=config.block)
    calls = [0]
    cls = AsyncEngineWorker if async_scheduling else EngineWorker
    start_step = cls.start_step

    def counting(self, now):
        calls[0] += 1
        return start_step(self, now)

    cls.start_step = counting
    try:
        c0, w0 = time.process_time(), time.perf_counter()
        out = serve(topology_for(setup), requests, strategy, config,
                    loss_rng=random.Random(f"dynlab-event-loss-{config.seed}"))
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    finally:
        cls.start_step = start_step
    return cpu, wall, calls[0], out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="kv-cost")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--configs", default="8:bulk,8:step,128:bulk",
                    help="comma-separated WORKERS:bulk|step|async|async-step (async: --async-scheduling, "
                         "async-step: one step at a time; default: %(default)s)")
    args = ap.parse_args()
    requests = load_trace(TRACE, block=16)
    print(f"# {TRACE}: {len(requests):,} requests, mode {args.mode}, --timing defaults; "
          f"Python {platform.python_version()}, best of {args.repeat}")
    print("| workers | decode | CPU s | wall s | requests/s (CPU) | engine steps | steps/s (CPU) "
          "| start_step calls | CPU us/request |")
    print("|---:|:---|---:|---:|---:|---:|---:|---:|---:|")
    for spec in args.configs.split(","):
        w, kind = spec.split(":")
        best = None
        for _ in range(args.repeat):
            res = replay_once(requests, int(w), kind in ("bulk", "async"), args.mode, kind.startswith("async"))
            if best is None or res[0] < best[0]:
                best = res
        cpu, wall, calls, out = best
        n, steps = out["requests"], out["engine_steps"]
        print(f"| {w} | {kind} | {cpu:.2f} | {wall:.2f} | {n / cpu:,.0f} | {steps:,} | {steps / cpu:,.0f} "
              f"| {calls:,} | {cpu / n * 1e6:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
