"""Fidelity of dynlab's disaggregated (P/D) fleet against two independent references.

1. **Best split at a fixed GPU count.** A ``dynlab sweep --grid split=...`` on a steady synthetic workload
   (every request ISL prompt tokens and OSL output tokens, one every 1/RATE s, no shared prefixes), next to
   NVIDIA aiconfigurator's own disaggregated estimate (``DisaggInferenceSession.run_disagg``, PyPI
   ``aiconfigurator``) for the same model, GPU and SLOs: aiconfigurator's best ``P x D`` (and decode batch)
   by tokens/s/GPU under the SLOs, and its aggregated estimate (``InferenceSession.run_agg``). dynlab uses
   aiconfigurator-core's step estimator (``--latency-model aiconfigurator``) when it is installed, so both
   sides price a step alike; the difference is queueing, batching and the transfer, which dynlab replays
   and aiconfigurator estimates statically (no queueing; its TTFT is one prefill).
2. **Direction: disaggregation's TTFT cost grows with prompt length at fixed link speed.** The seed lab's
   sample file (``dynlab/data/fixtures/disagg.jsonl``: agg vs disagg TTFT p50 at 1,500/3,000/6,000
   prompt tokens, one request at a time) next to dynlab's cost of the same runs: the time until the decode
   worker holds the KV (first token on the prefill worker + decode wait + transfer) minus the aggregated
   TTFT, at the link speed the lab's 1,500-token cell implies (``effective_gbps``).

Not run by CI. Needs ``pip install aiconfigurator`` for part 1 (skipped without it). Run:
``python benchmarks/fidelity_disagg.py [--requests 300]``; prints Markdown tables.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict

MODEL, GPU, HF_ID, SYSTEM = "qwen3-8b", "h200", "Qwen/Qwen3-8B", "h200_sxm"
ISL, OSL, RATE = 4000, 500, 38.0  # tokens, tokens, requests/s: between aiconfigurator's agg and 4:4 capacities
SLO_TTFT_MS, SLO_TPOT_MS = 1000.0, 25.0
GPUS = 8
SPLITS = [f"{p}:{GPUS - p}" for p in range(GPUS, 0, -1)]  # 8:0 (aggregated) ... 1:7


def have_aiconfigurator() -> bool:
    try:
        import aiconfigurator.sdk.inference_session  # noqa: F401
        return True
    except ImportError:
        return False


def steady_trace(path: str, n: int) -> None:
    """A Mooncake-format trace: n requests of ISL/OSL tokens, 1/RATE s apart, no shared block."""
    blocks = -(-ISL // 512)
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"timestamp": round(i * 1000.0 / RATE, 3), "input_length": ISL, "output_length": OSL,
                                 "hash_ids": [i * blocks + j for j in range(blocks)]}) + "\n")


def dynlab_split_sweep(n: int, latency_model: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "steady.jsonl")
        steady_trace(trace, n)
        cmd = [sys.executable, "-m", "dynlab", "sweep", "--quiet", "--executor", "local", "--trace", trace, "--timing",
               "--mode", "least-loaded", "--model", MODEL, "--gpu", GPU, "--latency-model", latency_model,
               "--slo-ttft-ms", str(SLO_TTFT_MS), "--slo-tpot-ms", str(SLO_TPOT_MS),
               "--grid", "split=" + ",".join(SPLITS)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return sorted(rows, key=lambda rec: SPLITS.index(rec["cell"]["split"]))  # the pool returns them as they finish


def aiconfigurator_estimates() -> tuple[dict, dict]:
    """(best disaggregated P x D under the SLOs, best aggregated) by tokens/s/GPU, from aiconfigurator."""
    logging.disable(logging.WARNING)
    from aiconfigurator.sdk import config
    from aiconfigurator.sdk.backends.factory import get_backend
    from aiconfigurator.sdk.inference_session import DisaggInferenceSession, InferenceSession
    from aiconfigurator.sdk.models import get_model
    from aiconfigurator.sdk.perf_database import get_database

    db, be = get_database(SYSTEM, "vllm", "0.24.0"), get_backend("vllm")
    mc = config.ModelConfig(tp_size=1)
    best = None
    session = DisaggInferenceSession(db, be, db, be)
    for p in range(1, GPUS):
        d = GPUS - p
        for bs in (8, 16, 32, 64, 128, 256):
            s = session.run_disagg(HF_ID, config.RuntimeConfig(batch_size=1, isl=ISL, osl=OSL),
                                   prefill_model_config=mc, prefill_batch_size=1, prefill_num_worker=p,
                                   decode_model_config=mc, decode_batch_size=bs, decode_num_worker=d)
            r = s.get_summary_df().iloc[0]
            row = {"split": f"{p}:{d}", "decode_bs": bs, "ttft_ms": float(r["ttft"]), "tpot_ms": float(r["tpot"]),
                   "tokens_s_gpu": float(r["tokens/s/gpu"]), "seq_s": float(r["seq/s"])}
            if row["ttft_ms"] <= SLO_TTFT_MS and row["tpot_ms"] <= SLO_TPOT_MS and \
                    (best is None or row["tokens_s_gpu"] > best["tokens_s_gpu"]):
                best = row
    agg = None
    model = get_model(HF_ID, mc, "vllm")
    for conc in (8, 16, 32, 64, 128, 256):
        s = InferenceSession(model, db, be).run_agg(config.RuntimeConfig(batch_size=conc, isl=ISL, osl=OSL),
                                                   ctx_tokens=8192)
        r = s.get_summary_df().iloc[0]
        row = {"split": f"{GPUS}:0", "concurrency": conc, "ttft_ms": float(r["ttft"]), "tpot_ms": float(r["tpot"]),
               "tokens_s_gpu": float(r["tokens/s/gpu"])}
        if row["ttft_ms"] <= SLO_TTFT_MS and row["tpot_ms"] <= SLO_TPOT_MS and \
                (agg is None or row["tokens_s_gpu"] > agg["tokens_s_gpu"]):
            agg = row
    return best, agg


def lab_gaps() -> dict:
    """The lab's sample file: {input tokens: (agg TTFT p50 median, disagg TTFT p50 median)} at concurrency 1."""
    path = os.path.join(os.path.dirname(__import__("dynlab").__file__), "data", "fixtures", "disagg.jsonl")
    cells = defaultdict(list)
    with open(path) as fh:
        for line in fh:
            if line.strip():
                r = json.loads(line)
                if r["conc"] == 1:
                    cells[(r["input"], r["mode"])].append(r["ttft_p50_ms"])
    inputs = sorted({k[0] for k in cells})
    return {n: (statistics.median(cells[(n, "agg")]), statistics.median(cells[(n, "disagg")])) for n in inputs}


