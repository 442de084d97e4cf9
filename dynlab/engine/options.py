"""The declaration of every option of ``dynlab sim`` (issue 39 item 5, "options declared once"): :data:`OPTIONS`,
one :class:`~dynlab.engine.option_spec.Option` each, in ``dynlab sim --help``'s order (the options, then the on/off
flags, then those the CLI wires by hand). :class:`~dynlab.engine.config.SimConfig`'s fields, its sections, the click
options of ``sim``/``compare``/``sweep`` (``dynlab/cli/sim_options.py``), the no-effect rules' field groups and the
docs' option table are generated from it. A new option is one entry here, plus the code that uses it (and a row in
``tests/test_option_table.py`` proving what it does).

Defaults and their sources: the seed's (lab 000 step 4) for the routing lab's options; vLLM 0.33.0's for its scheduler
(``max_num_batched_tokens``, ``max_num_seqs``, ``gpu_memory_utilization``); SGLang 0.5.23's for its options; the
others' are named in their help and in :class:`~dynlab.engine.config.SimConfig`.
"""
from __future__ import annotations

from dynlab.engine.lora import DISK_GBPS
from dynlab.engine.option_spec import Option
from dynlab.latency.overheads import DETOK_US_PER_TOKEN, FRONT_END_MS
from dynlab.limits import (MAX_CHUNK_TOKENS, MAX_PROMPT_TOKENS, MAX_RUNNING_REQUESTS, MAX_SEED_BLOCKS,
                           MAX_SEED_REQUESTS, MAX_WORKERS)

#: the commands of an option ``dynlab plan`` takes too (with sim's meaning: ``dynlab/cli/plan.py``)
PLAN_TOO = ("sim", "compare", "sweep", "plan")
#: requests/s of the Poisson arrivals of a timed workload without timestamps
POISSON_RATE = 4.0

