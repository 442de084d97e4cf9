"""A simulation's configuration: :class:`SimConfig` (every option of ``dynlab sim``) and its validation
(which options would have no effect: :mod:`dynlab.engine.option_rules`)."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

from dynlab.engine.arrival_options import check_closed_loop
from dynlab.engine.class_metrics import parse_class_slos
from dynlab.engine.lora import check_config as check_lora
from dynlab.engine.option_spec import check_value, declare_fields
from dynlab.engine.options import BY_NAME, FIELD_ORDER, OPTIONS, POISSON_RATE  # noqa: F401 (POISSON_RATE: read from here)
from dynlab.engine.sections import SECTIONS, Sectioned, make_sections
from dynlab.engine.option_rules import PD_FIELDS, check_effective, defaults_of

#: how a disaggregated fleet picks the decode worker of a request (:class:`dynlab.disagg.fleet.DisaggFleet`)
DECODE_ROUTERS = BY_NAME["decode_router"].choices


@declare_fields(OPTIONS, FIELD_ORDER)
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

    Fields: one per declaration of :data:`dynlab.engine.options.OPTIONS` (its default, unit, range and help), in
    :data:`~dynlab.engine.options.FIELD_ORDER`; flat keywords (``SimConfig(workers=4)``) and ``dataclasses.replace``
    work as on any frozen dataclass.
    """

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
        or an option that has no effect: each section's fields (:meth:`_check_section`, in :data:`SECTIONS` order),
        then the rules across sections (:meth:`_check_combinations`)."""
        for name in SECTIONS:
            self._check_section(name)
        self._check_combinations()

    def _check_section(self, name: str) -> None:
        """One section's checks: its own rules (``_check_<section>``, when it has some), then every field's declared
        range (:func:`dynlab.engine.option_spec.check_value`)."""
        own = getattr(self, f"_check_{name}", None)
        if own is not None:
            own()
        for field_name in SECTIONS[name]:
            check_value(BY_NAME[field_name], getattr(self, field_name))

    def _check_traffic(self) -> None:
        """The traffic's rules beyond ranges: arrival rates not vanishingly small, the duration, the closed loop,
        one workload."""
        for name in ("time_scale", "rate", "rate_scale"):
            v = getattr(self, name)
            if v is None and name != "time_scale":
                continue
            if not (v > 0 and math.isfinite(v) and math.isfinite(1000.0 / v)):
                raise ValueError(f"{name} must be a finite number > 0 (and not vanishingly small), got {v}")
        if self.duration is not None and not (self.duration > 0 and math.isfinite(self.duration)):
            raise ValueError(f"duration must be a finite number of seconds > 0, got {self.duration}")
        check_closed_loop(self.concurrency, self.num_requests, self.warmup)
        if self.workload is not None and self.trace is not None:
            raise ValueError("--workload and --trace are two workloads: give one")

    def _check_fleet(self) -> None:
        """The fleet's rules beyond ranges: ``split``, both P/D pools together, ``pools``, the spot discount (in
        :mod:`dynlab.models.prices`' words)."""
        if self.spot_discount:
            from dynlab.models.prices import check_discount

            check_discount(self.spot_discount)
        if self.split is not None:
            parse_split(self.split)
        if not self.pools and (self.prefill_workers is None) != (self.decode_workers is None):  # --pool: its rule
            raise ValueError("--prefill-workers and --decode-workers go together (a disaggregated fleet has both pools)")
        if self.pools:
            from dynlab.engine.pools import parse_pools

            parse_pools(self.pools)  # a malformed --pool, named

    def _check_slo(self) -> None:
        """The class SLOs' text (:func:`dynlab.engine.class_metrics.parse_class_slos`)."""
        parse_class_slos(self.slo_classes)

    def _check_combinations(self) -> None:
        """The rules across sections: the limits, the options that would have no effect, the cost, the LoRA
        adapters, SGLang's page in a block, and what async scheduling does not model."""
        from dynlab.limits import check_sim

        check_sim(self)  # sizes the machine cannot hold (dynlab/limits.py)
        check_effective(self)
        self._check_cost()
        check_lora(self)  # adapter settings vLLM refuses or dynlab does not model
        if self.engine_kind == "sglang" and self.block % self.page_size:
            raise ValueError(f"--page-size {self.page_size} must divide --block {self.block} (dynlab names the KV "
                             "of each block; a page is part of one)")
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
