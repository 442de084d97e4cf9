"""``dynlab sim``, ``dynlab compare`` and ``dynlab strategies``."""
from __future__ import annotations

import math
import re
import random
import sys
from dataclasses import replace

import click

from dynlab import limits, plugins
from dynlab.cli import main
from dynlab.latency.overheads import DETOK_US_PER_TOKEN, FRONT_END_MS
from dynlab.cli.common import (INPUT_FIELDS, claim_inputs, echo_table_or_json, input_path, json_text, output_path,
                               parse_opts, progress_bar, refuse_repeats, split_list, stream_output_path, write_atomic)
from dynlab.engine.config import POISSON_RATE
from dynlab.engine.lora import DISK_GBPS
from dynlab.engine.config import SimConfig
from dynlab.engine.run import build_strategy
from dynlab.sim.runner import run
from dynlab.cli.report import report_option, timeline_options, usage_recorder, write_run_report


class CapacityType(click.ParamType):
    """Blocks per worker: an int >= 0, or ``unbounded``."""

    name = "BLOCKS|unbounded"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, int):
            return value
        if str(value).strip().lower() in ("unbounded", "none", "inf"):
            return None
        try:
            v = int(value)
        except ValueError:
            self.fail(f"{value!r} is not an integer or 'unbounded'", param, ctx)
        if v < 0:
            self.fail(f"{v} is negative", param, ctx)
        return v


class FiniteFloat(click.FloatRange):
    """A float range that also refuses NaN and infinities."""

    def convert(self, value, param, ctx):
        v = super().convert(value, param, ctx)
        if not math.isfinite(v):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return v


class RegistryName(click.ParamType):
    """A name from a plugin registry; unknown names are usage errors that list the known ones.

    A default (a built-in's name) is not looked up here: the run looks it up where it needs it, so
    a command that never uses the registry (``--latency-model`` in a count-based run) does not
    import its plugins' modules at start-up.
    """

    def __init__(self, kind: str, registry_fn):
        self.name = kind
        self._registry_fn = registry_fn

    def convert(self, value, param, ctx):
        if param is not None and ctx is not None and value == param.default and \
                ctx.get_parameter_source(param.name) is click.core.ParameterSource.DEFAULT:
            return value  # the option's own default, not given (a grid cell's value is checked: sweep)
        registry = self._registry_fn()
        if value not in registry:
            listed = isinstance(value, str) and "," in value and all(v.strip() in registry for v in value.split(","))
            hint = "; a comma list compares them: dynlab compare (or a sweep's --grid)" if listed else ""
            self.fail(f"unknown {self.name} {value!r}; available: {', '.join(registry.names())}{hint}", param, ctx)
        return value