OPTIONS: tuple = (
    Option('mode', 'fleet', 'kv-cost', kind="registry", registry='strategies', label='strategy', commands=PLAN_TOO,
           flags=('--mode', '--modes'),
           help='Routing strategy (see `dynlab strategies`).'),
    Option('workers', 'fleet', 2, kind="int", min=1, unit='workers', flags=('--workers',),
           help=f'Number of workers (at most {MAX_WORKERS:,}; see docs/limits.md).'),
    Option('prefixes', 'traffic', 12, kind="int", min=0, unit='prefixes', flags=('--prefixes',), rules=('synthetic',),
           help=f'Synthetic workload (no --trace): distinct prefixes (prefixes x reps at most {MAX_SEED_REQUESTS:,} '
                f'requests and {MAX_SEED_BLOCKS:,} full blocks).'),
    Option('reps', 'traffic', 6, kind="int", min=0, unit='requests', flags=('--reps',), rules=('synthetic',),
           help='Synthetic workload: requests per prefix.'),
    Option('plen', 'traffic', 96, kind="int", min=0, unit='tokens', flags=('--plen',), rules=('synthetic',),
           help=f'Synthetic workload: prefix length in tokens (plen + tail at most {MAX_PROMPT_TOKENS:,}).'),
    Option('tail', 'traffic', 16, kind="int", min=0, unit='tokens', flags=('--tail',), rules=('synthetic',),
           help='Synthetic workload: per-request tail in tokens.'),
    Option('seed', 'traffic', 1, kind="int", commands=PLAN_TOO, flags=('--seed',),
           help="Seed of the run's RNG (shuffle, random choices)."),
    Option('block', 'kv', 16, kind="int", min=1, unit='tokens', commands=PLAN_TOO, flags=('--block',),
           help='Tokens per block when hashing tokens.'),
    Option('hash', 'traffic', 'dynlab', kind="choice", choices=('dynlab', 'dynamo'), commands=PLAN_TOO,
           flags=('--hash',),
           help="Block names of hashed tokens: dynlab's, or NVIDIA Dynamo's (xxh3, see docs/events.md)."),
    Option('publish', 'events', 'yes', kind="choice", choices=('yes', 'no'), commands=PLAN_TOO, flags=('--publish',),
           help='Workers publish KV events.'),
    Option('capacity', 'kv', None, kind="capacity", unit='blocks', commands=PLAN_TOO, flags=('--capacity',),
           plan_own='at least 1, derived from GPU memory',
           help='KV blocks per worker (0: a cache that holds nothing; with --timing at least 1, not unbounded) '
                '[default: unbounded; with --timing derived from the GPU memory].'),
    Option('policy', 'kv', 'lru', kind="registry", registry='eviction_policies', label='eviction policy',
           flags=('--policy',),
           help='Eviction policy of bounded caches (see `dynlab policies`).'),
    Option('event_delay', 'events', 0, kind="int", min=0, unit='requests', flags=('--event-delay',),
           help="Deliver request i's KV events before request i+1+K is routed."),
    Option('event_loss', 'events', 0.0, kind="float", min=0.0, max=1.0, unit='probability', commands=PLAN_TOO,
           flags=('--event-loss',),
           help='Drop each KV event with this probability.'),
    Option('routers', 'fleet', 1, kind="int", min=1, unit='replicas', commands=PLAN_TOO, flags=('--routers',),
           help='Router replicas: independent instances of the strategy, each with its own index and load view; every'
                ' replica receives every KV event (see docs/routing.md).'),
    Option('router_assign', 'fleet', 'rr', kind="choice", choices=('rr', 'hash'), commands=PLAN_TOO,
           flags=('--router-assign',),
           help='With --routers > 1: requests reach the replicas round robin, or by a hash of the session (the '
                "request's first block name)."),
    Option('trace', 'traffic', None, kind="text", commands=PLAN_TOO, flags=('--trace',),
           none_means='the synthetic workload',
           help="A bundled trace (mooncake-conversation: 12031 requests of Mooncake's public conversation trace), a "
                'path to a JSONL trace (.gz read as gzip) or - for stdin. Rows must be in time order: a trace whose '
                'timestamps go backwards, or that gives some rows a timestamp and others none, is refused with '
                'FILE:LINE (the trace is streamed, not sorted).'),
    Option('trace_format', 'traffic', None, kind="registry", registry='trace_formats', label='trace format',
           commands=PLAN_TOO, flags=('--trace-format',),
           help='Trace format [default: detected from the first line].'),
    Option('time_scale', 'traffic', 1.0, kind="float", min=0, min_open=True, unit='factor',
           flags=('--time-scale',), rules=('timed',),
           help='With --timing: multiply trace timestamps (0.5 = twice the rate).'),
    Option('rate', 'traffic', None, kind="float", min=0, min_open=True, unit='requests/s', flags=('--rate',),
           rules=('timed',),
           help='With --timing: requests/s. On a trace with timestamps it rescales time so the mean arrival rate is '
                'RATE (see docs/workloads.md); for workloads without timestamps, their Poisson arrivals [default: the'
                f" trace's own rate; {POISSON_RATE:g} for Poisson arrivals]."),
    Option('rate_scale', 'traffic', None, kind="float", min=0, min_open=True, unit='factor',
           flags=('--rate-scale',), none_means='1',
           help="With --timing: X times the trace's own arrival rate (the same as --time-scale 1/X; give one)."),
    Option('duration', 'traffic', None, kind="float", min=0, min_open=True, unit='s', flags=('--duration',),
           help='Seconds of arrivals from the first: a longer trace is cut, a shorter one looped (repeats are new '
                'traffic, see --duration-repeat) [default: the whole trace].'),
    Option('duration_repeat', 'traffic', 'new', kind="choice", choices=('new', 'same'), flags=('--duration-repeat',),
           help="With --duration: a looped trace's repeats get new block names (new traffic) or keep them (the same "
                'prompts again).'),
    Option('concurrency', 'traffic', None, kind="int", min=1, unit='users', commands=PLAN_TOO,
           flags=('--concurrency',), rules=('timed',),
           help='With --timing: closed loop, as benchmark clients drive a server (vllm bench serve --max-'
                "concurrency): C users each send the workload's next request when their previous one finished "
                "(timestamps ignored; see docs/workloads.md) [default: open loop, at the trace's times or --rate]."),
    Option('think_time_ms', 'traffic', 0.0, kind="float", min=0, unit='ms', commands=PLAN_TOO,
           flags=('--think-time-ms',), rules=('timed',),
           help="With --concurrency: a user's pause between its answer's last token and its next request (ms)."),
    Option('num_requests', 'traffic', None, kind="int", min=1, unit='requests', commands=PLAN_TOO,
           flags=('--requests',), rules=('timed',),
           help="With --timing: serve the workload's first N requests [default: all]."),
    Option('warmup', 'traffic', 0, kind="int", min=0, unit='requests', commands=PLAN_TOO, flags=('--warmup',),
           rules=('timed',),
           help="With --timing: leave the first N requests out of the serving metrics, as benchmark clients' warm-up "
                'requests (they still load the caches).'),
    Option('workload', 'traffic', None, kind="text", commands=PLAN_TOO, flags=('--workload',), none_means='none',
           help='A workload spec file (JSON, or YAML with PyYAML) generated instead of a trace (see '
                'docs/workloads.md).'),
    Option('tokenizer', 'traffic', None, kind="text", commands=PLAN_TOO, flags=('--tokenizer',),
           help='A tokenizer.json (Hugging Face tokenizers) that turns the text of ShareGPT and aiperf traces into '
                'tokens [default: an approximation, see docs/workloads.md].'),
    Option('trace_block', 'kv', None, kind="int", min=1, unit='tokens', commands=PLAN_TOO, flags=('--trace-block',),
           help='Tokens per trace block of a trace that names its own blocks (a Mooncake trace recorded at 16-token '
                "blocks: 16); a timed run maps them onto --block engine blocks [default: the format's, 512 for "
                'mooncake].'),
    Option('max_num_batched_tokens', 'engine', 8192, kind="int", min=1, unit='tokens', commands=PLAN_TOO,
           flags=('--max-num-batched-tokens',), rules=('timed',),
           help="With --timing: token budget of one engine step (vLLM's)."),
    Option('max_num_seqs', 'engine', 256, kind="int", min=1, unit='requests', commands=PLAN_TOO,
           flags=('--max-num-seqs',), rules=('timed',),
           help="With --timing: running requests per engine at most (vLLM's)."),
    Option('latency_model', 'engine', 'roofline', kind="registry", registry='latency_models',
           label='latency model', commands=PLAN_TOO, flags=('--latency-model',), rules=('timed',),
           help='With --timing: step latency model (see `dynlab latency --list`).'),
    Option('latency_profile', 'engine', None, kind="text", commands=PLAN_TOO, flags=('--latency-profile',),
           rules=('timed',),
           none_means='none',
           help='With --timing: a calibration profile from `dynlab calibrate` (JSON): its latency model and fitted '
                "options, and each figure's cross-validated error (error_band_pct)."),
    Option('request_overhead_ms', 'engine', FRONT_END_MS, kind="float", min=0, unit='ms', commands=PLAN_TOO,
           flags=('--request-overhead-ms',), rules=('timed',),
           help="With --timing: the server's front end per request (HTTP, tokenisation, first stream chunk) before "
                "the engine sees it, added to every TTFT and E2E; default BLIS's, measured on vLLM (0: off; fit it "
                'with dynlab calibrate).'),
    Option('detok_us_per_token', 'engine', DETOK_US_PER_TOKEN, kind="float", min=0, unit='us per token',
           commands=PLAN_TOO, flags=('--detok-us-per-token',), rules=('timed',),
           help="With --timing: detokenisation and streaming per output token in us, added to each token's arrival at"
                " the client (TTFT, TPOT, ITL, E2E); default BLIS's, measured on vLLM (0: off)."),
    Option('model', 'engine', 'llama-3.1-8b', kind="text", commands=PLAN_TOO, flags=('--model',), rules=('timed',),
           help='With --timing: served model, a bundled name (see `dynlab models`), a config.json path or a model '
                'directory holding one.'),
    Option('gpu', 'engine', 'h100', kind="text", commands=PLAN_TOO, flags=('--gpu',), rules=('timed',),
           help='With --timing: GPU of each worker (see `dynlab latency --list`), or a GPU file (JSON; '
                'docs/latency.md).'),
    Option('tp', 'engine', 1, kind="int", min=1, unit='GPUs', commands=PLAN_TOO, flags=('--tp',), rules=('timed',),
           help='With --timing: GPUs per worker (tensor parallel).'),
    Option('gpu_memory_utilization', 'engine', 0.9, kind="float", min=0.0, max=1.0, min_open=True, unit='fraction',
           commands=PLAN_TOO, flags=('--gpu-memory-utilization',), rules=('timed',),
           help="With --timing: share of GPU memory for weights and KV (vLLM's); sizes the pool without --capacity."),
    Option('event_delay_ms', 'events', 0.0, kind="float", min=0, unit='ms', commands=PLAN_TOO,
           flags=('--event-delay-ms',), rules=('timed',),
           help='With --timing: KV events reach the router this many ms after they happen.'),
    Option('slo_ttft_ms', 'slo', None, kind="float", min=0, unit='ms', commands=PLAN_TOO, flags=('--slo-ttft-ms',),
           rules=('timed',),
           none_means='no SLO',
           help='With --timing: TTFT SLO for goodput.'),
    Option('slo_tpot_ms', 'slo', None, kind="float", min=0, unit='ms', commands=PLAN_TOO, flags=('--slo-tpot-ms',),
           rules=('timed',),
           none_means='no SLO',
           help='With --timing: TPOT SLO for goodput.'),
    Option('slo_classes', 'slo', None, kind="checked", label='CLASS:ttft_ms=X,tpot_ms=Y;...', check='class_slos',
           commands=PLAN_TOO, flags=('--slo',), rules=('timed',), own_commas=True,
           none_means='none',
           help='With --timing: SLOs of a request class (its trace field `class`), CLASS:ttft_ms=X,tpot_ms=Y, several'
                " classes apart by ';'; a class's requests meet its own SLOs in goodput and by_class (see "
                'docs/classes.md).'),
    Option('cpu_capacity', 'kv', None, kind="int", min=0, unit='blocks', flags=('--cpu-capacity',),
           rules=('timed',),
           help='With --timing: KV blocks per worker in a CPU (host memory) tier behind the GPU pool, LRU; blocks are'
                ' written there (see --cpu-write) and loaded back over PCIe on a prefix hit (see docs/tiers.md) '
                '[default: no tier].'),
    Option('cpu_memory_gb', 'kv', None, kind="float", min=0, unit='GB', commands=PLAN_TOO,
           flags=('--cpu-memory-gb',), rules=('timed',),
           help="With --timing: the CPU tier sized in GB of host memory per worker, with the model's KV bytes per "
                'block (0: no tier; a value > 0 must hold one block) [default: no tier].'),
    Option('pcie_gbps', 'kv', 25.0, kind="float", min=0, min_open=True, unit='GB/s', commands=PLAN_TOO,
           flags=('--pcie-gbps',), rules=('timed',),
           help='With --timing and a CPU tier or --max-loras: GB/s per direction between host and each GPU (PCIe Gen4'
                ' x16 in practice).'),
    Option('cpu_write', 'kv', 'compute', kind="choice", choices=('evict', 'compute'), commands=PLAN_TOO,
           flags=('--cpu-write',), rules=('timed',),
           help='With --timing and a CPU tier: when a block is written there: when it is computed (write-through, as '
                "vLLM's OffloadingConnector, LMCache and the cache lab's TwoTierCache store) or when the GPU evicts "
                'it (a victim tier).'),
    Option('admission', 'engine', 'full', kind="choice", choices=('full', 'chunk'), commands=PLAN_TOO,
           flags=('--admission',), rules=('timed',),
           help='With --timing: admit a waiting request only when the blocks of its whole sequence are free (full, '
                "vLLM 0.33.0's default scheduler_reserve_full_isl) or those of the chunk scheduled now (chunk, the "
                'rule of the vLLM releases before it).'),
    Option('admission_policy', 'fleet', 'always', kind="checked", label='NAME:KEY=VALUE,...',
           check='admission_policy', commands=PLAN_TOO, flags=('--admission-policy',), rules=('timed',),
           own_commas=True,
           help='With --timing: the gateway before the router: always (every request enters), queue-'
                'bound:limit=N,limit.CLASS=N (shed a request when its class has N queued: admitted, no first token '
                'yet) or token-bucket:rate=R,burst=B,rate.TENANT=R (per tenant, R requests/s with bursts of B); a '
                'shed request is never served and counts against goodput (see docs/engine.md and `dynlab plugins`).'),
    Option('controller', 'fleet', 'none', kind="checked", label='NAME:KEY=VALUE,...', check='controller',
           flags=('--controller',), rules=('timed',), own_commas=True,
           help='With --timing: what adds and retires workers during the run (with --split P:D, the decode pool\'s: '
                'bounds decode_min=, decode_max=), called every period=S seconds (default 1; hpa 15, dynamo-load 5, dynamo-throughput 180): none (a fixed fleet), '
                "static, hpa:metric=queue|running|kv,target=X,max=N (Kubernetes' HPA, with cold starts), dynamo-"
                "load:ttft=MS,itl=MS (NVIDIA Dynamo Planner's load-based mode), dynamo-throughput:ttft=MS,itl=MS (its"
                " throughput-based mode) or a controller plugin's NAME:period=S,...; every controller also takes "
                "scrape_delay_s and discovery_delay_s; the result then lists each worker's lifetime and the GPU-hours"
                ' (see docs/autoscaling.md and `dynlab plugins`).'),
    Option('price', 'fleet', None, kind="checked", label='table|GPU=USD,...', check='prices', flags=('--price',),
           own_commas=True,
           help="With --timing: price the run's GPU-hours: table (the bundled on-demand list prices, dated and "
                "sourced: docs/cost.md) or GPU=USD[,GPU=USD] (USD per GPU-hour, over the table's); the result then "
                'adds gpu_hours, cost_usd and price_source [default: no cost].'),
    Option('spot_discount', 'fleet', 0.0, kind="float", min=0.0, max=1.0, max_open=True, unit='fraction',
           flags=('--spot-discount',),
           help='With --timing: the fraction off the on-demand price (0 <= F < 1), your assumption of a spot or '
                'committed discount (none is bundled); prices the run as --price table does when --price is not '
                'given.'),
    Option('engine_kind', 'engine', 'vllm', kind="registry", registry='engine_kinds', label='engine kind',
           commands=PLAN_TOO, flags=('--engine',), rules=('timed',),
           help="With --timing: what each worker is: vllm (vLLM 0.33's scheduler and KV cache manager; --async-"
                "scheduling is its AsyncScheduler) or sglang (SGLang 0.5.23's scheduler and radix cache, set by the "
                'SGLang options below; see docs/engine.md); see `dynlab plugins`.'),
    Option('queue_policy', 'engine', 'fcfs', kind="registry", registry='queue_policies', label='queue policy',
           commands=PLAN_TOO, flags=('--queue-policy',), rules=('timed',),
           help="With --timing: the order of each engine's waiting queue and whom it preempts: fcfs (vLLM's default),"
                " priority (vLLM 0.33's --scheduling-policy priority: by the requests' priority attribute, lower "
                'first) or priority-displace (vLLM PR #54530: a more important request also displaces a runner at '
                '--max-num-seqs); see `dynlab plugins`.'),
    Option('max_loras', 'engine', None, kind="int", min=1, unit='adapters', flags=('--max-loras',), rules=('timed',),
           help="With --timing: LoRA adapters in each worker's GPU slots, and distinct adapters a step may hold "
                "(vLLM's --max-loras; a request names its adapter by its lora_name); loads delay steps by bytes / "
                'bandwidth (see docs/classes.md) [default: adapters not modelled].'),
    Option('max_cpu_loras', 'engine', None, kind="int", min=1, unit='adapters', flags=('--max-cpu-loras',),
           rules=('lora',),
           help='With --max-loras: adapters each worker keeps in host memory, loaded to a GPU slot over --pcie-gbps '
                "instead of from disk (vLLM's --max-cpu-loras, >= --max-loras) [default: --max-loras]."),
    Option('max_lora_rank', 'engine', 16, kind="int", min=1, flags=('--max-lora-rank',), rules=('lora',),
           help="With --max-loras: the adapters' rank (vLLM's --max-lora-rank: 1, 8, 16, 32, 64, 128, 256, 320 or "
                '512), which sizes the bytes each load moves.'),
    Option('lora_disk_gbps', 'engine', DISK_GBPS, kind="float", min=0, min_open=True, unit='GB/s',
           flags=('--lora-disk-gbps',), rules=('lora',),
           help='With --max-loras: GB/s a worker reads an adapter from disk at when host memory lacks it (default: a '
                "PCIe 4.0 x4 NVMe drive's link, an upper bound)."),
    Option('max_running_requests', 'engine', None, kind="int", min=1, max=MAX_RUNNING_REQUESTS, unit='requests',
           commands=PLAN_TOO, flags=('--max-running-requests',), rules=('sglang',),
           help="With --engine sglang: running requests per worker at most (SGLang's; at most "
                f"{MAX_RUNNING_REQUESTS:,}, see docs/limits.md) [default: SGLang's rule from the pool's tokens and the "
                "model's context length, 2048 for most]."),
    Option('chunked_prefill_size', 'engine', None, kind="int", min=1, max=MAX_CHUNK_TOKENS, also=((-1, 'no chunking'),),
           unit='tokens', commands=PLAN_TOO, flags=('--chunked-prefill-size',), rules=('sglang',),
           help="With --engine sglang: tokens of a prefill chunk at most (SGLang's; -1: no chunking; at most "
                f"{MAX_CHUNK_TOKENS:,}, see docs/limits.md) [default: by the GPU's memory, 8192 on an H100]."),
    Option('max_prefill_tokens', 'engine', 16384, kind="int", min=1, unit='tokens', commands=PLAN_TOO,
           flags=('--max-prefill-tokens',), rules=('sglang',),
           help="With --engine sglang: tokens of one prefill pass at most (SGLang's)."),
    Option('schedule_policy', 'engine', 'fcfs', kind="choice", choices=('fcfs', 'lpm', 'dfs-weight', 'lof',
           'random'), commands=PLAN_TOO, flags=('--schedule-policy',), rules=('sglang',),
           help="With --engine sglang: the waiting queue's order (SGLang's): fcfs, lpm (longest cached prefix first; "
                'fcfs above 128 waiting), dfs-weight (depth first through the radix tree, the subtree with more '
                'waiting requests first), lof (longest output first) or random.'),
    Option('page_size', 'engine', 1, kind="int", min=1, unit='tokens', commands=PLAN_TOO, flags=('--page-size',),
           rules=('sglang',),
           help="With --engine sglang: tokens per KV page (SGLang's); must divide --block."),
    Option('mem_fraction_static', 'engine', None, kind="float", min=0.0, max=1.0, min_open=True, unit='fraction',
           commands=PLAN_TOO, flags=('--mem-fraction-static',), rules=('sglang',),
           help="With --engine sglang: share of GPU memory for weights and KV (SGLang's); sizes the pool without "
                "--capacity [default: vLLM's 0.9 rule, see docs/engine.md]."),
    Option('schedule_conservativeness', 'engine', 1.0, kind="float", min=0, min_open=True, commands=PLAN_TOO,
           flags=('--schedule-conservativeness',), rules=('sglang',),
           help="With --engine sglang: scales the initial new-token ratio (SGLang's; larger admits fewer requests)."),
    Option('init_new_token_ratio', 'engine', 0.7, kind="float", min=0, min_open=True, unit='fraction',
           commands=PLAN_TOO, flags=('--init-new-token-ratio',), rules=('sglang',),
           help='With --engine sglang: the share of its remaining output each running request reserves at admission '
                "(SGLang's SGLANG_INIT_NEW_TOKEN_RATIO)."),
    Option('new_token_ratio_decay_steps', 'engine', 600, kind="int", min=1, unit='steps', commands=PLAN_TOO,
           flags=('--new-token-ratio-decay-steps',), rules=('sglang',),
           help="With --engine sglang: decode passes for the new-token ratio to decay to its floor (SGLang's "
                'SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS).'),
    Option('prefill_workers', 'fleet', None, kind="int", min=1, unit='workers', flags=('--prefill-workers',),
           rules=('timed',),
           none_means='aggregated (--workers)',
           help='With --timing: disaggregated serving, prefill workers (with --decode-workers, instead of --workers; '
                'see docs/disagg.md).'),
    Option('decode_workers', 'fleet', None, kind="int", min=1, unit='workers', flags=('--decode-workers',),
           rules=('timed',),
           none_means='aggregated (--workers)',
           help='With --timing: disaggregated serving, decode workers (with --prefill-workers).'),
    Option('split', 'fleet', None, kind="text", flags=('--split',), rules=('timed',),
           none_means='aggregated (--workers)',
           help='With --timing: the fleet as P:D prefill:decode workers (P:0 = P aggregated workers), instead of '
                '--workers; a comma list in compare (--split 8:0,6:2,4:4) compares splits at a fixed GPU count.'),
    Option('decode_router', 'disagg', 'least-loaded', kind="choice", choices=('least-loaded', 'round-robin',
           'kv-usage'), commands=PLAN_TOO, flags=('--decode-router',), rules=('timed', 'pd'),
           help='With a P/D fleet: how a prefilled request picks its decode worker.'),
    Option('link_gbps', 'disagg', 50.0, kind="float", min=0, min_open=True, unit='GB/s', commands=PLAN_TOO,
           flags=('--link-gbps',), rules=('timed', 'pd'),
           help='With a P/D fleet: KV transfer bandwidth per prefill worker, GB/s (50 = one 400 Gb/s NIC); transfers '
                'from one worker share it first come first served.'),
    Option('link_latency_ms', 'disagg', 0.0, kind="float", min=0, unit='ms', commands=PLAN_TOO,
           flags=('--link-latency-ms',), rules=('timed', 'pd'),
           help='With a P/D fleet: latency added to each KV transfer (ms).'),
    Option('ep', 'engine', 1, kind="int", min=1, unit='GPUs', commands=PLAN_TOO, flags=('--ep',), rules=('parallel',),
           help='With --timing: expert-parallel GPUs per worker (the routed experts divided among them; = --tp, or '
                '--tp x attention replicas with --dp-attention).'),
    Option('pp', 'engine', 1, kind="int", min=1, unit='stages', flags=('--pp',), rules=('parallel',),
           help='With --timing: pipeline stages per worker (layers split into consecutive stages).'),
    Option('kv_cache_dtype', 'kv', 'auto', kind="choice", choices=('auto', 'fp8'), flags=('--kv-cache-dtype',),
           rules=('parallel',),
           help="With --timing: KV cache element type (vLLM's): the model's dtype, or one byte (fp8)."),
    Option('spec_method', 'engine', None, kind="choice", choices=('ngram', 'eagle', 'eagle3', 'mtp', 'draft'),
           commands=PLAN_TOO, flags=('--spec-method',), rules=('spec',),
           help="With --timing and --spec-tokens: speculative decoding's drafter (vLLM's SpeculativeConfig.method; "
                'draft = a draft model) [default: off].'),
    Option('spec_tokens', 'engine', 0, kind="int", min=0, unit='tokens', commands=PLAN_TOO, flags=('--spec-tokens',),
           help="With --timing and --spec-method: draft tokens K per decode step (vLLM's num_speculative_tokens; 0: "
                'off; compare --spec-tokens 0,2,4 compares against no speculation; below --max-num-batched-tokens, as'
                ' vLLM requires, and at most 10,000,000, see docs/limits.md).'),
    Option('spec_acceptance', 'engine', None, kind="text", commands=PLAN_TOO, flags=('--spec-acceptance',),
           rules=('spec',), own_commas=True,
           help='With --spec-tokens: per-position acceptance rates 0.8,0.6,0.4 (as vLLM reports them), one rate per '
                "token (0.7), or file:PATH of measured acceptance lengths [default: the method's, see "
                'docs/engine.md].'),
    Option('spec_draws', 'engine', 'seeded', kind="choice", choices=('seeded', 'expected'), commands=PLAN_TOO,
           flags=('--spec-draws',), rules=('spec',),
           help='With --spec-tokens: accepted drafts drawn at random (seeded by --seed, per request) or as their '
                'expected value (smooth sweeps).'),
    Option('spec_model', 'engine', None, kind="text", flags=('--spec-model',), rules=('spec',),
           help='With --spec-method draft: the draft model (a bundled model name or a config.json path), its K steps '
                "priced with its own config through the roofline [default: a tenth of the target's step]."),
    Option('spec_hash_rule', 'engine', 'lookahead', kind="choice", choices=('lookahead', 'drop'),
           flags=('--spec-hash-rule',), rules=('spec',),
           help='With --spec-method eagle|eagle3|mtp: how prefix caching stays exact (vLLM 0.33): lookahead (a '
                "block's name covers the token after it) or drop (vLLM's disable_lookahead_block_hashes: plain names,"
                " a prefix hit's last block dropped, a window group's hit needing its window plus that block)."),
    # on/off flags
    Option('overlap_transfer', 'disagg', False, kind="flag", commands=PLAN_TOO, flags=('--overlap-transfer',),
           rules=('timed', 'pd'),
           help='With a P/D fleet: pipeline the KV transfer with the prefill layer by layer (as NIXL-based connectors'
                ' do); without it the transfer starts when the prefill ends.'),
    Option('decode_prefix_cache', 'disagg', False, kind="flag", commands=PLAN_TOO,
           flags=('--decode-prefix-cache',), rules=('timed', 'pd'),
           help='With a P/D fleet: decode workers cache prompt blocks; blocks they hold are not transferred again.'),
    Option('async_scheduling', 'engine', False, kind="flag", commands=PLAN_TOO,
           flags=('--async-scheduling/--no-async-scheduling',), rules=('timed',),
           help="With --timing: schedule each step while the one before it runs, as vLLM's AsyncScheduler (its "
                'default on GPUs): requests join a step later, finished requests free their blocks a step later (see '
                'docs/engine.md) [default: off].'),
    Option('disable_radix_cache', 'engine', False, kind="flag", commands=PLAN_TOO,
           flags=('--disable-radix-cache',), rules=('sglang',),
           help="With --engine sglang: no prefix cache (SGLang's): nothing is matched, cached or published."),
    Option('enable_mixed_chunk', 'engine', False, kind="flag", commands=PLAN_TOO, flags=('--enable-mixed-chunk',),
           rules=('sglang',),
           help="With --engine sglang: the running requests decode inside each chunked prefill pass (SGLang's), "
                'instead of a decode pass of their own.'),
    Option('keep_failed', 'traffic', False, kind="flag", flags=('--keep-failed',),
           help='With a BurstGPT --trace: replay its failed requests (Response tokens 0), which are skipped by '
                "default (as vLLM's loader drops them), as prompts without an answer: prefilled, no output token "
                'counted (see docs/workloads.md).'),
    Option('dp_attention', 'engine', False, kind="flag", commands=PLAN_TOO, flags=('--dp-attention',),
           rules=('parallel',),
           help='With --timing and --ep > 1: attention data-parallel (DeepSeek-style): --ep / --tp attention ranks '
                "per worker, each its own scheduler, KV pool (the worker's / ranks) and prefix cache, routed to one "
                'by one, stepping in lockstep through the shared expert GPUs (see docs/engine.md).'),
    # wired by hand in dynlab/cli (repeatable, or among the flags every command shares: cli/routing.py common_flags)
    Option('opts', 'fleet', None, kind="mapping", flags=('--opt',), by_hand=True, none_means='none',
           help='Strategy option (see `dynlab strategies --verbose`); repeatable.'),
    Option('all_metrics', 'traffic', False, kind="flag", flags=('--all-metrics',), by_hand=True,
           help='Synthetic workload: add the fleet metrics.'),
    Option('latency_opts', 'engine', None, kind="mapping", flags=('--latency-opt',), rules=('timed',), by_hand=True,
           none_means='none',
           help='With --timing: latency model option (see `dynlab latency --list`); repeatable.'),
    Option('timing', 'engine', False, kind="flag", flags=('--timing',), by_hand=True,
           help='Serve in time on vLLM-like engines: batching, chunked prefill, a finite block pool, preemption, '
                'TTFT/TPOT (see docs/engine.md).'),
    Option('pools', 'fleet', (), kind="pools", flags=('--pool',), by_hand=True, commands=('sim', 'compare'),
           none_means='none',
           help='With --timing: a pool of COUNT workers of GPU at tp N GPUs each, instead of --workers, --gpu and '
                '--tp; repeatable (--pool h100:tp1:4 --pool h200:tp2:2), worker ids in pool order; prefill:/decode: '
                'before each of two pools makes a P/D fleet on two GPUs; the result has each pool\'s figures (see '
                'docs/engine.md).'),
)

