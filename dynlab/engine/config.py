"""A simulation's configuration: :class:`SimConfig` (every option of ``dynlab sim``) and its validation
(which options would have no effect: :mod:`dynlab.engine.option_rules`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional

from dynlab.engine.arrival_options import check_closed_loop
from dynlab.engine.class_metrics import parse_class_slos
from dynlab.engine.lora import DISK_GBPS, check_config as check_lora
from dynlab.engine.sections import SECTIONS, Sectioned, make_sections
from dynlab.engine.option_rules import PD_FIELDS, check_effective, defaults_of
from dynlab.engine.spec import SPEC_HASH_RULES, SPEC_METHODS
from dynlab.latency.overheads import DETOK_US_PER_TOKEN, FRONT_END_MS

#: requests/s of the Poisson arrivals of a timed workload without timestamps
POISSON_RATE = 4.0
#: how a disaggregated fleet picks the decode worker of a request (:class:`dynlab.disagg.fleet.DisaggFleet`)
DECODE_ROUTERS = ("least-loaded", "round-robin", "kv-usage")


@dataclass(frozen=True)
class SimConfig(Sectioned):
    """Every option of ``dynlab sim``; the defaults are the seed's (lab 000 step 4) except ``mode``: ``kv-cost``
    (Dynamo's load-aware KV router), not the seed's ``kv``, which sends every request sharing a prefix to one
    worker (dynlab issue 43 item 8; :mod:`dynlab.collapse` warns of it).

    Workload: without ``trace``, the seed's synthetic workload (``prefixes``, ``reps``, ``plen``, ``tail`` tokens,
    ``block`` tokens per block, shuffled by ``seed``; block names by the ``hash`` scheme, ``dynlab`` or ``dynamo``);
    with it, a built-in trace name or a path, read by ``trace_format`` (``None``: detected).
    Fleet: ``workers``; ``capacity`` blocks per worker (``None``: unbounded without ``timing``, the hardware-derived
    pool with it) under the eviction ``policy``. Events: ``publish`` (``"yes"``/``"no"``), ``event_delay``
    (requests; count-based runs), ``event_loss`` (probability). ``opts``: strategy options (name -> text).
    ``all_metrics``: on the synthetic workload, add the fleet metrics to the seed's keys.

    Timed runs (``timing=True``, the serving engine of :mod:`dynlab.engine.worker`): ``block`` is the engine's KV
    block (tokens), ``trace_block`` the trace's (``None``: the format's own, 512 for Mooncake); ``time_scale``
    multiplies trace timestamps, ``rate`` (requests/s) drives Poisson arrivals for workloads without them (``None``:
    :data:`POISSON_RATE`) and rescales a timestamped trace to that mean rate (:mod:`dynlab.traces.rates`, as do
    ``rate_scale`` and ``duration``); ``max_num_batched_tokens`` and ``max_num_seqs`` (vLLM's scheduler limits);
    ``latency_model`` with ``latency_opts``; ``model``, ``gpu``, ``tp``, ``gpu_memory_utilization`` (the pool size
    when ``capacity`` is ``None``, and the latency model's hardware); ``event_delay_ms``; ``slo_ttft_ms`` and
    ``slo_tpot_ms`` (goodput); the CPU tier (:mod:`dynlab.kv.cpu_tier`): ``cpu_capacity`` blocks or ``cpu_memory_gb``
    GB (``None``: none, no tier keys; 0: none, with the keys) over ``pcie_gbps`` GB/s, written when computed
    (``cpu_write="compute"``: write-through, as vLLM's OffloadingConnector and LMCache) or evicted (``"evict"``).
    ``admission``: ``full`` (vLLM 0.33.0's ``scheduler_reserve_full_isl=True``) or ``chunk``. ``async_scheduling``:
    vLLM's ``AsyncScheduler`` (:mod:`dynlab.engine.async_steps`). LoRA adapters (:mod:`dynlab.engine.lora`):
    ``max_loras`` GPU slots per worker (``None``: not modelled), ``max_cpu_loras``, ``max_lora_rank``,
    ``lora_disk_gbps``. ``queue_policy``: the waiting queue's order and
    whom a full KV cache preempts (:mod:`dynlab.engine.queues`; ``fcfs``, vLLM's).

    Routers: ``routers`` replicas of the strategy (each its own index and load view), reached by ``router_assign``
    (``rr``, or ``hash`` of the first block name; :mod:`dynlab.routing.replicas`) behind the gateway's
    ``admission_policy`` (``NAME[:KEY=VALUE,...]``, :mod:`dynlab.engine.gateway`; timed runs; checked when the run builds it).
    ``controller`` (``NAME[:KEY=VALUE,...]``, :mod:`dynlab.engine.controller`; ``none``: a fixed fleet): adds and
    retires workers during a timed run (:mod:`dynlab.engine.elastic`; a P/D run's decode pool:
    :mod:`dynlab.disagg.elastic`). ``price`` (``"table"`` or
    ``"GPU=USD,..."``, USD per GPU-hour over the bundled list prices of :mod:`dynlab.models.prices`) and
    ``spot_discount`` (the fraction 0 <= F < 1 off on-demand; the user's assumption): a timed run's ``gpu_hours``,
    ``cost_usd`` and ``price_source`` (:mod:`dynlab.sim.cost`; ``None`` and 0: no cost keys).

    Disaggregated serving (timed runs, :mod:`dynlab.disagg.fleet`): ``prefill_workers`` and ``decode_workers``
    replace ``workers``; ``split`` (``"P:D"``, for comparisons at a fixed GPU count) sets them at once, ``"P:0"``
    meaning ``P`` aggregated workers. ``decode_router`` (:data:`DECODE_ROUTERS`), ``link_gbps`` (GB/s per prefill
    worker; default a 400 Gb/s NIC), ``link_latency_ms``, ``overlap_transfer``, ``decode_prefix_cache``.

    Sections: seven read-only views of the flat fields, the source of truth (:mod:`dynlab.engine.sections`).
    """

    mode: str = "kv-cost"
    workers: int = 2
    prefixes: int = 12
    reps: int = 6
    plen: int = 96
    tail: int = 16
    seed: int = 1
    block: int = 16
    hash: str = "dynlab"
    publish: str = "yes"
    capacity: Optional[int] = None
    policy: str = "lru"
    event_delay: int = 0
    event_loss: float = 0.0
    trace: Optional[str] = None
    trace_format: Optional[str] = None
    all_metrics: bool = False
    opts: Mapping[str, str] = field(default_factory=dict)
    timing: bool = False
    time_scale: float = 1.0
    rate: Optional[float] = None
    trace_block: Optional[int] = None
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    latency_model: str = "roofline"
    latency_opts: Mapping[str, str] = field(default_factory=dict)
    #     latency_profile: a dynlab calibrate profile (JSON path): its latency model and fitted options
    latency_profile: Optional[str] = None
    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    tp: int = 1
    gpu_memory_utilization: float = 0.9
    event_delay_ms: float = 0.0
    slo_ttft_ms: Optional[float] = None
    slo_tpot_ms: Optional[float] = None
    routers: int = 1
    router_assign: str = "rr"
    cpu_capacity: Optional[int] = None
    cpu_memory_gb: Optional[float] = None
    pcie_gbps: float = 25.0
    cpu_write: str = "compute"
    admission: str = "full"
    engine_kind: str = "vllm"  # what each worker is: an --engine name (dynlab.engine.kinds)
    queue_policy: str = "fcfs"
    admission_policy: str = "always"
    controller: str = "none"  # --controller NAME[:KEY=VALUE,...]: adds and retires workers (dynlab.engine.controller)
    # --- what the fleet's GPU-hours cost (issue 41 item 4; dynlab.models.prices): price "table" or "GPU=USD,...",
    #     spot_discount the fraction off on-demand; either one adds gpu_hours, cost_usd and price_source (timed runs)
    price: Optional[str] = None
    spot_discount: float = 0.0
    async_scheduling: bool = False  # vLLM's AsyncScheduler (dynlab.engine.async_steps); timed, aggregated only
    prefill_workers: Optional[int] = None
    decode_workers: Optional[int] = None
    split: Optional[str] = None
    decode_router: str = "least-loaded"
    link_gbps: float = 50.0
    link_latency_ms: float = 0.0
    overlap_transfer: bool = False
    decode_prefix_cache: bool = False
    # -- workloads: rate_scale: X times the trace's rate; duration: seconds of arrivals (cut or looped),
    #    duration_repeat: new|same block names on loops (dynlab.traces.rates); workload: a spec file
    #    (dynlab.traces.workload); tokenizer: a tokenizer.json for traces of text (dynlab.traces.text)
    rate_scale: Optional[float] = None
    duration: Optional[float] = None
    duration_repeat: str = "new"
    workload: Optional[str] = None
    tokenizer: Optional[str] = None
    keep_failed: bool = False  # a BurstGPT trace's failed rows (Response tokens 0) replayed, without an answer
    ep: int = 1  # ep, pp, dp_attention, kv_cache_dtype: a timed worker's parallelism (dynlab.models.parallel)
    pp: int = 1
    dp_attention: bool = False
    kv_cache_dtype: str = "auto"
    # --- spec helper (issue 26): speculative decoding of a timed worker (dynlab.engine.spec) ---
    #     spec_method: ngram|eagle|eagle3|mtp|draft (None: off); spec_tokens: K drafts (0: off); spec_draws:
    #     seeded|expected; spec_acceptance: rates "0.8,0.6,0.4", a rate "0.7" or "file:PATH" (None: the method's)
    spec_method: Optional[str] = None
    spec_tokens: int = 0
    spec_acceptance: Optional[str] = None
    spec_draws: str = "seeded"
    #     spec_model: the draft model of spec_method draft (a bundled name or config.json; None: dynlab's /10 rule)
    spec_model: Optional[str] = None
    #     spec_hash_rule (issue 43): lookahead (vLLM 0.33's EAGLE hash lookahead) | drop (its
    #     disable_lookahead_block_hashes: plain names, a prefix hit's last block dropped)
    spec_hash_rule: str = "lookahead"
    #     request_overhead_ms: the front end before the engine sees a request (every TTFT and E2E); detok_us_per_token:
    #     detokenisation per output token at the client; defaults: BLIS's (dynlab.latency.overheads)
    request_overhead_ms: float = FRONT_END_MS
    detok_us_per_token: float = DETOK_US_PER_TOKEN
    # --- closed loop (dynlab.engine.closed): concurrency users, each sending think_time_ms after its previous
    #     answer; num_requests (--requests): the first N requests; warmup: the first N left out of the metrics
    concurrency: Optional[int] = None
    think_time_ms: float = 0.0
    num_requests: Optional[int] = None
    warmup: int = 0
    slo_classes: Optional[str] = None  # --slo "CLASS:ttft_ms=X,tpot_ms=Y;..." (dynlab.engine.class_metrics)
    # --- LoRA adapters on the workers (issue 42; dynlab.engine.lora): max_loras GPU slots (None: not modelled),
    #     max_cpu_loras host slots (None: max_loras), max_lora_rank, lora_disk_gbps (GB/s of a cold load)
    max_loras: Optional[int] = None
    max_cpu_loras: Optional[int] = None
    max_lora_rank: int = 16
    lora_disk_gbps: float = DISK_GBPS
    # --- SGLang's options (--engine sglang, dynlab.engine.sglang; issue 40), under SGLang's names; None: resolved
    #     as sglang 0.5.23 does (dynlab.engine.sglang.defaults); chunked_prefill_size -1: no chunking
    max_running_requests: Optional[int] = None
    chunked_prefill_size: Optional[int] = None
    max_prefill_tokens: int = 16384
    schedule_policy: str = "fcfs"
    page_size: int = 1
    disable_radix_cache: bool = False
    enable_mixed_chunk: bool = False
    mem_fraction_static: Optional[float] = None
    schedule_conservativeness: float = 1.0
    init_new_token_ratio: float = 0.7
    new_token_ratio_decay_steps: int = 600
    # --- mixed GPU pools (issue 41 item 5; dynlab.engine.pools): "GPU:tpN:COUNT" texts, in worker order; () : none
    pools: tuple = ()

    def pd(self) -> Optional[tuple[int, int]]:
        """``(prefill workers, decode workers)`` of a disaggregated fleet, ``None`` for an aggregated one
        (``split`` ``"P:0"`` is ``P`` aggregated workers; ``pools`` with roles: their counts,
        :func:`dynlab.engine.pools.pd_pools`). Raises ``ValueError`` for a bad ``split`` or ``pools``."""
        if self.pools:
            from dynlab.engine.pools import pd_pools

            return pd_pools(self)
        if self.split is not None:
            p, d = parse_split(self.split)
            return (p, d) if d else None
        if self.prefill_workers is not None or self.decode_workers is not None:
            return self.prefill_workers, self.decode_workers
        return None

    def resolved(self) -> "SimConfig":
        """The configuration ``run`` serves: ``split`` turned into ``workers`` (``P:0``) or
        ``prefill_workers``/``decode_workers``; an aggregated split drops the P/D options (a
        comparison's aggregated run ignores them)."""
        if self.split is None:
            return self
        p, d = parse_split(self.split)
        if d:
            return replace(self, split=None, workers=DEFAULTS["workers"], prefill_workers=p, decode_workers=d)
        return replace(self, split=None, workers=p, **{f: DEFAULTS[f] for f in PD_FIELDS})

    @property
    def fleet_workers(self) -> int:
        """The workers the router routes to: ``workers``, or with ``pools`` their counts summed (a P/D fleet's prefill
        pool's: :func:`dynlab.engine.pools.pooled_workers`)."""
        if not self.pools:
            return self.workers
        from dynlab.engine.pools import pooled_workers

        return pooled_workers(self)

    @property
    def detok_ms(self) -> float:
        """``detok_us_per_token`` in ms: what each output token spends reaching the client."""
        return self.detok_us_per_token / 1000.0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field, a size over a limit of :mod:`dynlab.limits`,
        or an option that has no effect."""
        self._check_workload_and_routing()
        self._check_engine()
        self._check_fleet()

    def _check_workload_and_routing(self) -> None:
        """:meth:`validate`'s first part: counts, the workload's sizes, hashing, routers, events, arrival rates."""
        for name in ("workers", "block", "max_num_batched_tokens", "max_num_seqs", "tp", "routers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("prefixes", "reps", "plen", "tail", "event_delay"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.capacity is not None and self.capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {self.capacity}")
        if self.trace_block is not None and self.trace_block < 1:
            raise ValueError(f"trace_block must be >= 1, got {self.trace_block}")
        from dynlab.routing.hashing import HASH_SCHEMES

        if self.hash not in HASH_SCHEMES:
            raise ValueError(f"hash must be one of {', '.join(HASH_SCHEMES)}, got {self.hash!r}")
        if self.router_assign not in ("rr", "hash"):
            raise ValueError(f"router_assign must be rr or hash, got {self.router_assign!r}")
        if self.publish not in ("yes", "no"):
            raise ValueError(f"publish must be yes or no, got {self.publish!r}")
        if not 0.0 <= self.event_loss <= 1.0:
            raise ValueError(f"event_loss must be between 0 and 1, got {self.event_loss}")
        for name in ("time_scale", "rate", "rate_scale"):
            v = getattr(self, name)
            if v is None and name != "time_scale":
                continue
            if not (v > 0 and math.isfinite(v) and math.isfinite(1000.0 / v)):
                raise ValueError(f"{name} must be a finite number > 0 (and not vanishingly small), got {v}")

    def _check_engine(self) -> None:
        """:meth:`validate`'s second part: the timed engine's memory, closed loop, speculation, tiers and times."""
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.cpu_capacity is not None and self.cpu_capacity < 0:
            raise ValueError(f"cpu_capacity must be >= 0, got {self.cpu_capacity}")
        check_closed_loop(self.concurrency, self.num_requests, self.warmup)
        parse_class_slos(self.slo_classes)
        if self.spec_tokens < 0:
            raise ValueError(f"spec_tokens must be >= 0, got {self.spec_tokens}")
        for name, allowed in (("spec_method", (None, *SPEC_METHODS)), ("spec_hash_rule", SPEC_HASH_RULES),
                              ("admission", ("full", "chunk")), ("cpu_write", ("evict", "compute"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}, got {getattr(self, name)!r}")
        for name in ("pcie_gbps", "lora_disk_gbps"):
            if not (getattr(self, name) > 0 and math.isfinite(getattr(self, name))):
                raise ValueError(f"{name} must be a finite number > 0, got {getattr(self, name)}")
        for name in ("max_loras", "max_cpu_loras"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("event_delay_ms", "slo_ttft_ms", "slo_tpot_ms", "cpu_memory_gb", "think_time_ms",
                     "request_overhead_ms", "detok_us_per_token"):
            v = getattr(self, name)
            if v is not None and not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number >= 0, got {v}")

    def _check_fleet(self) -> None:
        """:meth:`validate`'s last part: the limits, the P/D fleet and its link, the duration, the options that
        would have no effect, and what async scheduling does not model."""
        from dynlab.limits import check_sim

        check_sim(self)  # sizes the machine cannot hold (dynlab/limits.py)
        if self.split is not None:
            parse_split(self.split)
        if not self.pools and (self.prefill_workers is None) != (self.decode_workers is None):  # --pool: its rule
            raise ValueError("--prefill-workers and --decode-workers go together (a disaggregated fleet has both pools)")
        for name in ("prefill_workers", "decode_workers"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        if self.decode_router not in DECODE_ROUTERS:
            raise ValueError(f"decode_router must be one of {', '.join(DECODE_ROUTERS)}, got {self.decode_router!r}")
        if not (self.link_gbps > 0 and math.isfinite(self.link_gbps)):
            raise ValueError(f"link_gbps must be a finite number > 0, got {self.link_gbps}")
        if not (self.link_latency_ms >= 0 and math.isfinite(self.link_latency_ms)):
            raise ValueError(f"link_latency_ms must be a finite number >= 0, got {self.link_latency_ms}")
        if self.duration is not None and not (self.duration > 0 and math.isfinite(self.duration)):
            raise ValueError(f"duration must be a finite number of seconds > 0, got {self.duration}")
        from dynlab.traces.rates import DURATION_REPEATS

        if self.duration_repeat not in DURATION_REPEATS:
            raise ValueError(f"duration_repeat must be one of {', '.join(DURATION_REPEATS)}, "
                             f"got {self.duration_repeat!r}")
        if self.workload is not None and self.trace is not None:
            raise ValueError("--workload and --trace are two workloads: give one")
        if self.pools:
            from dynlab.engine.pools import parse_pools

            parse_pools(self.pools)  # a malformed --pool, named
        check_effective(self)
        self._check_cost()
        check_lora(self)  # adapter settings vLLM refuses or dynlab does not model
        self._check_sglang()
        if self.async_scheduling:
            from dynlab.engine.async_steps import check_config  # what it does not model is refused
            check_config(self)

    def _check_cost(self) -> None:
        """``--price`` and ``--spot-discount`` (:mod:`dynlab.models.prices`): their values, every GPU named in the
        catalogue (or the run's ``--gpu`` file), and a price for the run's GPU when a cost is asked for."""
        if self.price is None and not self.spot_discount:
            return  # no cost asked for (and the price table not imported)
        from dynlab.engine.pools import run_gpus
        from dynlab.models.prices import check_discount, check_names, gpu_name, price_of, run_prices

        used = run_gpus(self)
        given = run_prices(self.price, used)
        check_discount(self.spot_discount)
        if self.timing:  # a cost is asked for (above): a price for each of the run's GPUs
            gpus = [gpu_name(g) for g in used]
            check_names(given, set(gpus))
            for gpu in gpus:
                price_of(gpu, given)

    def _check_sglang(self) -> None:
        """SGLang's options' ranges (:mod:`dynlab.engine.sglang`)."""
        from dynlab.engine.sglang.schedule_policy import SCHEDULE_POLICIES

        for name in ("max_running_requests", "max_prefill_tokens", "page_size", "new_token_ratio_decay_steps"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        if self.chunked_prefill_size is not None and not (self.chunked_prefill_size == -1 or self.chunked_prefill_size >= 1):
            raise ValueError(f"chunked_prefill_size must be >= 1 or -1 (no chunking), got {self.chunked_prefill_size}")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {', '.join(SCHEDULE_POLICIES)}, got {self.schedule_policy!r}")
        if self.mem_fraction_static is not None and not 0.0 < self.mem_fraction_static <= 1.0:
            raise ValueError(f"mem_fraction_static must be in (0, 1], got {self.mem_fraction_static}")
        for name in ("schedule_conservativeness", "init_new_token_ratio"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number > 0, got {v}")
        if self.engine_kind == "sglang" and self.block % self.page_size:
            raise ValueError(f"--page-size {self.page_size} must divide --block {self.block} (dynlab names the KV "
                             "of each block; a page is part of one)")


#: the section classes (named tuples with SimConfig's defaults; :mod:`dynlab.engine.sections`)
(TrafficSection, FleetSection, EngineSection, KvSection, EventsSection, SloSection,
 PdSection) = make_sections(SimConfig)
SECTION_CLASSES = dict(zip(SECTIONS, (TrafficSection, FleetSection, EngineSection, KvSection, EventsSection,
                                      SloSection, PdSection)))

def parse_split(text: str) -> tuple[int, int]:
    """``"6:2"`` -> ``(6, 2)``: prefill and decode workers (``"8:0"``: 8 aggregated workers).

    Raises ``ValueError`` (one line) unless ``P`` >= 1 and ``D`` >= 0 are integers.
    """
    p, sep, d = str(text).partition(":")
    try:
        if not sep:
            raise ValueError
        p, d = int(p), int(d)
    except ValueError:
        raise ValueError(f"split must be P:D (prefill workers : decode workers, 8:0 = 8 aggregated workers), "
                         f"got {text!r}") from None
    if p < 1 or d < 0:
        raise ValueError(f"split {text!r}: needs P >= 1 prefill workers and D >= 0 decode workers")
    return p, d


#: every SimConfig field's default (default factories as empty mappings): what "not given" means in the option rules
DEFAULTS = defaults_of(SimConfig)
