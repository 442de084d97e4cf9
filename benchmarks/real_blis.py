"""Rebuild benchmarks/data/real/blis_h100.csv and blis_h100_lengths.json from a clone of inference-sim/training.

Reads, for each experiment of the snapshot's ``default_args/`` that ``split.py`` does not list in
``EXCLUDED_OVERLOAD``: ``exp-config.yaml`` (the vLLM settings), ``profile.yaml`` (inference-perf's load:
its type and the rate of each stage) and ``results/stage_N_lifecycle_metrics.json`` (the measured
figures of stage N, times in seconds). One CSV row per stage; the lengths file keeps each stage's
prompt and output length percentiles, which :mod:`fidelity_real` turns into per-request lengths.

    python benchmarks/real_blis.py GIT_DIR [--rev ed5c1d2]

``GIT_DIR``: a clone (or bare mirror) of github.com/inference-sim/training; nothing is fetched.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "real")
COLUMNS = ["experiment", "model", "gpu", "tp", "ep", "engine", "version", "max_num_seqs", "max_num_batched_tokens",
           "max_concurrency", "request_rate", "arrival", "num_prompts", "random_input_len", "random_output_len",
           "random_range_ratio", "input_len_p50", "output_len_p50", "median_ttft_ms", "mean_ttft_ms", "p99_ttft_ms",
           "median_tpot_ms", "mean_tpot_ms", "p99_tpot_ms", "median_itl_ms", "median_e2el_ms", "mean_e2el_ms",
           "p99_e2el_ms", "total_token_throughput", "output_throughput", "per_gpu"]


def _show(git_dir: str, rev: str, path: str) -> str:
    return subprocess.run(["git", "-C", git_dir, "show", f"{rev}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def _ls(git_dir: str, rev: str, path: str) -> list[str]:
    out = subprocess.run(["git", "-C", git_dir, "ls-tree", "--name-only", rev, path + "/"], check=True,
                         capture_output=True, text=True).stdout
    return [line.rsplit("/", 1)[-1] for line in out.splitlines()]


def _yaml_map(text: str) -> dict:
    """``key: value`` lines (exp-config.yaml is flat)."""
    return dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)


def _ms(dist: dict, stat: str) -> str:
    return f"{dist[stat] * 1000.0:.3f}" if dist and dist.get(stat) is not None else ""


def stage_row(name: str, stage: int, config: dict, rate: float, load_type: str, metrics: dict) -> dict:
    ok = metrics["successes"]
    lat, put = ok["latency"], ok["throughput"]
    tp = int(config["tensor_parallelism"])
    return {"experiment": f"{name}/stage_{stage}", "model": config["model"], "gpu": "h100", "tp": tp, "ep": "",
            "engine": "vllm", "version": "", "max_num_seqs": config["max_num_seqs"],
            "max_num_batched_tokens": config["max_num_batched_tokens"], "max_concurrency": "",
            "request_rate": f"{rate:g}", "arrival": load_type, "num_prompts": ok["count"],
            "random_input_len": f"{ok['prompt_len']['mean']:.2f}", "random_output_len": f"{ok['output_len']['mean']:.2f}",
            "random_range_ratio": "", "input_len_p50": f"{ok['prompt_len']['median']:g}",
            "output_len_p50": f"{ok['output_len']['median']:g}",
            "median_ttft_ms": _ms(lat["time_to_first_token"], "median"),
            "mean_ttft_ms": _ms(lat["time_to_first_token"], "mean"), "p99_ttft_ms": _ms(lat["time_to_first_token"], "p99"),
            # inference-perf's time_per_output_token is not vLLM's TPOT: its median (3.6 ms in the first
            # row) is half of (E2E - TTFT) / (output - 1) at the median request (7.2 ms); left out
            "median_tpot_ms": "", "mean_tpot_ms": "", "p99_tpot_ms": "", "median_itl_ms": "",
            "median_e2el_ms": _ms(lat["request_latency"], "median"), "mean_e2el_ms": _ms(lat["request_latency"], "mean"),
            "p99_e2el_ms": _ms(lat["request_latency"], "p99"),
            "total_token_throughput": f"{put['total_tokens_per_sec']:.2f}",
            "output_throughput": f"{put['output_tokens_per_sec']:.2f}", "per_gpu": "false"}


def _percentiles(dist: dict) -> dict:
    """``{percent: tokens}`` of an inference-perf length distribution (min = 0, max = 100)."""
    out = {}
    for key, value in dist.items():
        p = {"min": 0.0, "max": 100.0, "median": 50.0}.get(key)
        if p is None and re.fullmatch(r"p\d+(\.\d+)?", key):
            p = float(key[1:])
        if p is not None:
            out[f"{p:g}"] = value
    return dict(sorted(out.items(), key=lambda kv: float(kv[0])))


#: inference-perf's load type -> the ``arrival`` dynlab replays. Its ``constant`` load draws exponential gaps at
#: 1/rate and rescales them to fill the stage (``ConstantLoadTimer`` in inference_perf/loadgen/load_timer.py):
#: Poisson arrivals conditioned on their count, not evenly spaced ones.
ARRIVALS = {"constant": "poisson", "poisson": "poisson"}


def build(git_dir: str, rev: str) -> tuple[list[dict], dict]:
    split = _show(git_dir, rev, "split.py")
    excluded = set(re.findall(r'dir_name="([^"]+)"', split[split.index("EXCLUDED_OVERLOAD: "):]))
    rows, lengths = [], {}
    for name in _ls(git_dir, rev, "default_args"):
        if name in excluded:
            continue
        base = f"default_args/{name}"
        config = _yaml_map(_show(git_dir, rev, f"{base}/exp-config.yaml"))
        profile = json.loads(_show(git_dir, rev, f"{base}/profile.yaml"))
        for stage, spec in enumerate(profile["load"]["stages"]):
            metrics = json.loads(_show(git_dir, rev, f"{base}/results/stage_{stage}_lifecycle_metrics.json"))
            row = stage_row(name, stage, config, float(spec["rate"]), ARRIVALS[profile["load"]["type"]], metrics)
            rows.append(row)
            ok = metrics["successes"]
            lengths[row["experiment"]] = {"prompt_len": _percentiles(ok["prompt_len"]),
                                          "output_len": _percentiles(ok["output_len"])}
    return rows, lengths


#: the columns of the per-model points files (dynlab calibrate's ``points`` format)
POINTS = ["model", "gpu", "tp", "request_rate", "arrival", "num_prompts", "random_input_len", "random_output_len",
          "median_ttft_ms", "mean_ttft_ms", "p99_ttft_ms", "median_e2el_ms", "p99_e2el_ms", "engine", "source_note"]


def write_points(rows: list[dict]) -> list[str]:
    """One points file per model (``blis_points/<model>.csv``): what ``dynlab calibrate`` reads. The lengths
    are the median request's (the figures are medians); the throughput is left out (an open-loop client
    sets it: it is the offered load, whatever the server)."""
    os.makedirs(os.path.join(OUT, "blis_points"), exist_ok=True)
    paths = []
    for model in sorted({r["model"] for r in rows}):
        path = os.path.join(OUT, "blis_points", model.rsplit("/", 1)[-1].lower() + ".csv")
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, POINTS, lineterminator="\n")
            w.writeheader()
            for r in rows:
                if r["model"] == model:
                    out = {k: r.get(k, "") for k in POINTS}
                    out["random_input_len"] = round(float(r["input_len_p50"]))
                    out["random_output_len"] = round(float(r["output_len_p50"]))
                    out["source_note"] = r["experiment"]
                    w.writerow(out)
        paths.append(path)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("git_dir")
    ap.add_argument("--rev", default="ed5c1d2")
    args = ap.parse_args()
    rows, lengths = build(args.git_dir, args.rev)
    with open(os.path.join(OUT, "blis_h100.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(OUT, "blis_h100_lengths.json"), "w") as fh:
        json.dump(lengths, fh, indent=1)
        fh.write("\n")
    write_points(rows)
    print(f"{len(rows)} rows from {len({r['experiment'].split('/')[0] for r in rows})} experiments")


if __name__ == "__main__":
    main()