def dynlab_gap(tokens: int, gbps: float) -> tuple[float, float]:
    """dynlab, one request of ``tokens`` prompt tokens on qwen3-0.6b (the lab's model), h100, roofline:
    (aggregated TTFT, P/D time until the decode worker holds the KV)."""
    import random

    from dynlab.disagg.fleet import DisaggFleet
    from dynlab.engine.config import PdSection
    from dynlab.engine.config import SimConfig
    from dynlab.engine.env import RunEnv
    from dynlab.engine.metrics import stats
    from dynlab.engine.run import build_strategy
    from dynlab.engine.serving import build_engines
    from dynlab.engine.timed import TimedFleet
    from dynlab.engine.worker import EngineWorker
    from dynlab.routing.strategy import Request

    cfg = SimConfig(timing=True, model="qwen3-0.6b", gpu="h100", workers=1)
    setup = build_engines(cfg, None)
    req = Request(tuple(range(tokens // cfg.block)), tokens, 8, 0.0, 0)
    names_of = setup.names_of

    def eng(handoff):
        return EngineWorker(0, setup.capacity, cfg.block, setup.latency, handoff=handoff)

    def env(strategy):
        return RunEnv.timed([req], strategy, 1, arrival_rng=random.Random(0))

    strategy = build_strategy(cfg, random.Random(0))
    agg_env = env(strategy)
    TimedFleet(strategy, [eng(False)], agg_env, names_of).run()
    strategy = build_strategy(cfg, random.Random(0))
    fleet = DisaggFleet(strategy, [eng(True)], [eng(False)], env(strategy), names_of,
                        kv_bytes_per_token=setup.latency.hardware.model.kv_bytes_per_token,
                        pd=PdSection(link_gbps=gbps))
    fleet.run()
    (rec,) = fleet.records.values()
    return stats(agg_env.serving.ttft)["p50"], rec.arrived - rec.request.arrival_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="requests of the steady workload")
    args = ap.parse_args()
    aic = have_aiconfigurator()
    latency = "aiconfigurator" if aic else "roofline"
    print(f"## 1. Best split, {GPUS} x {GPU} GPUs, {MODEL}, ISL {ISL}, OSL {OSL}, {RATE} req/s x {args.requests}, "
          f"SLO TTFT {SLO_TTFT_MS:g} ms / TPOT {SLO_TPOT_MS:g} ms (dynlab latency model: {latency})\n")
    rows = dynlab_split_sweep(args.requests, latency)
    print("| split | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | goodput | tok/s/GPU | transfer p50 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for rec in rows:
        r = rec["result"]
        print(f"| {rec['cell']['split']} | {r['ttft_ms']['p50']} | {r['ttft_ms']['p99']} | {r['tpot_ms']['p50']} | "
              f"{r['tpot_ms']['p99']} | {r['goodput']} | {r['output_tokens_per_s_per_gpu']} | "
              f"{r.get('transfer_ms', {}).get('p50', '-')} |")
    best = max(rows, key=lambda rec: (rec["result"]["goodput"], rec["result"]["output_tokens_per_s_per_gpu"],
                                      -rec["result"]["tpot_ms"]["p99"]))
    print(f"\ndynlab's best split (goodput, then tokens/s/GPU, then TPOT p99): **{best['cell']['split']}** "
          f"(goodput {best['result']['goodput']}, {best['result']['output_tokens_per_s_per_gpu']} tok/s/GPU "
          f"at the offered {RATE} req/s)\n")
    if aic:
        d, a = aiconfigurator_estimates()
        print("| aiconfigurator 0.12 (static, vllm 0.24.0) | split | batch | TTFT ms | TPOT ms | tok/s/GPU |")
        print("|---|---|---|---|---|---|")
        if d:
            print(f"| best disaggregated under the SLOs | {d['split']} | decode {d['decode_bs']} | {d['ttft_ms']:.1f} | "
                  f"{d['tpot_ms']:.2f} | {d['tokens_s_gpu']:.1f} |")
        if a:
            print(f"| best aggregated under the SLOs | {a['split']} | concurrency {a['concurrency']} | "
                  f"{a['ttft_ms']:.1f} | {a['tpot_ms']:.2f} | {a['tokens_s_gpu']:.1f} |")
    else:
        print("(aiconfigurator not installed: pip install aiconfigurator for its estimate)")

    print("\n## 2. Disaggregation's TTFT cost vs prompt length at a fixed link\n")
    lab = lab_gaps()
    from dynlab.disagg.cost import effective_gbps

    n0 = min(lab)
    gbps = effective_gbps(n0 * 114_688, lab[n0][1] - lab[n0][0])  # qwen3-0.6b KV bytes per token
    print(f"Link speed implied by the lab's {n0}-token cell: {gbps:.3f} GB/s (qwen3-0.6b, 114,688 B/token)\n")
    print("| prompt tokens | lab agg ms | lab disagg ms | lab cost ms | dynlab agg TTFT ms | dynlab KV-on-decode ms "
          "| dynlab cost ms |")
    print("|---|---|---|---|---|---|---|")
    for n, (agg, dis) in lab.items():
        t_agg, t_dis = dynlab_gap(n, gbps)
        print(f"| {n} | {agg:.1f} | {dis:.1f} | {dis - agg:.1f} | {t_agg:.1f} | {t_dis:.1f} | {t_dis - t_agg:.1f} |")


if __name__ == "__main__":
    main()