#: :class:`~dynlab.engine.config.SimConfig`'s field order as it was before the declarations (its ``repr``, ``fields``
#: and the plan log's cells follow it): never edited; a new option's field comes after these, in :data:`OPTIONS` order
FIELD_ORDER = (
    'mode', 'workers', 'prefixes', 'reps', 'plen', 'tail', 'seed', 'block', 'hash', 'publish', 'capacity', 'policy',
    'event_delay', 'event_loss', 'trace', 'trace_format', 'all_metrics', 'opts', 'timing', 'time_scale', 'rate',
    'trace_block', 'max_num_batched_tokens', 'max_num_seqs', 'latency_model', 'latency_opts', 'latency_profile',
    'model', 'gpu', 'tp', 'gpu_memory_utilization', 'event_delay_ms', 'slo_ttft_ms', 'slo_tpot_ms', 'routers',
    'router_assign', 'cpu_capacity', 'cpu_memory_gb', 'pcie_gbps', 'cpu_write', 'admission', 'engine_kind',
    'queue_policy', 'admission_policy', 'controller', 'price', 'spot_discount', 'async_scheduling',
    'prefill_workers', 'decode_workers', 'split', 'decode_router', 'link_gbps', 'link_latency_ms',
    'overlap_transfer', 'decode_prefix_cache', 'rate_scale', 'duration', 'duration_repeat', 'workload', 'tokenizer',
    'keep_failed', 'ep', 'pp', 'dp_attention', 'kv_cache_dtype', 'spec_method', 'spec_tokens', 'spec_acceptance',
    'spec_draws', 'spec_model', 'spec_hash_rule', 'request_overhead_ms', 'detok_us_per_token', 'concurrency',
    'think_time_ms', 'num_requests', 'warmup', 'slo_classes', 'max_loras', 'max_cpu_loras', 'max_lora_rank',
    'lora_disk_gbps', 'max_running_requests', 'chunked_prefill_size', 'max_prefill_tokens', 'schedule_policy',
    'page_size', 'disable_radix_cache', 'enable_mixed_chunk', 'mem_fraction_static', 'schedule_conservativeness',
    'init_new_token_ratio', 'new_token_ratio_decay_steps', 'pools',
)

#: field name -> its declaration
BY_NAME: dict = {o.name: o for o in OPTIONS}
