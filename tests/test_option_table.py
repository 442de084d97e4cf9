"""Every option of every command changes some output, or is refused where it would have no effect.

The test walks the click tree of ``dynlab.cli.main``; each option must have a row in :data:`TABLE`
(``(command path, flag) -> case``), so a new option fails this test until a row proves what it does.
A case is a function of ``run`` (``run(*args, files={name: text})`` runs the command in a fresh
directory holding ``files`` and returns ``Out(code, stdout, stderr, files written)``).

Each case compares two runs that differ only in the option (the outputs must differ), or runs the
option in a combination where it has no effect and expects exit 2 with one line naming it.
"""
from __future__ import annotations

import json
import os
import sys
from typing import NamedTuple

import click
import pytest
from click.testing import CliRunner

from dynlab.cli import main

from helpers import stderr_on_a_terminal

# a 3-request Mooncake trace (512-token blocks: len(hash_ids) == ceil(input_length / 512)), timestamps in ms
MOON = "moon.jsonl"
MOON_TEXT = "".join(json.dumps(r) + "\n" for r in [
    {"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]},
    {"timestamp": 50, "input_length": 1536, "output_length": 4, "hash_ids": [1, 2, 3]},
    {"timestamp": 90, "input_length": 600, "output_length": 4, "hash_ids": [7, 8]},
])
DISAGG = "d.jsonl"
DISAGG_TEXT = ('{"mode": "agg", "input": 10, "conc": 1, "rep": 0, "ttft_p50_ms": 20.0}\n'
               '{"mode": "disagg", "input": 10, "conc": 1, "rep": 0, "ttft_p50_ms": 50.0}\n')
OFFLOAD = "o.jsonl"
OFFLOAD_TEXT = "".join(json.dumps({"config": c, "pass": "p", "doc": 0, "doc_tokens": 10, "ttft_ms": ms,
                                   "total_ms": ms + 1}) + "\n"
                       for c, ms in [("baseline", 30.0), ("lmcache", 10.0), ("other", 5.0)])
MODEL = "config.json"
MODEL_TEXT = json.dumps({"num_hidden_layers": 2, "num_key_value_heads": 1, "head_dim": 64,
                         "hidden_size": 128, "num_attention_heads": 2, "torch_dtype": "float32"})
TOKENS = "tokens.jsonl"
TOKENS_TEXT = '{"tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]}\n' * 2
SPEC = "spec.json"  # a workload spec (docs/workloads.md): 4 requests sharing a 32-token system prompt
SPEC_TEXT = json.dumps({"seed": 1, "requests": 4, "arrival": {"process": "poisson", "rate": 5},
                        "input": {"dist": "uniform", "min": 20, "max": 40},
                        "output": {"dist": "uniform", "min": 2, "max": 8}, "prefix": {"groups": 1, "length": 32}})
_SAMPLES = os.path.join(os.path.dirname(__file__), "data", "traces")
SHAREGPT, TOKENIZER = "sharegpt.json", "tokenizer.json"  # written for the tests (tests/data/traces/README.md)
RUN = "run.json"  # what `dynlab sim` prints, cut to the keys a report reads
RUN_TEXT = json.dumps({"mode": "kv", "workers": 2, "requests": 2, "hit_rate": 0.5, "requests_per_worker": [1, 1]})
REQS = "req.jsonl"  # `sim --requests-out` records of that run
REQS_TEXT = "".join(json.dumps({"id": i, "worker": i, "arrival_ms": 0.0, "first_scheduled_ms": 1.0,
                                "first_token_ms": 5.0 + i, "finish_ms": 9.0, "input_length": 8, "output_length": 3,
                                "hit_tokens": 0, "preemptions": 0, "rejected": False}) + "\n" for i in range(2))
PROFILE = "profile.json"  # a dynlab calibrate profile (dynlab/latency/profile.py) of the linear model
PROFILE_TEXT = json.dumps({"dynlab_calibration": 1, "model": "llama-3.1-8b", "gpu": "h100", "tp": 1, "engine": None,
                           "version": None, "latency_model": "linear",
                           "latency_opts": {"beta0": 20.0, "beta1": 0.1, "beta2": 1.0},
                           "fitted": ["beta0", "beta1", "beta2"], "folds": 3,
                           "cv_error_pct": {"median_ttft_ms": 10.0}, "points": []})
CAL = "cal.csv"  # measured points (a points file) for dynlab calibrate: 3 concurrencies of 8 short requests
CAL_TEXT = ("model,gpu,max_concurrency,num_prompts,random_input_len,random_output_len,median_ttft_ms,median_tpot_ms\n"
            "llama-3.1-8b,h100,1,8,64,8,10,5\nllama-3.1-8b,h100,2,8,64,8,15,6\nllama-3.1-8b,h100,4,8,64,8,25,8\n")
PRIO = "prio.jsonl"  # vllm #40004 (issue 42): L (priority 1) runs, H (priority 0) arrives at 30 ms
PRIO_TEXT = "".join(json.dumps(r) + "\n" for r in [
    {"timestamp": 0, "tokens": list(range(1, 17)), "output_length": 10, "priority": 1},
    {"timestamp": 30, "tokens": list(range(100, 116)), "output_length": 2, "priority": 0}])
LORA = "lora.jsonl"  # two requests at once naming two adapters (issue 42 item 4): --max-loras 1 holds one back
LORA_TEXT = "".join(json.dumps({"timestamp": 0, "tokens": list(range(k, k + 16)), "output_length": 4,
                                "lora_name": name}) + "\n" for k, name in ((1, "a"), (100, "b")))
BURST = "burst.csv"  # BurstGPT with a failed row (Response tokens 0), skipped unless --keep-failed (issue 43)
BURST_TEXT = "Timestamp,Request tokens,Response tokens\n0,64,4\n1,64,0\n2,64,4\n"
FILES = {BURST: BURST_TEXT, PROFILE: PROFILE_TEXT, CAL: CAL_TEXT, SHAREGPT: open(os.path.join(_SAMPLES, SHAREGPT)).read(),
         TOKENIZER: open(os.path.join(_SAMPLES, TOKENIZER)).read(), SPEC: SPEC_TEXT, RUN: RUN_TEXT,
         REQS: REQS_TEXT, TOKENS: TOKENS_TEXT, MOON: MOON_TEXT, DISAGG: DISAGG_TEXT, OFFLOAD: OFFLOAD_TEXT,
         MODEL: MODEL_TEXT, PRIO: PRIO_TEXT, LORA: LORA_TEXT}


class Out(NamedTuple):
    code: int
    stdout: str
    stderr: str
    files: dict


def differ(a: Out, b: Out) -> None:
    assert a.code == 0 and b.code == 0, (a.stderr, b.stderr)
    assert (a.stdout, a.files) != (b.stdout, b.files)


def refused(out: Out, flag: str) -> None:
    assert out.code == 2, out
    (line,) = out.stderr.splitlines()
    assert line.startswith("Error: ") and flag in line, line


def changes(base: list, extra: list):
    """The command ``base`` and ``base + extra`` print different outputs (stdout or files written)."""
    return lambda run: differ(run(*base), run(*base, *extra))


def swaps(a: list, b: list):
    """Two full command lines (differing in one option's value) print different outputs."""
    return lambda run: differ(run(*a), run(*b))


def refuses(args: list, flag: str):
    """The command is a usage error naming ``flag``."""
    return lambda run: refused(run(*args), flag)


def on_a_terminal(args: list):
    """--quiet: on a terminal the progress bar goes to stderr; --quiet removes it."""
    def case(run):
        assert stderr_on_a_terminal(args) != b"" and stderr_on_a_terminal(args + ["--quiet"]) == b""
    return case


# ------------------------------------------------------------------------------------------ sim options
def sim_rows(cmd: list) -> dict:
    """The rows of the options sim, compare and sweep share, for the command line ``cmd``."""
    t = ["--trace", MOON]
    timed = cmd + ["--timing", "--trace", MOON]
    busy = timed + ["--time-scale", "0.001"]  # all three requests at once
    sg = ["--engine", "sglang"]
    return {
        "--mode": changes(cmd, ["--mode", "rr"]),
        "--workers": changes(cmd, ["--workers", "3"]),
        "--prefixes": changes(cmd, ["--prefixes", "3"]),
        "--reps": changes(cmd, ["--reps", "3"]),
        "--plen": changes(cmd + ["--all-metrics"], ["--plen", "40"]),
        "--tail": changes(cmd + ["--all-metrics"], ["--tail", "40"]),
        "--seed": changes(cmd + ["--mode", "random", "--all-metrics"], ["--seed", "2"]),
        "--block": changes(cmd + ["--all-metrics"], ["--block", "32"]),
        "--publish": changes(cmd + ["--mode", "kv-events"], ["--publish", "no"]),
        "--capacity": changes(cmd + ["--all-metrics"], ["--capacity", "4"]),
        "--policy": changes(cmd + ["--capacity", "4", "--all-metrics"], ["--policy", "opt"]),
        "--event-delay": changes(cmd + ["--mode", "kv-events"], ["--event-delay", "5"]),
        "--event-loss": changes(cmd + ["--mode", "kv-events"], ["--event-loss", "0.5"]),
        "--trace": changes(cmd, t),
        "--trace-format": refuses(cmd + ["--trace-format", "mooncake"], "--trace-format"),
        # the timed engine: each option changes a timed run (and is refused without --timing: NO_EFFECT)
        "--time-scale": changes(timed, ["--time-scale", "2"]),
        "--rate": changes(cmd + ["--timing"], ["--rate", "5"]),
        # rates (docs/workloads.md): the trace at twice its rate; cut to its first two requests; looped with
        # the same block names (the repeats hit) instead of new ones
        "--rate-scale": changes(timed, ["--rate-scale", "2"]),
        "--duration": changes(cmd + t, ["--duration", "0.06"]),
        "--duration-repeat": changes(cmd + t + ["--duration", "1"], ["--duration-repeat", "same"]),
        # closed loop (issue 38): one user serves the three requests one after another; the think time
        # spaces them; --requests serves the first two; --warmup leaves the first out of the figures
        "--concurrency": changes(timed, ["--concurrency", "1"]),
        "--think-time-ms": changes(timed + ["--concurrency", "1"], ["--think-time-ms", "500"]),
        "--requests": changes(timed, ["--requests", "2"]),
        "--warmup": changes(timed, ["--warmup", "1"]),
        "--latency-profile": changes(timed, ["--latency-profile", PROFILE]),
        "--request-overhead-ms": changes(timed, ["--request-overhead-ms", "50"]),
        "--detok-us-per-token": changes(timed, ["--detok-us-per-token", "500"]),
        "--workload": changes(cmd, ["--workload", SPEC]),
        "--tokenizer": changes(cmd + ["--trace", SHAREGPT], ["--tokenizer", TOKENIZER]),
        "--trace-block": refuses(cmd + ["--timing", "--trace", TOKENS, "--trace-block", "64"], "--trace-block"),
        "--max-num-batched-tokens": changes(timed, ["--max-num-batched-tokens", "256"]),
        "--max-num-seqs": changes(busy, ["--max-num-seqs", "1"]),
        "--latency-model": changes(timed, ["--latency-model", "linear"]),
        "--latency-opt": changes(timed + ["--latency-model", "linear"], ["--latency-opt", "beta0=1"]),
        "--model": changes(timed, ["--model", "qwen3-8b"]),
        "--gpu": changes(timed, ["--gpu", "h200"]),
        "--tp": changes(timed, ["--tp", "2"]),
        "--gpu-memory-utilization": changes(timed, ["--gpu-memory-utilization", "0.5"]),
        "--event-delay-ms": changes(timed + ["--mode", "kv-events"], ["--event-delay-ms", "60"]),
        "--slo-ttft-ms": changes(timed, ["--slo-ttft-ms", "100"]),
        "--slo-tpot-ms": changes(timed, ["--slo-tpot-ms", "100"]),
        # a class's SLOs (the trace's requests name none: class "default"): goodput appears
        "--slo": changes(timed, ["--slo", "default:ttft_ms=1"]),
        # the CPU tier: a 2-block GPU pool evicts request 0's blocks before request 1 re-reads them
        "--cpu-capacity": changes(timed + ["--capacity", "8", "--block", "256"], ["--cpu-capacity", "8"]),
        "--cpu-memory-gb": changes(timed + ["--capacity", "8", "--block", "256"], ["--cpu-memory-gb", "1"]),
        "--pcie-gbps": changes(timed + ["--capacity", "8", "--block", "256", "--cpu-capacity", "8"],
                               ["--pcie-gbps", "1"]),
        # a victim tier writes only evicted blocks, write-through (the default) every computed one: pcie_bytes differ
        "--cpu-write": changes(timed + ["--capacity", "8", "--block", "256", "--cpu-capacity", "8"],
                               ["--cpu-write", "evict"]),
        # worker 0 (rr) holds request 0's 1,024 tokens (65 blocks of 16 with its output) of 70 when request 2
        # (600 tokens) arrives: full admission waits for its 38 blocks, chunk admits 64-token chunks and preempts
        "--admission": changes(busy + ["--mode", "rr", "--capacity", "70", "--block", "16",
                                       "--max-num-batched-tokens", "64"], ["--admission", "chunk"]),
        # SGLang's separate prefill and decode passes time the trace differently (refused without --timing: NO_EFFECT)
        "--engine": changes(busy, ["--engine", "sglang"]),
        # SGLang's options (issue 40): each changes an SGLang run (the resolved options are in its keys too) and
        # is refused with another engine (NO_EFFECT)
        "--max-running-requests": changes(busy + sg, ["--max-running-requests", "1"]),
        "--chunked-prefill-size": changes(timed + sg, ["--chunked-prefill-size", "256"]),
        "--max-prefill-tokens": changes(busy + sg, ["--max-prefill-tokens", "512"]),
        "--schedule-policy": changes(busy + sg, ["--schedule-policy", "lof"]),
        "--page-size": changes(timed + sg, ["--page-size", "4"]),
        "--disable-radix-cache": changes(timed + sg, ["--disable-radix-cache"]),
        "--enable-mixed-chunk": changes(busy + sg, ["--enable-mixed-chunk"]),
        "--mem-fraction-static": changes(timed + sg, ["--mem-fraction-static", "0.5"]),
        "--schedule-conservativeness": changes(busy + sg, ["--schedule-conservativeness", "0.5"]),
        "--init-new-token-ratio": changes(busy + sg, ["--init-new-token-ratio", "0.3"]),
        "--new-token-ratio-decay-steps": changes(busy + sg, ["--new-token-ratio-decay-steps", "10"]),
        # one built-in controller, none: named, it is refused where it would do nothing (NO_EFFECT); a third-party
        # controller changes a run (tests/test_thirdparty_plugin.py: add-then-retire)
        "--controller": refuses(cmd + ["--controller", "none"], "--controller"),
        # prices (issue 41 item 4): the result adds gpu_hours, cost_usd and price_source; a discount halves the cost
        "--price": changes(timed, ["--price", "table"]),
        "--spot-discount": changes(timed + ["--price", "table"], ["--spot-discount", "0.5"]),
        # at --max-num-seqs 1 H waits for L (fcfs), or displaces it (priority-displace): H's TTFT changes
        "--queue-policy": changes(cmd + ["--timing", "--trace", PRIO, "--max-num-seqs", "1"],
                                  ["--queue-policy", "priority-displace"]),
        # all three requests at once: with one queued request per class at most, two are shed
        "--admission-policy": changes(busy, ["--admission-policy", "queue-bound:limit=1"]),
        # LoRA adapters (issue 42 item 4): with one slot, b waits for a; the other options change the lora section
        "--max-loras": changes(cmd + ["--timing", "--trace", LORA], ["--max-loras", "1"]),
        "--max-cpu-loras": changes(cmd + ["--timing", "--trace", LORA, "--max-loras", "1"], ["--max-cpu-loras", "2"]),
        "--max-lora-rank": changes(cmd + ["--timing", "--trace", LORA, "--max-loras", "1"], ["--max-lora-rank", "8"]),
        "--lora-disk-gbps": changes(cmd + ["--timing", "--trace", LORA, "--max-loras", "1"],
                                    ["--lora-disk-gbps", "1"]),
        # async scheduling: request 1 (at 50 ms) joins a step one step later, so its TTFT changes
        "--async-scheduling": changes(busy, ["--async-scheduling"]),
        # BurstGPT's failed row (issue 43): skipped (2 requests), or replayed without an answer (3)
        "--keep-failed": changes(cmd + ["--trace", BURST], ["--keep-failed"]),
        "--timing": changes(cmd, ["--timing"]),
        "--all-metrics": changes(cmd, ["--all-metrics"]),
        "--opt": changes(cmd + ["--mode", "kv-cost"], ["--opt", "temperature=1"]),
        # router replicas: each keeps its own memory of what it routed (kv's index)
        "--routers": changes(cmd + ["--all-metrics"], ["--routers", "2"]),
        "--router-assign": changes(cmd + ["--routers", "2"], ["--router-assign", "hash"]),
        # a trace that names its own blocks cannot be re-hashed; on tokens the run says its scheme
        "--hash": changes(cmd + ["--trace", TOKENS], ["--hash", "dynamo"]),
        # the worker's parallelism (models helper): each changes the pool's derivation and the step times
        "--ep": changes(timed + ["--model", "qwen3-30b-a3b", "--tp", "2"], ["--ep", "2"]),
        "--pp": changes(timed, ["--pp", "2"]),
        # two GPUs either way: attention tensor-parallel over both, or two attention replicas (--ep 2 without
        # --dp-attention needs --tp 2; with it, --tp 2 --ep 2 is one replica and refused: NO_EFFECT)
        "--dp-attention": swaps(timed + ["--model", "qwen3-30b-a3b", "--tp", "2", "--ep", "2"],
                                timed + ["--model", "qwen3-30b-a3b", "--ep", "2", "--dp-attention"]),
        "--kv-cache-dtype": changes(timed, ["--kv-cache-dtype", "fp8"]),
        # speculative decoding (spec helper, issue 26): drafts change step counts, times and the spec_* keys
        "--spec-tokens": swaps(timed + ["--spec-method", "eagle", "--spec-tokens", "2"],
                               timed + ["--spec-method", "eagle", "--spec-tokens", "3"]),
        "--spec-method": swaps(timed + ["--spec-method", "eagle", "--spec-tokens", "2"],
                               timed + ["--spec-method", "ngram", "--spec-tokens", "2"]),
        "--spec-acceptance": changes(timed + ["--spec-method", "eagle", "--spec-tokens", "2"],
                                     ["--spec-acceptance", "0.1"]),
        "--spec-model": changes(timed + ["--spec-method", "draft", "--spec-tokens", "2"],
                                ["--spec-model", "qwen3-0.6b"]),
        "--spec-draws": changes(timed + ["--spec-method", "eagle", "--spec-tokens", "3", "--spec-acceptance", "0.5"],
                                ["--spec-draws", "expected"]),
        # issue 43: plain names and a hit's last block dropped (the run's spec_hash_rule key says so)
        "--spec-hash-rule": changes(timed + ["--spec-method", "eagle", "--spec-tokens", "2"],
                                    ["--spec-hash-rule", "drop"]),
        **pd_rows(cmd),
    }


def pd_rows(cmd: list) -> dict:
    """Disaggregated serving: each option changes a P/D run (and is refused without one: NO_EFFECT)."""
    if cmd and cmd[0] == "sweep":  # SWEEP's workers axis is refused with a P/D fleet: vary the seed
        cmd = ["sweep", "--executor", "serial", "--quiet", "--grid", "seed=1,2"]
    timed = cmd + ["--timing", "--trace", MOON]
    pd = timed + ["--prefill-workers", "1", "--decode-workers", "1"]
    return {
        "--prefill-workers": swaps(pd, timed + ["--prefill-workers", "2", "--decode-workers", "1"]),
        "--decode-workers": swaps(pd, timed + ["--prefill-workers", "1", "--decode-workers", "2"]),
        "--split": swaps(timed + ["--split", "1:1"], timed + ["--split", "2:0"]),
        "--decode-router": changes(timed + ["--prefill-workers", "1", "--decode-workers", "2"],
                                   ["--decode-router", "round-robin"]),
        "--link-gbps": changes(pd, ["--link-gbps", "1"]),
        "--link-latency-ms": changes(pd, ["--link-latency-ms", "5"]),
        "--overlap-transfer": changes(pd, ["--overlap-transfer"]),
        # the second request shares the first's two trace blocks: the decode worker holds them
        "--decode-prefix-cache": changes(pd, ["--decode-prefix-cache"]),
    }


# combinations where a sim option has no effect: each is refused by sim, compare and sweep alike
NO_EFFECT = [
    (["--trace", MOON, "--block", "64"], "--block"),
    (["--trace", MOON, "--block", "16"], "--block"),  # written at its default value: still no effect
    (["--trace", MOON, "--prefixes", "3"], "--prefixes"),
    (["--trace", MOON, "--reps", "3"], "--reps"),
    (["--trace", MOON, "--plen", "3"], "--plen"),
    (["--trace", MOON, "--tail", "3"], "--tail"),
    (["--trace", MOON, "--all-metrics"], "--all-metrics"),
    (["--trace-format", "tokens"], "--trace-format"),
    (["--policy", "fifo"], "--policy"),
    (["--publish", "no", "--event-delay", "2"], "--event-delay"),
    (["--publish", "no", "--event-loss", "0.1"], "--event-loss"),
    (["--rate", "3"], "--rate"),
    (["--rate-scale", "2"], "--rate-scale"),
    (["--workload", SPEC, "--prefixes", "3"], "--prefixes"),
    (["--workload", SPEC, "--all-metrics"], "--all-metrics"),
    (["--workload", SPEC, "--tokenizer", "tok.json"], "--tokenizer"),  # the spec makes token ids: no text
    (["--workload", SPEC, "--trace-format", "mooncake"], "--trace-format"),  # nor a trace to read
    (["--tokenizer", "tok.json"], "--tokenizer"),
    (["--keep-failed"], "--keep-failed"),  # no trace
    (["--trace", MOON, "--keep-failed"], "--keep-failed"),  # a format that records no failed request
    (["--trace-block", "16"], "--trace-block"),  # no trace names its own blocks
    (["--workload", SPEC, "--trace-block", "16"], "--trace-block"),  # the spec's token ids are hashed at --block
    (["--trace", MOON, "--rate-scale", "2"], "--rate-scale"),  # without --timing
    (["--timing", "--rate-scale", "2"], "--rate-scale"),  # the synthetic workload has no timestamps
    (["--duration", "5"], "--duration"),
    (["--concurrency", "4"], "--concurrency"),  # without --timing
    (["--requests", "2"], "--requests"),
    (["--warmup", "1"], "--warmup"),
    (["--timing", "--think-time-ms", "5"], "--think-time-ms"),  # open loop: no user waits
    (["--timing", "--trace", MOON, "--concurrency", "2", "--rate-scale", "2"], "--rate-scale"),
    (["--timing", "--concurrency", "2", "--rate", "3"], "--rate"),
    (["--timing", "--trace", MOON, "--concurrency", "2", "--time-scale", "2"], "--time-scale"),
    (["--duration-repeat", "same"], "--duration-repeat"),
    (["--trace", MOON, "--duration-repeat", "same"], "--duration-repeat"),
    (["--max-num-seqs", "3"], "--max-num-seqs"),
    (["--latency-opt", "beta0=3"], "--latency-opt"),
    (["--latency-profile", PROFILE], "--latency-profile"),  # without --timing
    (["--request-overhead-ms", "5"], "--request-overhead-ms"),
    (["--detok-us-per-token", "5"], "--detok-us-per-token"),
    (["--timing", "--latency-profile", PROFILE, "--latency-model", "roofline"], "--latency-model"),  # the profile's
    (["--timing", "--policy", "fifo"], "--policy"),
    (["--timing", "--event-delay", "2"], "--event-delay"),
    # a fresh user's trial: the timed engine sized the pool from the GPU as if --capacity were not given
    (["--timing", "--capacity", "unbounded"], "--capacity"),
    (["--trace", MOON, "--hash", "dynamo"], "--hash"),
    (["--mode", "rr", "--opt", "temperature=1"], "temperature"),
    (["--router-assign", "hash"], "--router-assign"),  # one router: no replica to choose
    (["--mode", "kv-cost", "--routers", "2", "--opt", "shared_load=true"], "shared_load"),  # no load without --timing
    (["--mode", "kv-cost", "--timing", "--opt", "shared_load=true"], "shared_load"),  # one router
    (["--mode", "kv", "--opt", "ttl_s=120"], "ttl_s"),  # a count-based run has no clock
    (["--mode", "lora-affinity"], "lora-affinity"),  # nor requests in flight (their adapters)
    (["--mode", "kv-cost", "--opt", "lora_penalty=5"], "lora_penalty"),
    # options that weigh CPU-tier blocks: no tier without --timing, nor with --timing alone
    (["--mode", "kv-cost", "--opt", "host_credit=0.5"], "host_credit"),
    (["--mode", "kv-cost", "--timing", "--opt", "host_credit=0.5"], "host_credit"),
    (["--mode", "kv-events", "--timing", "--opt", "tiers=all"], "tiers"),
    (["--mode", "kv-events", "--timing", "--opt", "tiers=gpu"], "tiers"),  # written at its default: still none
    (["--mode", "weighted", "--opt", "scorers=prefix:1,queue:1"], "queue"),  # no load without --timing
    (["--cpu-capacity", "8"], "--cpu-capacity"),
    (["--cpu-memory-gb", "1"], "--cpu-memory-gb"),
    (["--timing", "--cpu-capacity", "8", "--cpu-memory-gb", "1"], "--cpu-memory-gb"),
    (["--timing", "--pcie-gbps", "10"], "--pcie-gbps"),
    (["--max-loras", "2"], "--max-loras"),  # adapters live on timed workers
    (["--timing", "--max-cpu-loras", "2"], "--max-cpu-loras"),  # without --max-loras: no adapter modelled
    (["--timing", "--max-lora-rank", "8"], "--max-lora-rank"),
    (["--timing", "--lora-disk-gbps", "1"], "--lora-disk-gbps"),
    (["--timing", "--cpu-write", "compute"], "--cpu-write"),
    # SGLang (issue 40): its options with another engine, vLLM's with it, and its own dead combinations
    (["--engine", "sglang"], "--engine"),  # without --timing
    (["--timing", "--page-size", "4"], "--page-size"),
    (["--timing", "--schedule-policy", "fcfs"], "--schedule-policy"),
    (["--timing", "--disable-radix-cache"], "--disable-radix-cache"),
    (["--timing", "--engine", "sglang", "--max-num-seqs", "4"], "--max-num-seqs"),
    (["--timing", "--engine", "sglang", "--max-num-batched-tokens", "8192"], "--max-num-batched-tokens"),
    (["--timing", "--engine", "sglang", "--async-scheduling"], "--async-scheduling"),
    (["--timing", "--engine", "sglang", "--queue-policy", "fcfs"], "--queue-policy"),
    (["--timing", "--engine", "sglang", "--gpu-memory-utilization", "0.8"], "--gpu-memory-utilization"),
    (["--timing", "--engine", "sglang", "--cpu-capacity", "8"], "--cpu-capacity"),
    (["--timing", "--engine", "sglang", "--split", "1:1"], "--split"),
    (["--timing", "--engine", "sglang", "--chunked-prefill-size", "-1", "--enable-mixed-chunk"], "--enable-mixed-chunk"),
    (["--timing", "--engine", "sglang", "--disable-radix-cache", "--schedule-policy", "lpm"], "--schedule-policy"),
    (["--timing", "--engine", "sglang", "--disable-radix-cache", "--schedule-policy", "dfs-weight"], "--schedule-policy"),
    (["--admission", "chunk"], "--admission"),  # the count-based replay has no admission
    (["--async-scheduling"], "--async-scheduling"),  # nor steps to schedule ahead
    (["--queue-policy", "priority"], "--queue-policy"),  # nor queues
    (["--admission-policy", "queue-bound:limit=1"], "--admission-policy"),  # nor a gateway in time
    (["--controller", "none"], "--controller"),  # nor workers joining in time
    (["--timing", "--routers", "2", "--controller", "none"], "--controller"),  # ... of one router
    (["--timing", "--async-scheduling", "--controller", "none"], "--controller"),
    (["--slo", "chat:ttft_ms=1"], "--slo"),  # nor SLOs
    # slo-shed sheds against a class's TTFT SLO: none given (a TPOT one only), it would shed nothing
    (["--timing", "--admission-policy", "slo-shed", "--slo", "chat:tpot_ms=50"], "--admission-policy"),
    (["--timing", "--split", "1:1", "--cpu-capacity", "8"], "--cpu-capacity"),  # a P/D fleet has no CPU tier
    (["--ep", "2"], "--ep"),
    (["--pp", "2"], "--pp"),
    (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype"),
    (["--timing", "--dp-attention"], "--dp-attention"),  # without --ep > 1
    (["--timing", "--model", "qwen3-30b-a3b", "--tp", "2", "--ep", "2", "--dp-attention"], "--dp-attention"),
    # speculative decoding: timed only, on with --spec-tokens K >= 1 and a method
    (["--spec-method", "eagle", "--spec-tokens", "2"], "--spec-method"),
    (["--timing", "--spec-method", "eagle"], "--spec-method"),
    (["--timing", "--spec-tokens", "2"], "--spec-tokens"),
    (["--timing", "--spec-draws", "expected"], "--spec-draws"),
    (["--timing", "--spec-acceptance", "0.5"], "--spec-acceptance"),
    (["--timing", "--spec-method", "eagle", "--spec-tokens", "2", "--spec-model", "qwen3-0.6b"], "--spec-model"),
    (["--timing", "--spec-model", "qwen3-0.6b"], "--spec-model"),
    (["--spec-hash-rule", "drop"], "--spec-hash-rule"),  # untimed
    (["--timing", "--spec-hash-rule", "drop"], "--spec-hash-rule"),  # no speculation
    (["--timing", "--spec-method", "ngram", "--spec-tokens", "2", "--spec-hash-rule", "drop"], "--spec-hash-rule"),
    (["--timing", "--split", "1:1", "--spec-method", "eagle", "--spec-tokens", "2", "--spec-hash-rule", "drop"],
     "--spec-hash-rule"),  # a P/D decode pool keeps plain names (its drop is not modelled)
    # a draft model in a P/D fleet: not modelled (one pool size for prefill and decode workers alike)
    (["--timing", "--split", "1:1", "--spec-method", "draft", "--spec-tokens", "2", "--spec-model", "qwen3-0.6b"],
     "--spec-model"),
    # disaggregated serving: only with --timing, only with a P/D fleet, never with --workers
    (["--prefill-workers", "1", "--decode-workers", "1"], "--prefill-workers"),
    (["--split", "1:1"], "--split"),
    (["--timing", "--link-gbps", "25"], "--link-gbps"),
    (["--price", "table"], "--price"),  # a cost is a timed run's GPU-hours times prices
    (["--spot-discount", "0.5"], "--spot-discount"),
    (["--timing", "--spot-discount", "0"], "--spot-discount"),  # no discount, no --price: no cost asked for
    (["--timing", "--price", "h200=2"], "--price"),  # the run's GPUs are h100s
    (["--timing", "--link-latency-ms", "1"], "--link-latency-ms"),
    (["--timing", "--decode-router", "round-robin"], "--decode-router"),
    (["--timing", "--overlap-transfer"], "--overlap-transfer"),
    (["--timing", "--decode-prefix-cache"], "--decode-prefix-cache"),
    (["--timing", "--split", "2:0", "--link-gbps", "25"], "--link-gbps"),  # P:0 is aggregated
    (["--timing", "--split", "2:2", "--workers", "4"], "--workers"),
    (["--timing", "--prefill-workers", "1", "--decode-workers", "1", "--workers", "3"], "--workers"),
    (["--timing", "--split", "2:2", "--prefill-workers", "1", "--decode-workers", "1"], "--prefill-workers"),
]

LATENCY = ["latency", "--format", "json"]
KV_EVENTS = os.path.join(os.path.dirname(__import__("dynlab").__file__), "data", "fixtures", "kv_events.jsonl")
SWEEP = ["sweep", "--executor", "serial", "--quiet", "--grid", "workers=1,2"]
COMMANDS = {"sim": ["sim"], "compare": ["compare", "--format", "json"], "sweep": SWEEP}

TABLE: dict[tuple[str, str], object] = {}
for name, cmd in COMMANDS.items():
    for flag, case in sim_rows(cmd).items():
        TABLE[(name, flag)] = case
TABLE[("sweep", "--workers")] = changes(["sweep", "--executor", "serial", "--quiet", "--grid", "seed=1,2"],
                                        ["--workers", "3"])  # workers is SWEEP's axis
# rr: kv collapses, and the collapse warning (count-based runs too since issue 43) is not the progress bar
TABLE[("sim", "--quiet")] = on_a_terminal(["sim", "--trace", "mooncake-conversation", "--mode", "rr"])
TABLE[("sim", "--requests-out")] = changes(["sim", "--trace", MOON], ["--requests-out", "r.jsonl"])
# the timeline (docs/report.md): written by a timed run; refused without --timing (SIM_OUTPUT_NO_EFFECT)
TABLE[("sim", "--timeline")] = changes(["sim", "--trace", MOON, "--timing"], ["--timeline", "t.json"])
TABLE[("sim", "--timeline-max-requests")] = swaps(
    ["sim", "--trace", MOON, "--timing", "--timeline", "t.json", "--timeline-max-requests", "1"],
    ["sim", "--trace", MOON, "--timing", "--timeline", "t.json", "--timeline-max-requests", "2"])
# mixed pools (issue 41 item 5; sim and compare): the fleet's second worker on an H200, and the pools section;
# its refusals (without --timing, with --workers/--gpu/--tp, P/D, --controller) are in tests/sim/test_mixed_pools.py
for _name, _cmd in (("sim", ["sim"]), ("compare", ["compare", "--format", "json"])):
    TABLE[(_name, "--pool")] = changes(_cmd + ["--timing", "--trace", MOON],
                                       ["--pool", "h100:tp1:1", "--pool", "h200:tp1:1"])
TABLE[("compare", "--quiet")] = on_a_terminal(["compare", "--trace", "mooncake-conversation", "--format", "json",
                                               "--mode", "rr"])
TABLE.update({
    ("workload", "--out"): lambda run: differ(run("workload", SPEC, "--out", "a.jsonl"),
                                              run("workload", SPEC, "--out", "b.jsonl")),
    ("workload", "--format"): changes(["workload", SPEC, "--out", "a.jsonl"], ["--format", "mooncake"]),
    ("compare", "--format"): swaps(["compare", "--format", "json"], ["compare", "--format", "table"]),
    ("compare", "--plot"): changes(["compare", "--modes", "rr,kv"], ["--plot", "c.png"]),
    ("sweep", "--quiet"): lambda run: (lambda a, b: (a.stderr != "" and b.stderr == "") or pytest.fail("stderr"))(
        run(*SWEEP[:3], *SWEEP[4:]), run(*SWEEP)),
    ("sweep", "--grid"): changes(SWEEP, ["--grid", "mode=rr,kv"]),
    ("sweep", "--grid-file"): lambda run: differ(
        run(*SWEEP[:4], "--grid-file", "g.toml", files={"g.toml": "workers = [1]\n"}),
        run(*SWEEP[:4], "--grid-file", "g.toml", files={"g.toml": "workers = [1, 2]\n"})),
    ("sweep", "--executor"): lambda run: (
        lambda a, b: a.stderr.rstrip().endswith("(serial)") and b.stderr.rstrip().endswith("(local)")
        or pytest.fail(a.stderr + b.stderr))(
        run("sweep", "--executor", "serial", "--grid", "workers=1,2"),
        run("sweep", "--executor", "local", "--jobs", "1", "--grid", "workers=1,2")),
    ("sweep", "--jobs"): refuses(SWEEP + ["--jobs", "2"], "--jobs"),
    ("sweep", "--ray-address"): refuses(SWEEP + ["--ray-address", "127.0.0.1:1"], "--ray-address"),
    ("sweep", "--out"): changes(SWEEP, ["--out", "r.jsonl"]),
    ("sweep", "--resume"): refuses(SWEEP + ["--resume"], "--resume"),
    ("sweep", "--csv"): changes(SWEEP, ["--csv", "r.csv"]),
    ("sweep", "--plot"): changes(SWEEP, ["--plot", "r.png"]),
    ("sweep", "--metric"): refuses(SWEEP + ["--metric", "hit_rate"], "--metric"),
    ("sweep", "--dry-run"): changes(SWEEP, ["--dry-run"]),
    # the document-cache lab
    ("scenario", "--gpu"): changes(["scenario"], ["--gpu", "60000"]),
    ("scenario", "--docs"): changes(["scenario"], ["--docs", "3"]),
    ("scenario", "--tokens"): changes(["scenario"], ["--tokens", "100"]),
    ("scenario", "--passes"): changes(["scenario"], ["--passes", "rev"]),
    ("scenario", "--cpu"): changes(["scenario"], ["--cpu", "60000"]),
    ("scenario", "--policy"): changes(["scenario"], ["--policy", "opt"]),
    ("cliff", "--gpu"): changes(["cliff"], ["--gpu", "10000,60000"]),
    ("cliff", "--cpu"): changes(["cliff"], ["--cpu", "0,60000"]),
    ("cliff", "--docs"): changes(["cliff"], ["--docs", "3"]),
    ("cliff", "--tokens"): changes(["cliff"], ["--tokens", "100"]),
    ("cliff", "--passes"): changes(["cliff"], ["--passes", "fwd"]),
    ("cliff", "--metric"): changes(["cliff"], ["--metric", "misses"]),
    ("cliff", "--policy"): changes(["cliff", "--passes", "fwd,fwd"], ["--policy", "opt"]),
    # listings
    ("strategies", "--verbose"): changes(["strategies"], ["--verbose"]),
    ("strategies", "--json"): changes(["strategies"], ["--json"]),
    ("policies", "--verbose"): changes(["policies"], ["--verbose"]),
    ("policies", "--json"): changes(["policies"], ["--json"]),
    ("plugins", "--json"): changes(["plugins"], ["--json"]),
    # KV transfer cost
    ("disagg", "--tokens"): swaps(["disagg", "--tokens", "10", "--gbps", "1"], ["disagg", "--tokens", "20", "--gbps", "1"]),
    ("disagg", "--gbps"): swaps(["disagg", "--tokens", "10", "--gbps", "1"], ["disagg", "--tokens", "10", "--gbps", "2"]),
    ("disagg", "--model"): changes(["disagg", "--tokens", "10", "--gbps", "1"], ["--model", "llama-3-8b"]),
    ("disagg", "--model-config"): changes(["disagg", "--tokens", "10", "--gbps", "1"], ["--model-config", MODEL]),
    ("disagg", "--layers"): changes(["disagg", "--tokens", "10", "--gbps", "1"], ["--layers", "2"]),
    ("disagg", "--kv-heads"): changes(["disagg", "--tokens", "10", "--gbps", "1"], ["--kv-heads", "2"]),
    ("disagg", "--head-dim"): changes(["disagg", "--tokens", "10", "--gbps", "1"], ["--head-dim", "2"]),
    ("disagg", "--dtype-bytes"): changes(["disagg", "--tokens", "10", "--gbps", "1"], ["--dtype-bytes", "1"]),
    ("disagg", "--prefill-ms"): changes(["disagg", "--tokens", "10", "--gbps", "1"], ["--prefill-ms", "5"]),
    ("disagg", "--overhead-ms"): refuses(["disagg", "--tokens", "10", "--gbps", "1", "--overhead-ms", "5"],
                                         "--overhead-ms"),
    ("disagg", "--saved-ms"): changes(["disagg", "--tokens", "10", "--gbps", "1"], ["--saved-ms", "5"]),
    # measured files
    ("summarize offload", "--base"): changes(["summarize", "offload", OFFLOAD, "-"], ["--base", "other"]),
    ("summarize offload", "--cand"): changes(["summarize", "offload", OFFLOAD, "-"], ["--cand", "other"]),
    # the labs in one command (JSON only: plots are slow to draw)
    ("reproduce", "--force"): lambda run: (lambda a, b: (a.code == 2 and b.code == 0) or pytest.fail(str((a, b))))(
        run("reproduce", ".", "--only", "lab002", "--no-plots"),
        run("reproduce", ".", "--only", "lab002", "--no-plots", "--force")),
    ("reproduce", "--only"): changes(["reproduce", "out", "--no-plots"], ["--only", "lab002"]),
    ("reproduce", "--disagg-file"): changes(["reproduce", "out", "--only", "lab000", "--no-plots"],
                                            ["--disagg-file", DISAGG]),
    ("reproduce", "--offload-file"): changes(["reproduce", "out", "--only", "lab002", "--no-plots"],
                                             ["--offload-file", OFFLOAD]),
    ("reproduce", "--with-samples"): changes(["reproduce", "out", "--only", "lab002", "--no-plots"],
                                             ["--with-samples"]),
    ("events replay", "--block"): changes(["events", "replay", KV_EVENTS], ["--block", "64"]),
    ("latency", "--format"): swaps(LATENCY, ["latency", "--format", "table"]),
    ("latency", "--gpu"): changes(LATENCY, ["--gpu", "h200"]),
    ("latency", "--model"): changes(LATENCY, ["--model", "qwen3-8b"]),
    ("latency", "--tp"): changes(LATENCY, ["--tp", "2"]),
    ("latency", "--ep"): changes(LATENCY + ["--model", "qwen3-30b-a3b", "--tp", "2"], ["--ep", "2"]),
    ("latency", "--pp"): changes(LATENCY, ["--pp", "2"]),
    ("latency", "--dp-attention"): swaps(LATENCY + ["--model", "qwen3-30b-a3b", "--tp", "2", "--ep", "2"],
                                         LATENCY + ["--model", "qwen3-30b-a3b", "--ep", "2", "--dp-attention"]),
    ("latency", "--kv-cache-dtype"): changes(LATENCY, ["--kv-cache-dtype", "fp8"]),
    ("latency", "--latency-model"): changes(LATENCY, ["--latency-model", "linear"]),
    ("latency", "--engine"): changes(LATENCY, ["--engine", "sglang"]),
    ("latency", "--latency-opt"): changes(LATENCY + ["--latency-model", "linear"], ["--latency-opt", "beta0=1"]),
    ("latency", "--list"): changes(LATENCY, ["--list"]),
    ("latency", "--plot"): changes(LATENCY, ["--plot", "l.png"]),
    ("reproduce", "--no-plots"): changes(["reproduce", "out", "--only", "lab002"], ["--no-plots"]),
    # the HTML report (docs/report.md)
    ("sim", "--report"): changes(["sim"], ["--report", "r.html"]),
    ("compare", "--report"): changes(["compare", "--modes", "rr,kv"], ["--report", "r.html"]),
    ("sweep", "--report"): changes(SWEEP, ["--report", "r.html"]),
    ("report", "--out"): lambda run: differ(run("report", RUN, "--out", "a.html"), run("report", RUN, "--out", "-")),
    ("report", "--requests"): changes(["report", RUN, "--out", "a.html"], ["--requests", REQS]),
    ("report", "--title"): changes(["report", RUN, "--out", "a.html"], ["--title", "Fleet"]),
})

# dynlab plan: a 3-request trace, serial replays; options that only change the replays' routing or the
# pool show in the log's results (LOGGED), the others in the printed plan
PLAN = ["plan", "--trace", MOON, "--slo-ttft-ms", "1000", "--executor", "serial", "--quiet", "--format", "json"]
LOGGED = PLAN + ["--log", "p.jsonl"]
TIER = LOGGED + ["--capacity", "8", "--block", "256", "--cpu-memory-gb", "1"]


#: sim's --admission case (three requests at once, a 70-block pool, 64-token chunks) as plan's replays
ADMISSION = LOGGED + ["--rate-scale", "1000", "--modes", "rr", "--capacity", "70", "--block", "16",
                      "--max-num-batched-tokens", "64"]


def plan_differ(a: Out, b: Out) -> None:
    """As :func:`differ`, a plan meeting no target (exit 3, its outputs written) counting as a run."""
    assert a.code in (0, 3) and b.code in (0, 3), (a.stderr, b.stderr)
    assert (a.stdout, a.files) != (b.stdout, b.files)


TABLE.update({
    ("plan", "--model"): changes(PLAN, ["--model", "qwen3-8b"]),
    ("plan", "--gpu"): changes(PLAN, ["--gpu", "h200"]),
    ("plan", "--tp"): changes(PLAN, ["--tp", "2"]),
    # the ep 2 candidate is left out without it (--ep 2 must equal --tp 1), a 2-rank shape with it
    ("plan", "--dp-attention"): changes(PLAN + ["--model", "qwen3-30b-a3b", "--ep", "1,2"], ["--dp-attention"]),
    ("plan", "--mode"): changes(PLAN, ["--modes", "rr"]),
    ("plan", "--cpu-memory-gb"): changes(LOGGED + ["--capacity", "8", "--block", "256"], ["--cpu-memory-gb", "1"]),
    ("plan", "--trace"): swaps(PLAN, ["plan", "--trace", TOKENS, *PLAN[3:]]),
    ("plan", "--trace-format"): lambda run: (lambda a, b: (a.code == 0 and b.code != 0) or pytest.fail(str((a, b))))(
        run(*PLAN, "--trace-format", "mooncake"), run(*PLAN, "--trace-format", "tokens")),
    ("plan", "--block"): changes(["plan", "--trace", TOKENS, *LOGGED[3:]], ["--block", "4"]),
    ("plan", "--hash"): changes(["plan", "--trace", TOKENS, *LOGGED[3:]], ["--hash", "dynamo"]),
    ("plan", "--trace-block"): refuses(["plan", "--trace", TOKENS, *PLAN[3:], "--trace-block", "64"], "--trace-block"),
    ("plan", "--capacity"): changes(LOGGED, ["--capacity", "200"]),
    ("plan", "--max-num-batched-tokens"): changes(PLAN, ["--max-num-batched-tokens", "256"]),
    ("plan", "--max-num-seqs"): changes(PLAN + ["--rate-scale", "1000"], ["--max-num-seqs", "1"]),
    ("plan", "--latency-model"): changes(PLAN, ["--latency-model", "linear"]),
    ("plan", "--latency-opt"): changes(PLAN + ["--latency-model", "linear"], ["--latency-opt", "beta0=1"]),
    ("plan", "--gpu-memory-utilization"): changes(LOGGED, ["--gpu-memory-utilization", "0.5"]),
    ("plan", "--publish"): changes(LOGGED + ["--modes", "kv-events"], ["--publish", "no"]),
    ("plan", "--event-delay-ms"): changes(LOGGED + ["--modes", "kv-events"], ["--event-delay-ms", "60"]),
    ("plan", "--event-loss"): changes(LOGGED + ["--modes", "kv-events"], ["--event-loss", "0.5"]),
    ("plan", "--routers"): changes(LOGGED, ["--routers", "2"]),
    ("plan", "--router-assign"): changes(LOGGED + ["--routers", "2"], ["--router-assign", "hash"]),
    ("plan", "--pcie-gbps"): changes(TIER, ["--pcie-gbps", "1"]),
    ("plan", "--cpu-write"): changes(TIER, ["--cpu-write", "evict"]),
    ("plan", "--admission"): lambda run: plan_differ(run(*ADMISSION), run(*ADMISSION, "--admission", "chunk")),
    # one built-in engine kind: plan checks the name (a third-party kind changes replays, as sim's do)
    # a comma list compares engines: a shape each (tests/test_plan_engines.py derives their answers by hand)
    ("plan", "--engine"): changes(PLAN, ["--engine", "vllm,sglang"]),
    # SGLang's options reach each SGLang replay (its resolved options are in the logged result), as sim's do
    **{("plan", flag): changes(LOGGED + ["--engine", "sglang"], [flag, *value]) for flag, value in (
        ("--max-running-requests", ["1"]), ("--chunked-prefill-size", ["256"]), ("--max-prefill-tokens", ["512"]),
        ("--schedule-policy", ["lof"]), ("--page-size", ["4"]), ("--disable-radix-cache", []),
        ("--enable-mixed-chunk", []), ("--mem-fraction-static", ["0.5"]), ("--schedule-conservativeness", ["0.5"]),
        ("--init-new-token-ratio", ["0.3"]), ("--new-token-ratio-decay-steps", ["10"]))},
    ("plan", "--queue-policy"): changes(["plan", "--trace", PRIO, *LOGGED[3:], "--max-num-seqs", "1"],
                                        ["--queue-policy", "priority-displace"]),
    ("plan", "--admission-policy"): lambda run: plan_differ(run(*ADMISSION),
                                                            run(*ADMISSION, "--admission-policy", "queue-bound:limit=1")),
    ("plan", "--async-scheduling"): lambda run: plan_differ(run(*ADMISSION), run(*ADMISSION, "--async-scheduling")),
    ("plan", "--seed"): changes(LOGGED + ["--modes", "random"], ["--seed", "2"]),
    ("plan", "--slo-ttft-ms"): lambda run: plan_differ(run(*PLAN), run(*PLAN[:3], "--slo-ttft-ms", "10", *PLAN[5:])),
    ("plan", "--slo-tpot-ms"): lambda run: plan_differ(run(*PLAN), run(*PLAN, "--slo-tpot-ms", "1")),
    # the three requests at once (no class named: class default): 1 worker meets TTFT <= 1000 ms (p99 65 ms);
    # default's own 60 ms needs 2 workers, and default is named as the class that binds
    ("plan", "--slo"): lambda run: (lambda a, b: (
        json.loads(a.stdout)["shapes"][0]["workers"] == 1 and json.loads(b.stdout)["shapes"][0]["workers"] == 2
        and json.loads(b.stdout)["shapes"][0]["binding_class"] == "default") or pytest.fail(str((a, b))))(
        run(*PLAN, "--rate-scale", "1000", "--max-workers", "3"),
        run(*PLAN, "--rate-scale", "1000", "--max-workers", "3", "--slo", "default:ttft_ms=60")),
    ("plan", "--rate"): changes(PLAN, ["--rate", "1000"]),
    ("plan", "--rate-scale"): changes(PLAN, ["--rate-scale", "2"]),
    ("plan", "--concurrency"): changes(PLAN, ["--concurrency", "1"]),
    ("plan", "--think-time-ms"): changes(PLAN + ["--concurrency", "1"], ["--think-time-ms", "500"]),
    ("plan", "--requests"): changes(PLAN, ["--requests", "2"]),
    ("plan", "--warmup"): changes(PLAN + ["--concurrency", "1", "--requests", "3"], ["--warmup", "1"]),
    ("plan", "--slo-percentile"): changes(PLAN, ["--slo-percentile", "p50"]),
    ("plan", "--goodput"): changes(PLAN, ["--goodput", "0.5"]),
    ("plan", "--price"): changes(PLAN, ["--price", "h100=2"]),
    # the cost objective prices the shapes at the bundled table's h100 price and says the cheapest and the sources
    ("plan", "--objective"): changes(PLAN, ["--objective", "cost"]),
    # two candidates priced by the table: --mix adds the plan's "mix" (its mixed replays, none cheaper here)
    ("plan", "--mix"): changes(PLAN + ["--objective", "cost", "--gpu", "h100,h200"], ["--mix"]),
    # all three requests at once on one worker miss 30 ms; the floors (alone) meet it
    ("plan", "--max-workers"): lambda run: plan_differ(
        run(*PLAN, "--rate-scale", "1000", "--slo-ttft-ms", "30"),
        run(*PLAN, "--rate-scale", "1000", "--slo-ttft-ms", "30", "--max-workers", "1")),
    # each answered shape replayed again with the controller: the shapes gain their `autoscaled` comparison
    ("plan", "--controller"): changes(PLAN, ["--controller", "static"]),
    ("plan", "--opt"): changes(LOGGED, ["--opt", "temperature=1"]),
    ("plan", "--executor"): lambda run: (
        lambda a, b: "(serial)" in a.stderr and "(local)" in b.stderr or pytest.fail(a.stderr + b.stderr))(
        run("plan", "--trace", MOON, "--slo-ttft-ms", "1000", "--executor", "serial"),
        run("plan", "--trace", MOON, "--slo-ttft-ms", "1000", "--executor", "local", "--jobs", "1")),
    ("plan", "--jobs"): refuses(PLAN + ["--jobs", "2"], "--jobs"),
    # plan's candidate kinds beyond the shapes above, and the options they share (tests/test_plan_candidates.py)
    ("plan", "--workload"): swaps(PLAN, ["plan", "--workload", SPEC, *PLAN[3:]]),
    ("plan", "--tokenizer"): changes(["plan", "--trace", SHAREGPT, *LOGGED[3:]], ["--tokenizer", TOKENIZER]),
    ("plan", "--ep"): changes(PLAN + ["--model", "qwen3-30b-a3b", "--tp", "2"], ["--ep", "2"]),
    ("plan", "--spec-tokens"): swaps(PLAN + ["--spec-method", "ngram", "--spec-tokens", "0,2"],
                                     PLAN + ["--spec-method", "ngram", "--spec-tokens", "0,4"]),
    ("plan", "--spec-method"): swaps(LOGGED + ["--spec-tokens", "2", "--spec-method", "ngram"],
                                     LOGGED + ["--spec-tokens", "2", "--spec-method", "eagle"]),
    ("plan", "--spec-acceptance"): changes(LOGGED + ["--spec-tokens", "2", "--spec-method", "ngram"],
                                           ["--spec-acceptance", "0.1"]),
    ("plan", "--spec-draws"): changes(LOGGED + ["--spec-tokens", "2", "--spec-method", "ngram"],
                                      ["--spec-draws", "expected"]),
    ("plan", "--split"): changes(PLAN, ["--split", "auto"]),
    ("plan", "--decode-router"): changes(LOGGED + ["--split", "auto"], ["--decode-router", "round-robin"]),
    ("plan", "--link-gbps"): changes(LOGGED + ["--split", "auto"], ["--link-gbps", "1"]),
    ("plan", "--link-latency-ms"): changes(LOGGED + ["--split", "auto"], ["--link-latency-ms", "5"]),
    ("plan", "--overlap-transfer"): changes(LOGGED + ["--split", "auto"], ["--overlap-transfer"]),
    ("plan", "--decode-prefix-cache"): changes(LOGGED + ["--split", "auto"], ["--decode-prefix-cache"]),
    ("plan", "--ray-address"): refuses(PLAN + ["--ray-address", "127.0.0.1:1"], "--ray-address"),
    ("plan", "--log"): changes(PLAN, ["--log", "p.jsonl"]),
    ("plan", "--latency-profile"): changes(PLAN, ["--latency-profile", PROFILE]),
    ("latency", "--latency-profile"): changes(["latency", "--format", "json"], ["--latency-profile", PROFILE]),
    ("plan", "--request-overhead-ms"): changes(PLAN, ["--request-overhead-ms", "300"]),
    ("plan", "--detok-us-per-token"): changes(PLAN, ["--detok-us-per-token", "500"]),
    ("plan", "--resume"): refuses(PLAN + ["--resume"], "--resume"),
    ("plan", "--format"): swaps(PLAN, [*PLAN[:-1], "table"]),
    ("plan", "--plot"): changes(PLAN, ["--plot", "p.png"]),
    ("plan", "--report"): changes(PLAN, ["--report", "p.html"]),
    ("plan", "--quiet"): lambda run: (lambda a, b: (a.stderr != "" and b.stderr == "") or pytest.fail("stderr"))(
        run(*[a for a in PLAN if a != "--quiet"]), run(*PLAN)),
})


# ------------------------------------------------------------------------------------------ calibrate
CALIBRATE = ["calibrate", CAL, "--output-format", "json"]


def _wrong_format(run):
    """--format: a points CSV read as guidellm's JSON fails, naming the file; detected, it calibrates."""
    good, bad = run(*CALIBRATE), run(*CALIBRATE, "--format", "guidellm")
    assert good.code == 0 and bad.code != 0 and CAL in bad.stderr, (good, bad)


TABLE.update({
    ("calibrate", "--format"): _wrong_format,
    ("calibrate", "--model"): changes(CALIBRATE, ["--model", "qwen3-8b"]),
    ("calibrate", "--gpu"): changes(CALIBRATE, ["--gpu", "h200"]),
    ("calibrate", "--tp"): changes(CALIBRATE, ["--tp", "2"]),
    ("calibrate", "--concurrency"): refuses(CALIBRATE + ["--concurrency", "2"], "--concurrency"),
    ("calibrate", "--latency-model"): changes(CALIBRATE, ["--latency-model", "roofline"]),
    ("calibrate", "--max-num-seqs"): changes(CALIBRATE, ["--max-num-seqs", "1"]),
    ("calibrate", "--max-num-batched-tokens"): changes(CALIBRATE, ["--max-num-batched-tokens", "16"]),
    ("calibrate", "--engine"): changes(CALIBRATE, ["--engine", "sglang"]),  # the file states none: vLLM by default
    ("calibrate", "--max-running-requests"): changes(CALIBRATE + ["--engine", "sglang"], ["--max-running-requests", "1"]),
    ("calibrate", "--chunked-prefill-size"): changes(CALIBRATE + ["--engine", "sglang"], ["--chunked-prefill-size", "16"]),
    ("calibrate", "--max-prefill-tokens"): changes(CALIBRATE + ["--engine", "sglang"], ["--max-prefill-tokens", "16"]),
    # 0.1873 x 80 GiB less llama-3.1-8b's 14.96 GiB of weights: a pool of ~13 blocks, where 4 users' 72 tokens queue
    ("calibrate", "--mem-fraction-static"): changes(CALIBRATE + ["--engine", "sglang"], ["--mem-fraction-static", "0.1873"]),
    # no replay depends on it (its prompts share no prefix): refused, saying so
    ("calibrate", "--disable-radix-cache"): refuses(CALIBRATE + ["--engine", "sglang", "--disable-radix-cache"],
                                                    "--disable-radix-cache"),
    ("calibrate", "--latency-opt"): changes(CALIBRATE + ["--fit", "beta0,beta2"], ["--latency-opt", "beta1=0.2"]),
    ("calibrate", "--fit"): changes(CALIBRATE, ["--fit", "beta0"]),
    ("calibrate", "--folds"): changes(CALIBRATE, ["--folds", "2"]),
    ("calibrate", "--out"): changes(CALIBRATE, ["--out", "p.json"]),
    ("calibrate", "--output-format"): swaps(CALIBRATE, [*CALIBRATE[:-1], "table"]),
})


def _walk(command: click.Command, path: tuple = ()):
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _walk(sub, path + (name,))
    else:
        yield " ".join(path), command


OPTIONS = sorted((name, p.opts[0]) for name, command in _walk(main) for p in command.params
                 if isinstance(p, click.Option) and p.opts[0] not in ("--help", "--version"))


def test_every_option_has_a_row():
    missing = [f"{name} {flag}" for name, flag in OPTIONS if (name, flag) not in TABLE]
    assert not missing, f"options without a row in TABLE (add a case proving each does something): {missing}"
    stale = [f"{name} {flag}" for name, flag in TABLE if (name, flag) not in OPTIONS]
    assert not stale, f"rows for options that no longer exist: {stale}"


@pytest.fixture
def run(tmp_path, monkeypatch):
    counter = iter(range(10**6))

    def run_(*args, files=None) -> Out:
        where = tmp_path / f"run{next(counter)}"
        where.mkdir()
        monkeypatch.chdir(where)
        for name, text in {**FILES, **(files or {})}.items():
            (where / name).write_text(text)
        before = set(os.listdir(where))
        result = CliRunner().invoke(main, [str(a) for a in args])
        written = {}
        for root, _, names in os.walk(where):
            for n in names:
                path = os.path.join(root, n)
                rel = os.path.relpath(path, where)
                if rel not in before:
                    with open(path, "rb") as fh:
                        written[rel] = fh.read()
        return Out(result.exit_code, result.stdout, result.stderr, written)

    return run_


@pytest.mark.parametrize("name, flag", OPTIONS, ids=[f"{n} {f}" for n, f in OPTIONS])
def test_the_option_does_something_or_is_refused(run, name, flag):
    if (name, flag) not in TABLE:
        pytest.fail(f"no row for {name} {flag}")
    if TABLE[(name, flag)] is not None and "on_a_terminal" in getattr(TABLE[(name, flag)], "__qualname__", "") \
            and sys.platform == "win32":
        pytest.skip("needs a pseudo-terminal")
    TABLE[(name, flag)](run)


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("args, flag", NO_EFFECT, ids=[" ".join(a) for a, _ in NO_EFFECT])
def test_an_option_without_effect_is_refused_alike(run, command, args, flag):
    refused(run(*COMMANDS[command], *args), flag)


def test_unbounded_capacity_is_refused_with_timing_in_a_pd_fleet_and_a_compared_list(run):
    # P/D alike (not in NO_EFFECT: sweep's workers axis clashes with --split first), and one run of a list
    why = "--capacity has no effect as unbounded with --timing"
    for cmd in (["sim"], COMMANDS["compare"]):
        refused(run(*cmd, "--timing", "--split", "1:1", "--capacity", "unbounded"), why)
    refused(run(*COMMANDS["compare"], "--timing", "--capacity", "8,unbounded"), why)


def test_a_controller_names_the_pool_it_bounds_in_a_pd_fleet(run):
    # a P/D fleet's decode pool scales (dynlab.disagg.elastic): its bounds are decode_min= and decode_max=, whatever
    # the autoscaler (not in NO_EFFECT: sweep's workers axis clashes with --split first)
    for cmd in (["sim"], COMMANDS["compare"]):
        refused(run(*cmd, "--timing", "--split", "1:1", "--controller", "hpa:target=1,max=4"),
                "--controller has no effect as max= with a P/D split")
        refused(run(*cmd, "--timing", "--split", "1:1", "--controller", "dynamo-throughput:max=4"),
                "--controller has no effect as max= with a P/D split")


def test_a_refusal_names_the_flag_as_typed():
    # each SimConfig field a sim option sets is named in refusals by that option's own flag
    from dataclasses import fields

    from dynlab.engine.config import SimConfig
    from dynlab.engine.option_rules import _flag

    field_of = {"latency_opt": "latency_opts", "opt": "opts"}  # repeatable options fill a mapping field
    names = {f.name for f in fields(SimConfig)}
    params = [p for p in main.commands["sim"].params if field_of.get(p.name, p.name) in names]
    assert {p.name for p in params} >= {"latency_opt", "opt", "trace", "cpu_memory_gb"}
    for p in params:
        assert _flag(field_of.get(p.name, p.name)) in p.opts, (p.name, p.opts)
    out = CliRunner().invoke(main, ["sim", "--latency-opt", "beta0=3"])
    assert out.exit_code == 2 and "--latency-opt " in out.stderr and "--latency-opts" not in out.stderr, out.stderr


# one wording for every refusal: "--NAME has no effect WHY" ("option 'NAME'" / "scorer 'NAME'" for
# --opt values); the one row that is another error: rr declares no option 'temperature' at all
@pytest.mark.parametrize("args, flag", [(a, f) for a, f in NO_EFFECT if f != "temperature"],
                         ids=[" ".join(a) for a, f in NO_EFFECT if f != "temperature"])
def test_every_refusal_says_has_no_effect(run, args, flag):
    import re

    out = run("sim", *args)
    refused(out, flag)
    assert re.search(rf"{re.escape(flag)}'? has no effect\b", out.stderr), out.stderr
    assert "only applies" not in out.stderr and "needs --timing" not in out.stderr


# ------------------------------------------------------------------ the block size a run used (block_tokens)
def test_a_trace_run_says_its_block_size(run):
    # Mooncake ids name 512-token blocks; a token trace is hashed at --block (4 here); the synthetic
    # workload with --all-metrics at the default 16
    moon = json.loads(run("sim", "--trace", MOON).stdout)
    assert moon["block_tokens"] == 512
    tokens = run("sim", "--trace", "t.jsonl", "--block", "4", files={"t.jsonl": '{"tokens": [1, 2, 3, 4, 5]}\n'})
    assert json.loads(tokens.stdout)["block_tokens"] == 4
    assert json.loads(run("sim", "--all-metrics").stdout)["block_tokens"] == 16
    # the seed's kv output keeps exactly its keys (the lab fixes them); the default kv-cost learns from KV
    # events, and a run of such a strategy says whether they were published
    seed_keys = ["mode", "workers", "requests", "repeat_requests", "hits", "hit_rate"]
    assert list(json.loads(run("sim", "--mode", "kv").stdout)) == seed_keys
    assert list(json.loads(run("sim").stdout)) == seed_keys + ["publish"]


def test_compare_and_sweep_agree_on_an_option_a_strategy_lacks(run):
    # kv-cost has temperature, rr does not: both commands refuse, naming the strategy and the option
    a = run("compare", "--modes", "kv-cost,rr", "--opt", "temperature=0.5")
    b = run("sweep", "--grid", "mode=kv-cost,rr", "--opt", "temperature=0.5", "--dry-run")
    for out in (a, b):
        refused(out, "temperature")
        assert "'rr'" in out.stderr
    # where every compared strategy has it, it applies
    assert run("compare", "--modes", "kv-cost", "--opt", "temperature=0.5").code == 0


def test_the_issue_example_block_is_refused(run):
    # the issue's 64-token trace: --block cannot make the count-based replay read 64-token blocks
    text = ('{"timestamp": 0, "input_length": 200, "output_length": 10, "hash_ids": [1, 2, 3, 4]}\n'
            '{"timestamp": 10000, "input_length": 200, "output_length": 10, "hash_ids": [1, 2, 5, 6]}\n')
    out = run("sim", "--trace", "t.jsonl", "--workers", "1", "--block", "64", files={"t.jsonl": text})
    refused(out, "--block")
    assert "512-token blocks" in out.stderr


# sim's output options that are not SimConfig fields (dynlab.engine.option_rules._output_rules): sim only
SIM_OUTPUT_NO_EFFECT = [
    (["--trace", MOON, "--timeline", "t.json"], "--timeline"),
    (["--trace", MOON, "--timing", "--timeline-max-requests", "5"], "--timeline-max-requests"),
    (["--trace", MOON, "--timing", "--timeline-max-requests", "1000"], "--timeline-max-requests"),  # at its default
]


@pytest.mark.parametrize("args, flag", SIM_OUTPUT_NO_EFFECT, ids=[" ".join(a) for a, _ in SIM_OUTPUT_NO_EFFECT])
def test_a_sim_output_without_effect_is_refused(run, args, flag):
    out = run("sim", *args)
    refused(out, flag)
    assert f"{flag} has no effect" in out.stderr and not out.files, out
