"""Fidelity of the timed engine's steady state against aiconfigurator's aggregated-serving estimate (run_agg).

    pip install -e ".[aiconfigurator]"   # Python 3.11+
    python benchmarks/fidelity_engine.py [--concurrency 8,32,128] [--budget 4000,8192]

One worker (qwen3-8b on 1 x h200, vLLM, by default) serves a **closed loop**: each of
``concurrency`` users sends a request (ISL prompt tokens of fresh random token ids, so no prefix is
ever shared, and OSL output tokens) and sends its next one the moment the previous finishes. The
engine API (``dynlab.engine.run``) takes open-loop arrivals, so this drives
:class:`dynlab.engine.worker.EngineWorker` directly with a small event loop following its driving
rules. Identical requests started together would stay in lockstep forever, so the users' first
requests are spread evenly over one request period (the mean E2E of a short pilot run started all
at once); after that every request is sent at a step end. Each user sends ``--rounds`` requests; the first
``--warmup`` rounds (the synchronised start) and the last two (the drain, when fewer users remain)
are left out of the statistics. TTFT = first token - arrival; TPOT = (finish - first token) /
(OSL - 1), as in ``dynlab.engine.metrics``.

The reference is aiconfigurator-core's ``backend.run_agg`` (a mean-field continuous-batching
model, not a simulation) at ``batch_size = concurrency`` and ``ctx_tokens`` = the per-step token
budget; dynlab runs with ``max_num_batched_tokens`` = the same budget and ``--latency-model
aiconfigurator`` (the same step times, so only scheduling differs) and ``roofline``. The table
gives mean and p50 of dynlab's TTFT and TPOT and the gap of the mean to aiconfigurator's figure.
aiconfigurator's vLLM TTFT is ``(prefill step(s) + 0.8 ms x layers) x (1 + log2(concurrency)/8)``,
two corrections calibrated to measured serving runs; "aic prefill part" removes both (reading
them from aiconfigurator) to show how much of the TTFT gap they are.
"""
from __future__ import annotations

import argparse
import logging
import math
import platform
import statistics
import time

from dynlab.engine.worker import EngineRequest, EngineWorker
from dynlab.latency.grid import build_latency_model, hardware_for
from dynlab.latency.overheads import SERVER_TERMS_OFF
from dynlab.latency.hardware import kv_blocks

BLOCK = 16


def closed_loop(latency, capacity: int, concurrency: int, isl: int, osl: int, budget: int, rounds: int,
                warmup: int, stagger_ms: float = 0.0) -> dict:
    """Run the closed loop on one worker; TTFT/TPOT (ms) of the measured rounds, and the run's shape.

    User ``u`` sends its first request at ``u * stagger_ms``, then one whenever its previous one finishes.
    """
    worker = EngineWorker(0, capacity, BLOCK, latency, max_num_batched_tokens=budget,
                          max_num_seqs=max(256, concurrency))
    next_name = 0
    sent = [0] * concurrency
    measured = []

    def send(user: int, now: float) -> None:
        nonlocal next_name
        blocks = isl // BLOCK
        req = EngineRequest((user, sent[user]), now, isl, osl, range(next_name, next_name + blocks))
        next_name += blocks  # fresh names: random token ids share no prefix
        sent[user] += 1
        if not worker.submit(req, now):
            raise SystemExit(f"a request of {isl}+{osl} tokens does not fit {capacity} blocks")

    pending = [(user * stagger_ms, user) for user in range(concurrency)]  # first requests, in time order
    end = None
    now = 0.0
    while True:
        end = worker.step_end
        if end is None and not pending:
            break
        if end is not None and (not pending or end <= pending[0][0]):
            now = end
            result = worker.finish_step()
            for req, _ in result.finished:
                user, k = req.id
                if warmup <= k < rounds - 2:
                    measured.append(req)
                if sent[user] < rounds:
                    send(user, now)
        else:
            now, user = pending.pop(0)
            send(user, now)  # may cut a bulk decode run short: step_end is re-read above
        while pending and pending[0][0] == now:
            send(pending.pop(0)[1], now)
        if worker.step_end is None and not worker.idle:
            worker.start_step(now)
    ttft = [r.first_token_ms - r.arrival_ms for r in measured]
    tpot = [(r.finish_ms - r.first_token_ms) / (osl - 1) for r in measured]
    return {"ttft_mean": statistics.fmean(ttft), "ttft_p50": statistics.median(ttft),
            "tpot_mean": statistics.fmean(tpot), "tpot_p50": statistics.median(tpot),
            "e2e_mean": statistics.fmean(r.finish_ms - r.arrival_ms for r in measured),
            "requests": len(measured), "preemptions": worker.preemptions, "steps": worker.steps, "sim_ms": now}


