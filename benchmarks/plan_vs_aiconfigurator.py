"""`dynlab plan` beside NVIDIA aiconfigurator's own search, on one synthetic workload (issue 27 item 6).

The workload: fixed ISL/OSL, no prefix reuse (every prompt's tokens are its own), Poisson arrivals at
``--rate`` requests/s, written as a token trace. aiconfigurator-core's aggregated search
(``BaseBackend.find_best_agg_result_under_constraints``: a sweep of batch size and context tokens per
step on its measured-kernel database, keeping the best throughput per GPU whose TTFT and TPOT meet the
SLOs) gives one replica's sequences/s; a fleet for the rate is ``ceil(rate / (seq/s per replica))``
replicas. dynlab plan replays the trace through routed vLLM-like engines (latency model
``aiconfigurator``, the same database, so the two differ only in what a replay adds: arrival
bursts and queueing, preemption, prefix hits) and bisects the worker count, at p50 and p99.

Then, on the bundled Mooncake trace, it plans one shape twice: as it is, and with every prompt's blocks
renamed so that no two requests share a prefix, to show what prefix reuse changes.

Needs ``pip install "dynlab[aiconfigurator]"`` (Python 3.11+). Takes a few minutes of two cores
(the bundled-trace part most; ``--skip-bundled`` leaves it out). Prints plain text.

    python benchmarks/plan_vs_aiconfigurator.py [--isl 2000 --osl 200 --rate 40 --requests 400]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import os
import random
import subprocess
import sys
import tempfile

AIC_MODEL = {"llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B", "qwen3-8b": "Qwen/Qwen3-8B"}
AIC_SYSTEM = {"h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm"}


def aiconfigurator_best(model: str, gpu: str, isl: int, osl: int, ttft_ms: float, tpot_ms: float) -> dict:
    """aiconfigurator's best aggregated tp-1 point under the SLOs: its row (concurrency, ttft, tpot, seq/s)."""
    logging.disable(logging.CRITICAL)
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        from aiconfigurator_core.sdk import config
        from aiconfigurator_core.sdk.backends.factory import get_backend
        from aiconfigurator_core.sdk.models import get_model
        from aiconfigurator_core.sdk.perf_database import get_database, get_latest_database_version

        system, backend = AIC_SYSTEM[gpu], "vllm"
        version = get_latest_database_version(system, backend)
        database = get_database(system, backend, version)
        aic_model = get_model(AIC_MODEL[model], config.ModelConfig(tp_size=1, pp_size=1), backend)
        runtime = config.RuntimeConfig(isl=isl, osl=osl, ttft=ttft_ms, tpot=tpot_ms)
        summary = get_backend(backend).find_best_agg_result_under_constraints(
            aic_model, database, runtime, top_k=1, max_batch_size=512, ctx_stride=512)
        df = summary.get_summary_df()
    if df is None or len(df) == 0:
        return {}
    row = df.iloc[0]
    return {"version": version, "concurrency": int(row["concurrency"]), "ttft_ms": float(row["ttft"]),
            "tpot_ms": float(row["tpot"]), "seq_s": float(row["seq/s"]), "gpus": int(row["num_total_gpus"])}


def write_token_trace(path: str, n: int, isl: int, osl: int, rate: float, seed: int = 1) -> None:
    """``n`` requests of ``isl`` tokens of their own (no prefix reuse) and ``osl`` output tokens, Poisson
    arrivals at ``rate`` requests/s (seeded), as a token trace (timestamps in ms)."""
    rng = random.Random(seed)
    t = 0.0
    with open(path, "w") as fh:
        for i in range(n):
            tokens = list(range(i * isl, (i + 1) * isl))
            fh.write(json.dumps({"timestamp": round(t, 3), "tokens": tokens, "output_length": osl}) + "\n")
            t += rng.expovariate(rate) * 1000.0


