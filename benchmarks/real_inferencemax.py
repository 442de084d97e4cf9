"""Rebuild benchmarks/data/real/inferencemax_gptoss.csv from InferenceMAX's aggregated results (``agg_bmk.json``).

InferenceMAX (SemiAnalysis, github.com/SemiAnalysisAI/InferenceX, formerly InferenceMAX/InferenceMAX) publishes
each sweep as a GitHub Actions artifact ``agg_bmk.json``: one object per benchmark point, written by its
``utils/process_result.py`` from ``benchmark_serving.py``'s result (times in seconds there, ms here;
``tput_per_gpu`` = total tokens/s / tp). The copy read here is the one committed in gminneci/mantile at
``1d3c259`` (``reconcile/sources/inferencemax/raw/run_<RUN>/agg_bmk.json``). One CSV row per point of the
chosen GPUs, all of them vLLM serving openai/gpt-oss-120b (provenance and settings: data/real/README.md).

The client (InferenceMAX ``benchmarks/benchmark_lib.sh``, ``run_benchmark_serving``) draws prompt and output
lengths uniformly on ``[0.8 L, L]`` (its ``benchmark_serving.py``: ``randint(int(L x ratio), L + 1)``,
ratio 0.8), not vLLM's ``[L(1-r), L(1+r)]``. The same uniform law in vLLM's terms is a mean of ``0.9 L``
and ``r = 1/9``, which is what ``random_input_len``, ``random_output_len`` and ``random_range_ratio`` hold.

    python benchmarks/real_inferencemax.py GIT_DIR [--rev 1d3c259] [--run 20218553330] [--gpus h100,h200] [--out NAME]

``inferencemax_gptoss.csv`` is run 20218553330 (vLLM v0.11.2); ``inferencemax_gptoss_v0130.csv`` is
``--run 20667906037 --out inferencemax_gptoss_v0130.csv`` (the same sweep on vLLM v0.13.0);
``inferencemax_dsr1_sglang.csv`` is ``--run 20613446912 --framework sglang --gpus h200 --out
inferencemax_dsr1_sglang.csv`` (SGLang v0.5.6 serving deepseek-ai/DeepSeek-R1-0528, :func:`sglang_server`).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess

from real_blis import COLUMNS

HERE = os.path.dirname(os.path.abspath(__file__))
REAL = os.path.join(HERE, "data", "real")
#: the client's lower bound as a share of the stated length (benchmark_lib.sh's RANDOM_RANGE_RATIO default)
LOW = 0.8
#: vllm serve's settings in InferenceMAX's gptoss_fp4_h100/h200 scripts (max-num-seqs is the concurrency)
MAX_NUM_BATCHED_TOKENS = 8192
PROMPTS_PER_USER = 10  # --num-prompts $(( CONC * 10 ))
#: sglang.launch_server's --chunked-prefill-size (= --max-prefill-tokens) in InferenceMAX's dsr1_fp8_h200_slurm.sh
SGLANG_CHUNK = 32768


def vllm_server(point: dict) -> tuple[int, int]:
    """``(max_num_seqs, max_num_batched_tokens)`` of a vLLM point: ``--max-num-seqs`` is the concurrency,
    ``max-num-batched-tokens`` 8192 (InferenceMAX's gptoss_fp4_h100/h200 scripts)."""
    return int(point["conc"]), MAX_NUM_BATCHED_TOKENS


def sglang_server(point: dict) -> tuple[int, int]:
    """The same two columns for an SGLang point, in SGLang's terms: ``--max-running-requests`` (512 at
    isl/osl 1024/1024, else 256) and ``--chunked-prefill-size`` 32768 (InferenceMAX's
    ``benchmarks/dsr1_fp8_h200_slurm.sh``, unchanged from d22bf9ca9 to 2ee1e0018; data/real/README.md)."""
    short = int(point["isl"]) == 1024 and int(point["osl"]) == 1024
    return (512 if short else 256), SGLANG_CHUNK


def _ms(seconds: float) -> str:
    return f"{seconds * 1000.0:.3f}"


def row(run: str, point: dict, server=vllm_server) -> dict:
    """One CSV row (data/real/README.md's columns) for one ``agg_bmk.json`` object; ``server``: the point's
    ``(max_num_seqs, max_num_batched_tokens)`` (:func:`vllm_server`, :func:`sglang_server`)."""
    conc, tp, isl, osl = int(point["conc"]), int(point["tp"]), int(point["isl"]), int(point["osl"])
    seqs, batched = server(point)
    version = point["image"].rsplit(":v", 1)[-1].split("-", 1)[0]  # v0.5.6-cu129-amd64: 0.5.6
    mid = (1.0 + LOW) / 2.0  # uniform on [0.8 L, L]: mean 0.9 L, half-width 0.1 L = (1/9) x mean
    return {"experiment": f"run_{run}/{point['hw']}-tp{tp}-isl{isl}-osl{osl}-conc{conc}", "model": point["model"],
            "gpu": point["hw"], "tp": tp, "ep": int(point["ep"]), "engine": point["framework"], "version": version,
            "max_num_seqs": seqs, "max_num_batched_tokens": batched, "max_concurrency": conc,
            "request_rate": "", "arrival": "", "num_prompts": PROMPTS_PER_USER * conc,
            "random_input_len": f"{isl * mid:.1f}", "random_output_len": f"{osl * mid:.1f}",
            "random_range_ratio": f"{(1.0 - LOW) / (1.0 + LOW):.6f}", "input_len_p50": "", "output_len_p50": "",
            "median_ttft_ms": _ms(point["median_ttft"]), "mean_ttft_ms": _ms(point["mean_ttft"]),
            "p99_ttft_ms": _ms(point["p99_ttft"]), "median_tpot_ms": _ms(point["median_tpot"]),
            "mean_tpot_ms": _ms(point["mean_tpot"]), "p99_tpot_ms": _ms(point["p99_tpot"]),
            "median_itl_ms": _ms(point["median_itl"]), "median_e2el_ms": _ms(point["median_e2el"]),
            "mean_e2el_ms": _ms(point["mean_e2el"]), "p99_e2el_ms": _ms(point["p99_e2el"]),
            "total_token_throughput": f"{point['tput_per_gpu']:.2f}",
            "output_throughput": f"{point['output_tput_per_gpu']:.2f}", "per_gpu": "true"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("git_dir")
    ap.add_argument("--rev", default="1d3c259")
    ap.add_argument("--run", default="20218553330")
    ap.add_argument("--gpus", default="h100,h200")
    ap.add_argument("--out", default="inferencemax_gptoss.csv", help="the CSV's name under data/real")
    ap.add_argument("--framework", default="vllm", choices=("vllm", "sglang"), help="the points' serving engine")
    args = ap.parse_args()
    path = f"reconcile/sources/inferencemax/raw/run_{args.run}/agg_bmk.json"
    text = subprocess.run(["git", "-C", args.git_dir, "show", f"{args.rev}:{path}"], check=True,
                          capture_output=True, text=True).stdout
    gpus = args.gpus.split(",")
    points = [p for p in json.loads(text) if p["hw"] in gpus and p["framework"] == args.framework and not p["disagg"]]
    points.sort(key=lambda p: (gpus.index(p["hw"]), p["tp"], p["isl"], p["osl"], p["conc"]))
    server = sglang_server if args.framework == "sglang" else vllm_server
    rows = [row(args.run, p, server) for p in points]
    out = os.path.join(REAL, args.out)
    with open(out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} rows -> {out}")


if __name__ == "__main__":
    main()