class CheckedText(click.ParamType):
    """Text that ``check(text)`` accepts (it raises ``ValueError``, one line, for a bad one); ``name``: its form."""

    def __init__(self, name: str, check):
        self.name, self.check = name, check

    def convert(self, value, param, ctx):
        if param is not None and ctx is not None and value == param.default and \
                ctx.get_parameter_source(param.name) is click.core.ParameterSource.DEFAULT:
            return value  # the option's own default, not given (a count-based run imports no run layer)
        try:
            self.check(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return value


def _class_slos(text: str) -> None:
    from dynlab.engine.class_metrics import parse_class_slos

    parse_class_slos(text)


def _admission_policy(text: str) -> None:  # checked as the run will build it (name and options)
    from dynlab.sim.drive import build_policy

    build_policy(text)


def _prices(text: str) -> None:  # checked as the run will read it (GPU=USD items)
    from dynlab.models.prices import parse_prices

    parse_prices(text)


def _controller(text: str) -> None:  # checked as the run will build it (name and options)
    from dynlab.sim.control import build_controller

    build_controller(text)


#: the options whose values hold commas of their own: compare takes one value of each, sweep's --grid none
OWN_COMMAS = ("spec_acceptance", "admission_policy", "slo_classes", "controller", "price")

# (flags, field, type, sim default, help). compare takes the same flags with comma lists.
SIM_OPTIONS = [
    (("--mode", "--modes"), "mode", RegistryName("strategy", plugins.strategies), "kv-cost",
     "Routing strategy (see `dynlab strategies`)."),
    (("--workers",), "workers", click.IntRange(min=1), 2,
     f"Number of workers (at most {limits.MAX_WORKERS:,}; see docs/limits.md)."),
    (("--prefixes",), "prefixes", click.IntRange(min=0), 12,
     f"Synthetic workload (no --trace): distinct prefixes (prefixes x reps at most {limits.MAX_SEED_REQUESTS:,} requests "
     f"and {limits.MAX_SEED_BLOCKS:,} full blocks)."),
    (("--reps",), "reps", click.IntRange(min=0), 6, "Synthetic workload: requests per prefix."),
    (("--plen",), "plen", click.IntRange(min=0), 96,
     f"Synthetic workload: prefix length in tokens (plen + tail at most {limits.MAX_PROMPT_TOKENS:,})."),
    (("--tail",), "tail", click.IntRange(min=0), 16, "Synthetic workload: per-request tail in tokens."),
    (("--seed",), "seed", click.INT, 1, "Seed of the run's RNG (shuffle, random choices)."),
    (("--block",), "block", click.IntRange(min=1), 16, "Tokens per block when hashing tokens."),
    (("--hash",), "hash", click.Choice(["dynlab", "dynamo"]), "dynlab",
     "Block names of hashed tokens: dynlab's, or NVIDIA Dynamo's (xxh3, see docs/events.md)."),
    (("--publish",), "publish", click.Choice(["yes", "no"]), "yes", "Workers publish KV events."),
    (("--capacity",), "capacity", CapacityType(), None, "KV blocks per worker (0: a cache that holds nothing; with --timing at least 1, not unbounded) [default: unbounded; with --timing derived from the GPU memory]."),
    (("--policy",), "policy", RegistryName("eviction policy", plugins.eviction_policies), "lru",
     "Eviction policy of bounded caches (see `dynlab policies`)."),
    (("--event-delay",), "event_delay", click.IntRange(min=0), 0,
     "Deliver request i's KV events before request i+1+K is routed."),
    (("--event-loss",), "event_loss", FiniteFloat(0.0, 1.0), 0.0, "Drop each KV event with this probability."),
    (("--routers",), "routers", click.IntRange(min=1), 1,
     "Router replicas: independent instances of the strategy, each with its own index and load view; "
     "every replica receives every KV event (see docs/routing.md)."),
    (("--router-assign",), "router_assign", click.Choice(["rr", "hash"]), "rr",
     "With --routers > 1: requests reach the replicas round robin, or by a hash of the session "
     "(the request's first block name)."),
    (("--trace",), "trace", click.STRING, None,
     "A bundled trace (mooncake-conversation: 12031 requests of Mooncake's public conversation trace), "
     "a path to a JSONL trace (.gz read as gzip) or - for stdin. Rows must be in time order: a trace "
     "whose timestamps go backwards, or that gives some rows a timestamp and others none, is refused "
     "with FILE:LINE (the trace is streamed, not sorted)."),
    (("--trace-format",), "trace_format", RegistryName("trace format", plugins.trace_formats), None,
     "Trace format [default: detected from the first line]."),
    (("--time-scale",), "time_scale", FiniteFloat(min=0, min_open=True), 1.0,
     "With --timing: multiply trace timestamps (0.5 = twice the rate)."),
    (("--rate",), "rate", FiniteFloat(min=0, min_open=True), None,
     f"With --timing: requests/s. On a trace with timestamps it rescales time so the mean arrival rate is "
     f"RATE (see docs/workloads.md); for workloads without timestamps, their Poisson arrivals "
     f"[default: the trace's own rate; {POISSON_RATE:g} for Poisson arrivals]."),
    (("--rate-scale",), "rate_scale", FiniteFloat(min=0, min_open=True), None,
     "With --timing: X times the trace's own arrival rate (the same as --time-scale 1/X; give one)."),
    (("--duration",), "duration", FiniteFloat(min=0, min_open=True), None,
     "Seconds of arrivals from the first: a longer trace is cut, a shorter one looped (repeats are new "
     "traffic, see --duration-repeat) [default: the whole trace]."),
    (("--duration-repeat",), "duration_repeat", click.Choice(["new", "same"]), "new",
     "With --duration: a looped trace's repeats get new block names (new traffic) or keep them (the same "
     "prompts again)."),
    (("--concurrency",), "concurrency", click.IntRange(min=1), None,
     "With --timing: closed loop, as benchmark clients drive a server (vllm bench serve --max-concurrency): "
     "C users each send the workload's next request when their previous one finished (timestamps ignored; "
     "see docs/workloads.md) [default: open loop, at the trace's times or --rate]."),
    (("--think-time-ms",), "think_time_ms", FiniteFloat(min=0), 0.0,
     "With --concurrency: a user's pause between its answer's last token and its next request (ms)."),
    (("--requests",), "num_requests", click.IntRange(min=1), None,
     "With --timing: serve the workload's first N requests [default: all]."),
    (("--warmup",), "warmup", click.IntRange(min=0), 0,
     "With --timing: leave the first N requests out of the serving metrics, as benchmark clients' "
     "warm-up requests (they still load the caches)."),
    (("--workload",), "workload", click.STRING, None,
     "A workload spec file (JSON, or YAML with PyYAML) generated instead of a trace (see docs/workloads.md)."),
    (("--tokenizer",), "tokenizer", click.STRING, None,
     "A tokenizer.json (Hugging Face tokenizers) that turns the text of ShareGPT and aiperf traces into "
     "tokens [default: an approximation, see docs/workloads.md]."),
    (("--trace-block",), "trace_block", click.IntRange(min=1), None,
     "Tokens per trace block of a trace that names its own blocks (a Mooncake trace recorded at 16-token "
     "blocks: 16); a timed run maps them onto --block engine blocks [default: the format's, 512 for mooncake]."),
    (("--max-num-batched-tokens",), "max_num_batched_tokens", click.IntRange(min=1), 8192,
     "With --timing: token budget of one engine step (vLLM's)."),
    (("--max-num-seqs",), "max_num_seqs", click.IntRange(min=1), 256,
     "With --timing: running requests per engine at most (vLLM's)."),
    (("--latency-model",), "latency_model", RegistryName("latency model", plugins.latency_models), "roofline",
     "With --timing: step latency model (see `dynlab latency --list`)."),
    (("--latency-profile",), "latency_profile", click.STRING, None,
     "With --timing: a calibration profile from `dynlab calibrate` (JSON): its latency model and fitted options, "
     "and each figure's cross-validated error (error_band_pct)."),
    (("--request-overhead-ms",), "request_overhead_ms", FiniteFloat(min=0), FRONT_END_MS,
     "With --timing: the server's front end per request (HTTP, tokenisation, first stream chunk) before the "
     "engine sees it, added to every TTFT and E2E; default BLIS's, measured on vLLM (0: off; fit it with "
     "dynlab calibrate)."),
    (("--detok-us-per-token",), "detok_us_per_token", FiniteFloat(min=0), DETOK_US_PER_TOKEN,
     "With --timing: detokenisation and streaming per output token in us, added to each token's arrival at "
     "the client (TTFT, TPOT, ITL, E2E); default BLIS's, measured on vLLM (0: off)."),
    (("--model",), "model", click.STRING, "llama-3.1-8b",
     "With --timing: served model, a bundled name (see `dynlab models`), a config.json path or a model "
     "directory holding one."),
    (("--gpu",), "gpu", click.STRING, "h100", "With --timing: GPU of each worker (see `dynlab latency --list`), or a GPU file "
     "(JSON; docs/latency.md)."),
    (("--tp",), "tp", click.IntRange(min=1), 1, "With --timing: GPUs per worker (tensor parallel)."),
    (("--gpu-memory-utilization",), "gpu_memory_utilization", FiniteFloat(0.0, 1.0, min_open=True), 0.9,
     "With --timing: share of GPU memory for weights and KV (vLLM's); sizes the pool without --capacity."),
    (("--event-delay-ms",), "event_delay_ms", FiniteFloat(min=0), 0.0,
     "With --timing: KV events reach the router this many ms after they happen."),
    (("--slo-ttft-ms",), "slo_ttft_ms", FiniteFloat(min=0), None, "With --timing: TTFT SLO for goodput."),
    (("--slo-tpot-ms",), "slo_tpot_ms", FiniteFloat(min=0), None, "With --timing: TPOT SLO for goodput."),
    (("--slo",), "slo_classes", CheckedText("CLASS:ttft_ms=X,tpot_ms=Y;...", _class_slos), None,
     "With --timing: SLOs of a request class (its trace field `class`), CLASS:ttft_ms=X,tpot_ms=Y, several classes "
     "apart by ';'; a class's requests meet its own SLOs in goodput and by_class (see docs/classes.md)."),
    (("--cpu-capacity",), "cpu_capacity", click.IntRange(min=0), None,
     "With --timing: KV blocks per worker in a CPU (host memory) tier behind the GPU pool, LRU; blocks are "
     "written there (see --cpu-write) and loaded back over PCIe on a prefix hit (see docs/tiers.md) "
     "[default: no tier]."),
    (("--cpu-memory-gb",), "cpu_memory_gb", FiniteFloat(min=0), None,
     "With --timing: the CPU tier sized in GB of host memory per worker, with the model's KV bytes per block "
     "(0: no tier; a value > 0 must hold one block) [default: no tier]."),
    (("--pcie-gbps",), "pcie_gbps", FiniteFloat(min=0, min_open=True), 25.0,
     "With --timing and a CPU tier or --max-loras: GB/s per direction between host and each GPU (PCIe Gen4 x16 "
     "in practice)."),
    (("--cpu-write",), "cpu_write", click.Choice(["evict", "compute"]), "compute",
     "With --timing and a CPU tier: when a block is written there: when it is computed (write-through, as "
     "vLLM's OffloadingConnector, LMCache and the cache lab's TwoTierCache store) or when the GPU evicts it "
     "(a victim tier)."),
    (("--admission",), "admission", click.Choice(["full", "chunk"]), "full",
     "With --timing: admit a waiting request only when the blocks of its whole sequence are free (full, "
     "vLLM 0.33.0's default scheduler_reserve_full_isl) or those of the chunk scheduled now (chunk, the "
     "rule of the vLLM releases before it)."),
    (("--admission-policy",), "admission_policy", CheckedText("NAME:KEY=VALUE,...", _admission_policy), "always",
     "With --timing: the gateway before the router: always (every request enters), queue-bound:limit=N,limit.CLASS=N "
     "(shed a request when its class has N queued: admitted, no first token yet) or token-bucket:rate=R,burst=B,"
     "rate.TENANT=R (per tenant, R requests/s with bursts of B); a shed request is never served and counts against "
     "goodput (see docs/engine.md and `dynlab plugins`)."),
    (("--controller",), "controller", CheckedText("NAME:KEY=VALUE,...", _controller), "none",
     "With --timing: what adds and retires workers during the run (with --split P:D, the decode pool's: bounds "
     "decode_min=, decode_max=), called every period=S "
     "seconds (default 1; hpa 15, dynamo-load 5, dynamo-throughput 180): none (a fixed fleet), static, "
     "hpa:metric=queue|running|kv,target=X,max=N (Kubernetes' HPA, with cold starts), dynamo-load:ttft=MS,itl=MS "
     "(NVIDIA Dynamo Planner's load-based mode), dynamo-throughput:ttft=MS,itl=MS (its throughput-based mode) or a "
     "controller plugin's NAME:period=S,...; every controller also takes scrape_delay_s and discovery_delay_s; the result then lists "
     "each worker's lifetime and the GPU-hours (see docs/autoscaling.md and `dynlab plugins`)."),
    (("--price",), "price", CheckedText("table|GPU=USD,...", _prices), None,
     "With --timing: price the run's GPU-hours: table (the bundled on-demand list prices, dated and sourced: "
     "docs/cost.md) or GPU=USD[,GPU=USD] (USD per GPU-hour, over the table's); the result then adds gpu_hours, "
     "cost_usd and price_source [default: no cost]."),
    (("--spot-discount",), "spot_discount", FiniteFloat(0.0, 1.0, max_open=True), 0.0,
     "With --timing: the fraction off the on-demand price (0 <= F < 1), your assumption of a spot or committed "
     "discount (none is bundled); prices the run as --price table does when --price is not given."),
    (("--engine",), "engine_kind", RegistryName("engine kind", plugins.engine_kinds), "vllm",
     "With --timing: what each worker is: vllm (vLLM 0.33's scheduler and KV cache manager; --async-scheduling "
     "is its AsyncScheduler) or sglang (SGLang 0.5.23's scheduler and radix cache, set by the SGLang options "
     "below; see docs/engine.md); see `dynlab plugins`."),
    (("--queue-policy",), "queue_policy", RegistryName("queue policy", plugins.queue_policies), "fcfs",
     "With --timing: the order of each engine's waiting queue and whom it preempts: fcfs (vLLM's default), "
     "priority (vLLM 0.33's --scheduling-policy priority: by the requests' priority attribute, lower first) "
     "or priority-displace (vLLM PR #54530: a more important request also displaces a runner at "
     "--max-num-seqs); see `dynlab plugins`."),
    # LoRA adapters on the workers (issue 42; dynlab.engine.lora, docs/classes.md)
    (("--max-loras",), "max_loras", click.IntRange(min=1), None,
     "With --timing: LoRA adapters in each worker's GPU slots, and distinct adapters a step may hold (vLLM's "
     "--max-loras; a request names its adapter by its lora_name); loads delay steps by bytes / bandwidth (see "
     "docs/classes.md) [default: adapters not modelled]."),
    (("--max-cpu-loras",), "max_cpu_loras", click.IntRange(min=1), None,
     "With --max-loras: adapters each worker keeps in host memory, loaded to a GPU slot over --pcie-gbps "
     "instead of from disk (vLLM's --max-cpu-loras, >= --max-loras) [default: --max-loras]."),
    (("--max-lora-rank",), "max_lora_rank", click.IntRange(min=1), 16,
     "With --max-loras: the adapters' rank (vLLM's --max-lora-rank: 1, 8, 16, 32, 64, 128, 256, 320 or 512), "
     "which sizes the bytes each load moves."),
    (("--lora-disk-gbps",), "lora_disk_gbps", FiniteFloat(min=0, min_open=True), DISK_GBPS,
     "With --max-loras: GB/s a worker reads an adapter from disk at when host memory lacks it (default: a PCIe "
     "4.0 x4 NVMe drive's link, an upper bound)."),
    # SGLang's options (issue 40, --engine sglang; dynlab.engine.sglang), under SGLang's names and defaults
    (("--max-running-requests",), "max_running_requests", click.IntRange(min=1), None,
     "With --engine sglang: running requests per worker at most (SGLang's) [default: SGLang's rule from the "
     "pool's tokens and the model's context length, 2048 for most]."),
    (("--chunked-prefill-size",), "chunked_prefill_size", click.IntRange(min=-1), None,
     "With --engine sglang: tokens of a prefill chunk at most (SGLang's; -1: no chunking) [default: by the "
     "GPU's memory, 8192 on an H100]."),
    (("--max-prefill-tokens",), "max_prefill_tokens", click.IntRange(min=1), 16384,
     "With --engine sglang: tokens of one prefill pass at most (SGLang's)."),
    (("--schedule-policy",), "schedule_policy", click.Choice(["fcfs", "lpm", "dfs-weight", "lof", "random"]), "fcfs",
     "With --engine sglang: the waiting queue's order (SGLang's): fcfs, lpm (longest cached prefix first; "
     "fcfs above 128 waiting), dfs-weight (depth first through the radix tree, the subtree with more waiting "
     "requests first), lof (longest output first) or random."),
    (("--page-size",), "page_size", click.IntRange(min=1), 1,
     "With --engine sglang: tokens per KV page (SGLang's); must divide --block."),
    (("--mem-fraction-static",), "mem_fraction_static", FiniteFloat(0.0, 1.0, min_open=True), None,
     "With --engine sglang: share of GPU memory for weights and KV (SGLang's); sizes the pool without "
     "--capacity [default: vLLM's 0.9 rule, see docs/engine.md]."),
    (("--schedule-conservativeness",), "schedule_conservativeness", FiniteFloat(min=0, min_open=True), 1.0,
     "With --engine sglang: scales the initial new-token ratio (SGLang's; larger admits fewer requests)."),
    (("--init-new-token-ratio",), "init_new_token_ratio", FiniteFloat(min=0, min_open=True), 0.7,
     "With --engine sglang: the share of its remaining output each running request reserves at admission "
     "(SGLang's SGLANG_INIT_NEW_TOKEN_RATIO)."),
    (("--new-token-ratio-decay-steps",), "new_token_ratio_decay_steps", click.IntRange(min=1), 600,
     "With --engine sglang: decode passes for the new-token ratio to decay to its floor (SGLang's "
     "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS)."),
    (("--prefill-workers",), "prefill_workers", click.IntRange(min=1), None,
     "With --timing: disaggregated serving, prefill workers (with --decode-workers, instead of --workers; "
     "see docs/disagg.md)."),
    (("--decode-workers",), "decode_workers", click.IntRange(min=1), None,
     "With --timing: disaggregated serving, decode workers (with --prefill-workers)."),
    (("--split",), "split", click.STRING, None,
     "With --timing: the fleet as P:D prefill:decode workers (P:0 = P aggregated workers), instead of "
     "--workers; a comma list in compare (--split 8:0,6:2,4:4) compares splits at a fixed GPU count."),
    (("--decode-router",), "decode_router", click.Choice(["least-loaded", "round-robin", "kv-usage"]),
     "least-loaded", "With a P/D fleet: how a prefilled request picks its decode worker."),
    (("--link-gbps",), "link_gbps", FiniteFloat(min=0, min_open=True), 50.0,
     "With a P/D fleet: KV transfer bandwidth per prefill worker, GB/s (50 = one 400 Gb/s NIC); "
     "transfers from one worker share it first come first served."),
    (("--link-latency-ms",), "link_latency_ms", FiniteFloat(min=0), 0.0,
     "With a P/D fleet: latency added to each KV transfer (ms)."),
    # models helper (issue 25): a worker's parallelism and KV dtype (dynlab.models.parallel)
    (("--ep",), "ep", click.IntRange(min=1), 1,
     "With --timing: expert-parallel GPUs per worker (the routed experts divided among them; = --tp, or "
     "--tp x attention replicas with --dp-attention)."),
    (("--pp",), "pp", click.IntRange(min=1), 1,
     "With --timing: pipeline stages per worker (layers split into consecutive stages)."),
    (("--kv-cache-dtype",), "kv_cache_dtype", click.Choice(["auto", "fp8"]), "auto",
     "With --timing: KV cache element type (vLLM's): the model's dtype, or one byte (fp8)."),
    # spec helper (issue 26): speculative decoding (dynlab.engine.spec, docs/engine.md)
    (("--spec-method",), "spec_method", click.Choice(["ngram", "eagle", "eagle3", "mtp", "draft"]), None,
     "With --timing and --spec-tokens: speculative decoding's drafter (vLLM's SpeculativeConfig.method; "
     "draft = a draft model) [default: off]."),
    (("--spec-tokens",), "spec_tokens", click.IntRange(min=0), 0,
     "With --timing and --spec-method: draft tokens K per decode step (vLLM's num_speculative_tokens; "
     "0: off; compare --spec-tokens 0,2,4 compares against no speculation; below --max-num-batched-tokens, "
     "as vLLM requires, and at most 10,000,000, see docs/limits.md)."),
    (("--spec-acceptance",), "spec_acceptance", click.STRING, None,
     "With --spec-tokens: per-position acceptance rates 0.8,0.6,0.4 (as vLLM reports them), one rate "
     "per token (0.7), or file:PATH of measured acceptance lengths [default: the method's, see docs/engine.md]."),
    (("--spec-draws",), "spec_draws", click.Choice(["seeded", "expected"]), "seeded",
     "With --spec-tokens: accepted drafts drawn at random (seeded by --seed, per request) or as their "
     "expected value (smooth sweeps)."),
    (("--spec-model",), "spec_model", click.STRING, None,
     "With --spec-method draft: the draft model (a bundled model name or a config.json path), its K "
     "steps priced with its own config through the roofline [default: a tenth of the target's step]."),
    (("--spec-hash-rule",), "spec_hash_rule", click.Choice(["lookahead", "drop"]), "lookahead",
     "With --spec-method eagle|eagle3|mtp: how prefix caching stays exact (vLLM 0.33): lookahead (a block's "
     "name covers the token after it) or drop (vLLM's disable_lookahead_block_hashes: plain names, a prefix "
     "hit's last block dropped, a window group's hit needing its window plus that block)."),
]

# on/off flags of sim, compare and sweep that are SimConfig fields (compare and sweep apply them to every run)
SIM_FLAGS = [
    ("--overlap-transfer", "overlap_transfer",
     "With a P/D fleet: pipeline the KV transfer with the prefill layer by layer (as NIXL-based connectors do); "
     "without it the transfer starts when the prefill ends."),
    ("--decode-prefix-cache", "decode_prefix_cache",
     "With a P/D fleet: decode workers cache prompt blocks; blocks they hold are not transferred again."),
    ("--async-scheduling/--no-async-scheduling", "async_scheduling",
     "With --timing: schedule each step while the one before it runs, as vLLM's AsyncScheduler (its default "
     "on GPUs): requests join a step later, finished requests free their blocks a step later (see "
     "docs/engine.md) [default: off]."),
    ("--disable-radix-cache", "disable_radix_cache",
     "With --engine sglang: no prefix cache (SGLang's): nothing is matched, cached or published."),
    ("--enable-mixed-chunk", "enable_mixed_chunk",
     "With --engine sglang: the running requests decode inside each chunked prefill pass (SGLang's), instead "
     "of a decode pass of their own."),
    ("--keep-failed", "keep_failed",
     "With a BurstGPT --trace: replay its failed requests (Response tokens 0), which are skipped by default (as "
     "vLLM's loader drops them), as prompts without an answer: prefilled, no output token counted (see "
     "docs/workloads.md)."),
    ("--dp-attention", "dp_attention",
     "With --timing and --ep > 1: attention data-parallel (DeepSeek-style): --ep / --tp attention ranks per "
     "worker, each its own scheduler, KV pool (the worker's / ranks) and prefix cache, routed to one by one, "
     "stepping in lockstep through the shared expert GPUs (see docs/engine.md)."),
]


def pool_option(fn):
    """``--pool GPU:tpN:COUNT``, repeatable (sim and compare): a mixed fleet (:mod:`dynlab.engine.pools`)."""
    return click.option("--pool", "pools", multiple=True, metavar="[ROLE:]GPU:tpN:COUNT",
                        help="With --timing: a pool of COUNT workers of GPU at tp N GPUs each, instead of --workers, "
                             "--gpu and --tp; repeatable (--pool h100:tp1:4 --pool h200:tp2:2), worker ids in pool "
                             "order; prefill:/decode: before each of two pools makes a P/D fleet on two GPUs; the "
                             "result has each pool's figures (see docs/engine.md).")(fn)


def given_fields(ctx: click.Context) -> set[str]:
    """The :class:`SimConfig` fields the user wrote on the command line (or in the environment)."""
    from click.core import ParameterSource

    return {p.name for p in ctx.command.params
            if ctx.get_parameter_source(p.name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}


def check_options(config: SimConfig, given, requests=None) -> None:
    """Usage error (exit 2) for an option that has no effect in ``config``
    (:func:`dynlab.engine.option_rules.check_effective`); ``given``: the fields the user wrote.

    ``--block`` needs the trace's format: read from the loaded ``requests``, else from the
    trace's first line (stdin cannot be read twice: :func:`run` then refuses a non-default value).
    """
    from dynlab.engine.option_rules import check_effective

    own = None
    if config.trace is not None and ("block" in given or config.block != SimConfig.block):
        if requests is not None:
            own = getattr(requests, "own_block_tokens", None)
        elif config.trace != "-":
            from dynlab.traces.reader import own_block_tokens

            own = own_block_tokens(config.trace, config.trace_format, config.block)
    try:
        config.validate()
        check_effective(config, given, own)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _run(config: SimConfig, quiet: bool, requests=None, recorders=()) -> dict:
    try:
        result = run(config, progress=not quiet and sys.stderr.isatty(), requests=requests, recorders=recorders)
    except (ValueError, plugins.UnknownNameError) as exc:
        raise click.UsageError(str(exc)) from None
    if isinstance(result, dict) and result.get("latency_domain"):  # the latency model's own word (models helper)
        click.echo(f"Warning: latency model {config.latency_model}: {result['latency_domain']}", err=True)
    return result


def sim_options(fn):
    for flags, field, ptype, default, help_ in reversed(SIM_OPTIONS):
        fn = click.option(*flags, field, type=ptype, default=default, show_default=default is not None,
                          help=help_, callback=input_path if field in INPUT_FIELDS else None)(fn)
    return fn


def common_flags(quiet_help: str = "No progress bar on stderr (shown only when stderr is a terminal)."):
    """The flags sim, compare and sweep share; ``quiet_help`` says what --quiet silences in that command."""
    def decorate(fn):
        fn = click.option("--opt", "opt", multiple=True, metavar="NAME=VALUE",
                          help="Strategy option (see `dynlab strategies --verbose`); repeatable.")(fn)
        fn = click.option("--all-metrics", is_flag=True, help="Synthetic workload: add the fleet metrics.")(fn)
        fn = click.option("--latency-opt", "latency_opt", multiple=True, metavar="NAME=VALUE",
                          help="With --timing: latency model option (see `dynlab latency --list`); repeatable.")(fn)
        fn = click.option("--timing", is_flag=True,
                          help="Serve in time on vLLM-like engines: batching, chunked prefill, a finite block "
                               "pool, preemption, TTFT/TPOT (see docs/engine.md).")(fn)
        fn = click.option("--quiet", is_flag=True, help=quiet_help)(fn)
        for flag, field, help_ in reversed(SIM_FLAGS):
            fn = click.option(flag, field, is_flag=True, help=help_)(fn)
        return fn
    return decorate


@main.command()
@sim_options
@pool_option
@common_flags()
@click.option("--requests-out", "requests_out", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              callback=stream_output_path, metavar="FILE",
              help="Write one JSON line per trace request, in trace order (worker, times, hits, preemptions; "
                   "see docs/commands.md); - for stdout, the result JSON then going to stderr.")
@report_option
@timeline_options
@click.pass_context
def sim(ctx, opt, latency_opt, all_metrics, timing, quiet, requests_out, report_path, timeline,
        timeline_max_requests, **options):
    """Replay one workload through the fleet and print its metrics as one JSON object.

    Without --trace: the KV-aware router lab's synthetic workload (12 shared prefixes,
    6 requests each), printing that lab's keys. With --trace: a real trace, printing the fleet metrics too, with
    block_tokens (tokens per block of the names replayed: 512 for a Mooncake trace).
    An option that would have no effect in the combination given is refused (exit 2).
    """
    from dynlab.engine.option_rules import check_outputs
    from dynlab.sim.records import RequestRecorder

    config = SimConfig(**options, opts=parse_opts(opt), latency_opts=parse_opts(latency_opt, "--latency-opt"),
                       all_metrics=all_metrics, timing=timing)
    given = given_fields(ctx)
    check_options(config, given)
    try:
        check_outputs(timing, given)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    per_request = RequestRecorder() if requests_out else None
    line = None
    if timeline:
        from dynlab.sim.timeline import TimelineRecorder
        line = TimelineRecorder(config.event_delay_ms)
    usage = usage_recorder(config, report_path)
    result = _run(config, quiet, recorders=[r for r in (per_request, line, usage) if r is not None])
    text = json_text(result)
    if report_path:  # written before the JSON is printed: no output that looks like success before an error
        from dynlab.report import Run
        records = {config.mode: list(per_request.records())} if requests_out else None
        write_run_report(ctx, report_path, [Run(config.mode, result)], [config], records=records,
                         usage=None if usage is None else {config.mode: usage.series()})
    if timeline:
        line.write(timeline, timeline_max_requests)
    if requests_out:
        write_atomic(requests_out, per_request.jsonl())
    click.echo(text, err=requests_out == "-")
    _warn_collapse({result.get("mode"): result})


def type_text(ptype: click.ParamType) -> str:
    """What a value of ``ptype`` is, for --help: ``integer >= 1``, ``number 0 to 1``, ``yes|no``, ``strategy name``."""
    if isinstance(ptype, click.Choice):
        return "|".join(ptype.choices)
    if isinstance(ptype, RegistryName):
        return f"{ptype.name} name"
    if isinstance(ptype, CapacityType):
        return "integer >= 0 or unbounded"
    if isinstance(ptype, (click.IntRange, click.FloatRange)):
        kind = "integer" if isinstance(ptype, click.IntRange) else "number"
        if ptype.min is not None and ptype.max is not None:
            return f"{kind} {ptype.min} to {ptype.max}"
        return f"{kind} {'>' if ptype.min_open else '>='} {ptype.min}"
    return {"integer": "integer", "text": "text"}.get(ptype.name, ptype.name)


_NO_DEFAULT = {"capacity": "unbounded", "trace": "the synthetic workload", "trace_format": "detected",
               "rate": "the trace's rate, else 4", "rate_scale": "1", "duration": "the whole trace",
               "workload": "none", "tokenizer": "an approximation",
               "cpu_capacity": "no tier", "cpu_memory_gb": "no tier"}


def _compare_options(fn):
    for flags, field, ptype, default, help_ in reversed(SIM_OPTIONS):
        shown = _NO_DEFAULT.get(field, default)
        help_ = re.sub(r"\s*\[default: [^]]*\]", "", help_)  # said once, below
        fn = click.option(*flags, field, type=click.STRING, default=None, metavar="V[,V...]",
                          help=f"{help_} A comma list varies it. [type: {type_text(ptype)}; default: {shown}]")(fn)
    return fn


def _format_table(results: dict) -> str:
    """An aligned text table of the main metrics, one row per run (``-`` where a run lacks a value); a
    column appears when some run has its key (``prefix_hit_rate``: timed runs, the engines' own hit rate,
    GPU and CPU tier, beside the router's GPU-only ``block_hit_rate``; ``ttft_p99_ms`` and ``tpot_p99_ms``
    beside the medians, as SLOs are p99). When some run speculates (``compare --spec-tokens 0,2,4``) the
    table also has ``accept_len`` (the mean acceptance length); ``goodput`` shows with an SLO, ``shed`` with an
    admission policy, ``held`` when a gateway held requests, ``gpu_hours`` with an autoscaler or a price, ``cost_usd`` with a price
    (``--price``, ``--spot-discount``)."""
    cols = [("run", None), ("requests", "requests"), ("hits", "hits"), ("hit_rate", "hit_rate"),
            ("block_hit_rate", "block_hit_rate"), ("prefix_hit_rate", "prefix_hit_rate"),
            ("ideal", "ideal_block_hit_rate"),
            ("pred_error", "prediction_error"), ("evicted", "evicted_blocks"),
            ("imbalance", "load_imbalance"), ("ttft_p50_ms", "ttft_ms.p50"), ("ttft_p99_ms", "ttft_ms.p99"),
            ("tpot_p50_ms", "tpot_ms.p50"), ("tpot_p99_ms", "tpot_ms.p99"), ("goodput", "goodput"), ("shed", "shed"),
            ("held", "held"), ("tok_s_gpu", "output_tokens_per_s_per_gpu"), ("gpu_hours", "gpu_hours"), ("cost_usd", "cost_usd"), ("xfer_p50_ms", "transfer_ms.p50"),
            ("xfer_p99_ms", "transfer_ms.p99"), ("dwait_p99_ms", "decode_wait_ms.p99"), ("preempted", "preemptions"),
            ("gpu_hit_blocks", "gpu_hit_blocks"), ("cpu_hit_blocks", "cpu_hit_blocks"), ("pcie_gb", "pcie_gb")]

    if any("mean_acceptance_length" in r for r in results.values()):
        at = cols.index(("tpot_p99_ms", "tpot_ms.p99")) + 1
        cols[at:at] = [("accept_len", "mean_acceptance_length")]

    def get(r, path):
        if path == "pcie_gb":
            return None if "pcie_bytes" not in r else round(r["pcie_bytes"] / 1e9, 1)
        for part in path.split("."):
            if not isinstance(r, dict) or part not in r:
                return None
            r = r[part]
        return r

    # a column shows when some run has its key (a distribution with no sample, null, shows as "-")
    present = [c for c in cols if c[1] is None or any(get(r, c[1]) is not None or c[1].split(".")[0] in r
                                                      for r in results.values())]
    rows = [[c[0] for c in present]]
    for key, r in results.items():
        rows.append([key] + ["-" if get(r, f) is None else str(get(r, f)) for _, f in present[1:]])
    widths = [max(len(row[j]) for row in rows) for j in range(len(present))]
    lines = ["  ".join(cell.ljust(widths[j]) if j == 0 else cell.rjust(widths[j]) for j, cell in enumerate(row))
             for row in rows]
    return "\n".join(lines)


@main.command()
@_compare_options
@pool_option
@common_flags("No progress bar per run on stderr (shown only when stderr is a terminal).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default=None,
              help="Output: an aligned table or the keyed JSON object [default: table on a terminal, else json].")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, callback=output_path,
              help="Write a bar chart of block hit rate per run (PNG); with --timing also the engines' prefix hit rate "
                   "and TTFT.")
@report_option
@click.pass_context
def compare(ctx, opt, latency_opt, all_metrics, timing, quiet, fmt, plot_path, report_path, pools, **options):
    """Run `sim` once per value of ONE option given as a comma list; print the runs keyed by value.

    Example: `dynlab compare --modes rr,random,kv` (the KV-aware router lab's modes.json) or
    `dynlab compare --mode kv-events --publish yes,no` (its events.json).
    """
    claim_inputs(ctx, [("--" + f.replace("_", "-"), f, v) for f in INPUT_FIELDS if options.get(f) is not None
                       for v in options[f].split(",")])  # --trace a.jsonl,b.jsonl: each a file it reads
    fixed, varied = _split_compared(ctx, options)
    base = SimConfig(**fixed, opts=parse_opts(opt), latency_opts=parse_opts(latency_opt, "--latency-opt"),
                     all_metrics=all_metrics, timing=timing, pools=tuple(pools))
    if varied is None:
        flag, field = "--mode", "mode"
        items, values = [base.mode], [base.mode]
    else:
        flag, field, items, values = varied
    configs = {item: replace(base, **{field: value}) for item, value in zip(items, values)}
    given = {f for f, text in options.items() if text is not None} | ({"all_metrics"} if all_metrics else set())
    given |= {"pools"} if pools else set()
    given |= {f for _, f, _ in SIM_FLAGS if fixed.get(f)}
    configs = _check_compared(configs, given, flag)
    if plot_path:
        from dynlab.cli.common import check_plot

        check_plot(plot_path)  # before the runs: a bad suffix or missing matplotlib fails now
    requests = None
    from dynlab.engine.spec import hash_lookahead_tokens

    lookahead = {hash_lookahead_tokens(c) for c in configs.values()}  # EAGLE's names differ with speculation on
    if base.trace is not None and len(lookahead) == 1 and field not in (
            "trace", "trace_format", "block", "hash", "trace_block", "tokenizer"):
        from dynlab.traces.reader import load_trace  # read once for every run (and stdin can only be read once)

        try:
            requests = load_trace(base.trace, base.trace_format, base.block, base.hash, base.trace_block,
                                  base.tokenizer, lookahead.pop(), base.keep_failed)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    elif base.trace == "-":  # each run reads the trace (names its blocks its own way): from one copy of stdin
        from dynlab.traces.reader import keep_stdin

        keep_stdin()
    _check_timed_runs(configs, requests)
    results = {}
    usage = {}
    with progress_bar(len(configs), "compare", "run", quiet) as bar:  # each run adds its own bar below
        for item, config in configs.items():
            recorder = usage_recorder(config, report_path)
            results[item] = _run(config, quiet, requests, () if recorder is None else (recorder,))
            if recorder is not None:
                usage[item] = recorder
            bar.update(1)
    if plot_path:
        _plot_compared(results, plot_path, field, flag, base)
    if report_path:
        from dynlab.report import Run
        write_run_report(ctx, report_path, [Run(k, r) for k, r in results.items()], list(configs.values()),
                         usage={k: rec.series() for k, rec in usage.items()})
    echo_table_or_json(results, fmt, _format_table)
    _warn_collapse(results)


def _warn_collapse(results: dict) -> None:
    """One stderr line when a run (timed or count-based) collapsed onto one worker (:mod:`dynlab.collapse`)."""
    from dynlab.collapse import collapse_warning

    message = collapse_warning(results)
    if message:
        click.echo(f"Warning: {message}", err=True)


def _split_compared(ctx, options: dict) -> tuple:
    """``(fixed, varied)`` of compare's options: ``fixed`` field -> the one value given (flags set
    included), ``varied`` ``(flag, field, items as written, values)`` of the one option given as a comma
    list, or ``None``. Raises ``click.UsageError`` when two options list values, a value is bad or
    repeated."""
    by_field = {field: (flags, ptype) for flags, field, ptype, _, _ in SIM_OPTIONS}
    fixed: dict = {field: True for _, field, _ in SIM_FLAGS if options.pop(field)}
    varied = None
    for field, text in options.items():
        if text is None:
            continue
        flags, ptype = by_field[field]
        flag = flags[0]
        items = [text] if field in OWN_COMMAS else split_list(text, flag)
        try:
            values = [ptype.convert(v, None, ctx) for v in items]
        except click.BadParameter as exc:
            exc.param_hint = " / ".join(f"'{f}'" for f in flags)  # as click names it for sim
            raise
        refuse_repeats(items, values, flag)
        if len(items) > 1:
            if varied is not None:
                raise click.UsageError(f"only one option may vary per call: {varied[0]} and {flag} both list values")
            varied = (flag, field, items, values)
        else:
            fixed[field] = values[0]
    return fixed, varied


def _check_compared(configs: dict, given: set, flag: str) -> dict:
    """Every run's config, aligned (``align_split``) and checked before the first runs: an option a compared
    strategy lacks (--opt), or one that has no effect, is refused for all alike, as sweep refuses it for
    its cells. Returns item -> aligned config; raises ``click.UsageError``."""
    from dynlab.engine.option_rules import align_split

    try:
        aligned = align_split(list(configs.values()), given)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    configs = {item: c for item, (c, _) in zip(configs, aligned)}
    for (item, config), (_, run_given) in zip(configs.items(), aligned):
        check_options(config, run_given)
        try:
            build_strategy(config, random.Random(0))
        except ValueError as exc:
            raise click.UsageError(f"{flag} {item}: {exc}") from None
    return configs


def _check_timed_runs(configs: dict, requests) -> None:
    """Refuse, before any run, the values a timed run refuses (a model that does not fit, --pcie-gbps, ...)."""
    from dynlab.engine.serving import check_timed

    for config in configs.values():
        if config.timing:
            try:
                check_timed(config.resolved(), requests)
            except (ValueError, plugins.UnknownNameError) as exc:
                raise click.UsageError(str(exc)) from None


def _plot_compared(results: dict, plot_path: str, field: str, flag: str, base: SimConfig) -> None:
    """Compare's chart: the P/D split's TTFT/TPOT chart for --split, else block hit rate per run."""
    if field == "split":
        from dynlab.disagg.plot import plot_split

        plot_split(results, plot_path, title=f"varying --split ({base.trace or 'synthetic workload'})")
    else:
        from dynlab.plots import plot_compare

        plot_compare(results, plot_path, title=f"varying {flag}")