def dynlab_plan(args: list) -> dict:
    """Run ``dynlab plan ... --format json`` and return its object (the first shape's row)."""
    cmd = [sys.executable, "-m", "dynlab", "plan", *map(str, args), "--format", "json", "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode not in (0, 3):  # 3: no shape meets the target (the plan is printed all the same)
        raise SystemExit(f"dynlab plan failed: {out.stderr.strip()}")
    return json.loads(out.stdout)["shapes"][0]


def without_reuse(path: str) -> None:
    """The bundled trace with every request's block ids replaced by ids of its own (no shared prefix)."""
    from dynlab.traces.reader import open_source

    stream, _, _ = open_source("mooncake-conversation")
    next_id = 0
    with contextlib.closing(stream), open(path, "w") as out:
        for line in io.TextIOWrapper(stream, encoding="utf-8"):
            row = json.loads(line)
            k = len(row["hash_ids"])
            row["hash_ids"] = list(range(next_id, next_id + k))
            next_id += k
            out.write(json.dumps(row) + "\n")


def _row(label: str, s: dict, pct: str) -> str:
    n = s["workers"] if s["meets"] else f"({s['shown_workers']}, misses)"
    return (f"  {label:<34} workers {n!s:<6} TTFT {pct} {s['ttft_ms']} ms, TPOT {pct} {s['tpot_ms']} ms, "
            f"preemptions {s['preemptions']}, binding {s['binding']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.1-8b", choices=sorted(AIC_MODEL))
    ap.add_argument("--gpu", default="h100", choices=sorted(AIC_SYSTEM))
    ap.add_argument("--isl", type=int, default=2000)
    ap.add_argument("--osl", type=int, default=200)
    ap.add_argument("--rate", type=float, default=40.0, help="requests/s")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--ttft-ms", type=float, default=500.0)
    ap.add_argument("--tpot-ms", type=float, default=20.0)
    ap.add_argument("--skip-bundled", action="store_true", help="leave out the bundled-trace part")
    a = ap.parse_args()

    best = aiconfigurator_best(a.model, a.gpu, a.isl, a.osl, a.ttft_ms, a.tpot_ms)
    print(f"workload: {a.requests} requests, ISL {a.isl}, OSL {a.osl}, no prefix reuse, Poisson {a.rate:g} "
          f"requests/s; {a.model} on {a.gpu} tp 1; SLOs TTFT {a.ttft_ms:g} ms, TPOT {a.tpot_ms:g} ms")
    if not best:
        print("aiconfigurator: no configuration meets the SLOs")
    else:
        replicas = math.ceil(a.rate / best["seq_s"])
        print(f"aiconfigurator {best['version']} (vllm) best aggregated point: concurrency {best['concurrency']} per "
              f"replica, TTFT {best['ttft_ms']:.1f} ms, TPOT {best['tpot_ms']:.2f} ms, {best['seq_s']:.3f} seq/s per "
              f"replica -> {replicas} replicas ({replicas * best['gpus']} GPUs) for {a.rate:g} requests/s")
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "fixed.jsonl")
        write_token_trace(trace, a.requests, a.isl, a.osl, a.rate)
        common = ["--trace", trace, "--model", a.model, "--gpu", a.gpu, "--slo-ttft-ms", a.ttft_ms,
                  "--slo-tpot-ms", a.tpot_ms, "--modes", "least-loaded"]
        print("dynlab plan (replayed, least-loaded routing):")
        for latency in ("aiconfigurator", "roofline"):
            for pct in ("p50", "p99"):
                s = dynlab_plan(common + ["--latency-model", latency, "--slo-percentile", pct])
                print(_row(f"{latency} latency model, {pct}:", s, pct))
        if a.skip_bundled:
            return
        print("bundled trace (mooncake-conversation at twice its rate), h200 tp 2 kv-cost, TTFT 2000 ms, "
              "TPOT 50 ms at p99:")
        bundled = ["--rate-scale", "2", "--gpu", "h200", "--tp", "2", "--modes", "kv-cost", "--slo-ttft-ms", "2000",
                   "--slo-tpot-ms", "50"]
        s = dynlab_plan(["--trace", "mooncake-conversation", *bundled])
        print(_row("as recorded (shared prefixes):", s, "p99"))
        flat = os.path.join(tmp, "no_reuse.jsonl")
        without_reuse(flat)
        s = dynlab_plan(["--trace", flat, *bundled])
        print(_row("every prefix renamed (no reuse):", s, "p99"))


if __name__ == "__main__":
    main()
