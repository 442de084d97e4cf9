""":class:`~dynlab.engine.config.SimConfig` in sections: seven read-only views of its flat fields.

:data:`SECTIONS` names the fields of each section (every field in exactly one); :class:`Sectioned`
gives a configuration one property per section and :meth:`Sectioned.from_sections`;
:func:`make_sections` builds the section classes (named tuples with the configuration's defaults).
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import MISSING, fields

from dynlab.engine.option_spec import section_fields
from dynlab.engine.options import FIELD_ORDER, OPTIONS

#: section name -> its fields, every :class:`SimConfig` field in exactly one (``tests/sim/test_run_layer.py``), from
#: each declaration's section (:data:`dynlab.engine.options.OPTIONS`), in the configuration's field order
SECTIONS: dict[str, tuple[str, ...]] = section_fields(OPTIONS, FIELD_ORDER)


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