def aiconfigurator_agg(model: str, gpu: str, concurrency: int, isl: int, osl: int, budget: int) -> dict:
    """aiconfigurator-core's run_agg for the vLLM backend: ``{"ttft", "tpot"}`` in ms."""
    from dynlab_builtins.latency_aic import HF_IDS, SYSTEMS, _quiet

    with _quiet():
        from aiconfigurator_core.sdk import config
        from aiconfigurator_core.sdk.backends.factory import get_backend
        from aiconfigurator_core.sdk.models import get_model
        from aiconfigurator_core.sdk.perf_database import get_database

        version = "0.14.0" if gpu == "a100-80gb" else "0.24.0"
        db = get_database(SYSTEMS[gpu], "vllm", version)
        backend = get_backend("vllm")
        aic_model = get_model(HF_IDS[model], config.ModelConfig(tp_size=1), "vllm")
        runtime = config.RuntimeConfig(batch_size=concurrency, isl=isl, osl=osl, prefix=0)
        row = backend.run_agg(aic_model, db, runtime, ctx_tokens=budget).get_summary_df().iloc[0]
        # run_agg's TTFT = (prefill steps + dispatch overhead) x queuing factor (vllm_backend.py): both
        # corrections are read from aiconfigurator itself (private methods) to split the figure
        steps_to_finish_ctx = math.ceil(isl * concurrency / budget)
        factor = float(backend._ttft_queuing_factor(concurrency, steps_to_finish_ctx))
        dispatch = float(backend._prefill_dispatch_overhead_ms(aic_model))
    ttft = float(row["ttft"])
    return {"ttft": ttft, "tpot": float(row["tpot"]), "factor": factor, "dispatch": dispatch,
            "prefill": ttft / factor - dispatch}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--isl", type=int, default=4000)
    parser.add_argument("--osl", type=int, default=500)
    parser.add_argument("--concurrency", default="8,32,128")
    parser.add_argument("--budget", default="8192,4000",
                        help="per-step token budgets: dynlab's max_num_batched_tokens and aiconfigurator's ctx_tokens")
    parser.add_argument("--latency-models", default="aiconfigurator,roofline")
    parser.add_argument("--rounds", type=int, default=12, help="requests per user")
    parser.add_argument("--warmup", type=int, default=3, help="leading rounds left out")
    args = parser.parse_args(argv)
    logging.getLogger("aiconfigurator_core").setLevel(logging.CRITICAL + 1)
    start = time.perf_counter()
    hardware = hardware_for(args.model, args.gpu, 1)
    capacity, _ = kv_blocks(hardware.model, hardware.gpu, BLOCK, 1)
    # the GPU step models alone: aiconfigurator's estimate has no server CPU term (docs/latency.md)
    models = {n: build_latency_model(n, hardware, SERVER_TERMS_OFF.get(n)) for n in args.latency_models.split(",")}
    header = ["budget", "conc", "latency model", "TTFT mean", "TTFT p50", "aic TTFT", "TTFT gap",
              "aic prefill part", "gap to it",
              "TPOT mean", "TPOT p50", "aic TPOT", "TPOT gap", "reqs", "preempt"]
    rows = []
    for budget in (int(b) for b in args.budget.split(",")):
        for conc in (int(c) for c in args.concurrency.split(",")):
            ref = aiconfigurator_agg(args.model, args.gpu, conc, args.isl, args.osl, budget)
            for name, latency in models.items():
                # a pilot run with every user starting at 0 gives the request period; the measured run
                # spreads the users' first requests evenly over it, so they do not move in lockstep
                pilot = closed_loop(latency, capacity, conc, args.isl, args.osl, budget, 4, 1)
                r = closed_loop(latency, capacity, conc, args.isl, args.osl, budget, args.rounds, args.warmup,
                                stagger_ms=pilot["e2e_mean"] / conc)
                rows.append([str(budget), str(conc), name, f"{r['ttft_mean']:.1f}", f"{r['ttft_p50']:.1f}",
                             f"{ref['ttft']:.1f}", f"{100 * (r['ttft_mean'] / ref['ttft'] - 1):+.1f}%",
                             f"{ref['prefill']:.1f}", f"{100 * (r['ttft_mean'] / ref['prefill'] - 1):+.1f}%",
                             f"{r['tpot_mean']:.2f}", f"{r['tpot_p50']:.2f}", f"{ref['tpot']:.2f}",
                             f"{100 * (r['tpot_mean'] / ref['tpot'] - 1):+.1f}%", str(r["requests"]),
                             str(r["preemptions"])])
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
    from importlib.metadata import version

    ref = aiconfigurator_agg(args.model, args.gpu, 8, args.isl, args.osl, 4000)
    print(f"\naic prefill part = aic TTFT / (1 + log2(conc)/8) - {ref['dispatch']:.1f} ms: aiconfigurator's vLLM "
          "TTFT without its queuing factor and per-request dispatch overhead (0.8 ms x layers), i.e. the prefill "
          "step(s) alone.")

    print(f"\n{args.model} on 1 x {args.gpu}, ISL {args.isl}, OSL {args.osl}, {capacity} blocks of {BLOCK}; "
          f"times in ms; gap = dynlab mean / aiconfigurator - 1. aiconfigurator-core "
          f"{version('aiconfigurator-core')} run_agg (vLLM). {platform.machine()} {platform.system()}, "
          f"Python {platform.python_version()}; {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
