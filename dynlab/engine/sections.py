""":class:`~dynlab.engine.config.SimConfig` in sections: seven read-only views of its flat fields.

:data:`SECTIONS` names the fields of each section (every field in exactly one); :class:`Sectioned`
gives a configuration one property per section and :meth:`Sectioned.from_sections`;
:func:`make_sections` builds the section classes (named tuples with the configuration's defaults).
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import MISSING, fields

#: section name -> its fields, every :class:`SimConfig` field in exactly one (``tests/sim/test_run_layer.py``)
SECTIONS: dict[str, tuple[str, ...]] = {
    "traffic": ("trace", "trace_format", "workload", "tokenizer", "keep_failed", "prefixes", "reps", "plen", "tail", "seed", "hash",
                "all_metrics", "time_scale", "rate", "rate_scale", "duration", "duration_repeat",
                "concurrency", "think_time_ms", "num_requests", "warmup"),
    "fleet": ("mode", "opts", "workers", "routers", "router_assign", "prefill_workers", "decode_workers", "split",
              "admission_policy", "controller", "pools", "price", "spot_discount"),
    "engine": ("timing", "max_num_batched_tokens", "max_num_seqs", "latency_model", "latency_opts", "latency_profile",
               "request_overhead_ms", "detok_us_per_token", "model", "gpu", "tp", "ep", "pp", "dp_attention", "gpu_memory_utilization", "engine_kind", "admission", "queue_policy",
               "async_scheduling",
               "spec_method", "spec_tokens", "spec_acceptance", "spec_draws", "spec_model",  # spec: issue 26
               "max_loras", "max_cpu_loras", "max_lora_rank", "lora_disk_gbps",  # LoRA adapters: issue 42
               "max_running_requests", "chunked_prefill_size", "max_prefill_tokens", "schedule_policy",  # SGLang's
               "page_size", "disable_radix_cache", "enable_mixed_chunk", "mem_fraction_static",
               "schedule_conservativeness", "init_new_token_ratio", "new_token_ratio_decay_steps",
               "spec_hash_rule"),  # spec_hash_rule: issue 43
    "kv": ("block", "trace_block", "capacity", "policy", "kv_cache_dtype", "cpu_capacity", "cpu_memory_gb",
           "pcie_gbps", "cpu_write"),
    "events": ("publish", "event_delay", "event_loss", "event_delay_ms"),
    "slo": ("slo_ttft_ms", "slo_tpot_ms", "slo_classes"),
    "disagg": ("decode_router", "link_gbps", "link_latency_ms", "overlap_transfer", "decode_prefix_cache"),
}



_CLASSES: dict = {}  # section name -> its class, filled by make_sections
_NAMES = {"traffic": "TrafficSection", "fleet": "FleetSection", "engine": "EngineSection", "kv": "KvSection",
          "events": "EventsSection", "slo": "SloSection", "disagg": "PdSection"}
_DOCS = {"traffic": "The traffic: a trace, a workload spec or the synthetic workload, names, seed, arrivals.",
         "fleet": "The fleet: the strategy (``mode``, ``opts``), workers, routers, P/D pools, its price.",
         "engine": "The timed engine: scheduler limits, latency model, hardware and parallelism, speculative decoding.",
         "kv": "The KV cache: block sizes, the pool and its policy, the KV dtype, the CPU tier.",
         "events": "The KV events: publishing, delay (requests or ms), loss.",
         "slo": "The SLOs of goodput (ms).",
         "disagg": "A P/D fleet: the decode router and the KV transfer link."}


def make_sections(config_cls) -> tuple:
    """The seven section classes of ``config_cls`` (a dataclass whose fields :data:`SECTIONS` covers),
    in :data:`SECTIONS` order: named tuples with its defaults (cheap to create at import, which the
    console script's start-up pays). Registers them for :class:`Sectioned`."""
    by_name = {f.name: f for f in fields(config_cls)}
    out = []
    for name, names in SECTIONS.items():
        defaults = [by_name[f].default if by_name[f].default_factory is MISSING else by_name[f].default_factory()
                    for f in names]
        cls = namedtuple(_NAMES[name], names, defaults=defaults, module=config_cls.__module__)
        cls.__doc__ = _DOCS[name] + " Fields and defaults: those of :class:`SimConfig` of the same names."
        _CLASSES[name] = cls
        out.append(cls)
    return tuple(out)


class Sectioned:
    """The section properties of :class:`~dynlab.engine.config.SimConfig` (a mixin of its flat fields)."""

    # -- the sections (frozen views of the flat fields, :data:`SECTIONS`) -----------------------------
    @property
    def traffic(self) -> tuple:  # TrafficSection
        """The traffic section: the trace, workload spec or synthetic workload, its block names, seed and
        arrivals (rates, duration). (Not ``workload``: that is the ``--workload`` field.)"""
        return self._section("traffic")

    @property
    def fleet(self) -> tuple:  # FleetSection
        """The fleet section: the strategy and its options, workers, router replicas, the P/D pool sizes."""
        return self._section("fleet")

    @property
    def engine(self) -> tuple:  # EngineSection
        """The engine section: ``timing``, vLLM's scheduler limits, the latency model and hardware."""
        return self._section("engine")

    @property
    def kv(self) -> tuple:  # KvSection
        """The KV section: block sizes, the pool (``capacity``, ``policy``) and the CPU tier."""
        return self._section("kv")

    @property
    def events(self) -> tuple:  # EventsSection
        """The KV-events section: ``publish``, delays (requests, ms) and loss."""
        return self._section("events")

    @property
    def slo(self) -> tuple:  # SloSection
        """The SLO section: ``slo_ttft_ms`` and ``slo_tpot_ms`` (goodput)."""
        return self._section("slo")

    @property
    def disagg(self) -> tuple:  # PdSection
        """The P/D section: the decode router and the KV transfer (``link_gbps`` ...)."""
        return self._section("disagg")

    def _section(self, name: str):
        return _CLASSES[name](**{f: getattr(self, f) for f in SECTIONS[name]})

    @classmethod
    def from_sections(cls, **sections) -> "Sectioned":  # a SimConfig
        """A configuration from section objects (``traffic=TrafficSection(...)``, ...); a section not
        given keeps its defaults. Raises ``TypeError`` for an unknown section name or a wrong object."""
        flat: dict = {}
        for name, section in sections.items():
            if name not in SECTIONS or not isinstance(section, _CLASSES[name]):
                raise TypeError(f"from_sections: {name}= must be a {_CLASSES[name].__name__}"
                                if name in SECTIONS else f"from_sections: unknown section {name!r} "
                                f"(sections: {', '.join(SECTIONS)})")
            flat.update(section._asdict())
        return cls(**flat)

