"""Admission policies: the gateway in front of the router decides whether a request enters or is shed.

An admission policy (``--admission-policy NAME[:KEY=VALUE,...]``, a plugin kind:
:func:`dynlab.plugins.admission_policies`) is an :class:`AdmissionPolicy` subclass with a class attribute
``name``, built from its options (``KEY=VALUE`` text; unknown or bad ones raise ``ValueError`` in one
line), with one method: :meth:`AdmissionPolicy.admit`, asked for each arriving request in a timed run
before it is routed. A request it refuses is **shed**: never routed, never served, a failure for
``goodput`` (as a rejected one is), counted in the run's ``shed`` and, with ``--requests-out``, a record
whose ``shed`` is true. A policy is also a :class:`~dynlab.engine.metrics.Recorder`: it sees the requests
it admitted get their first token and finish (``on_first_token``, ``on_finish``, ``on_reject``), which is
how it knows what is queued.

**Holding** (llm-d's flow control: the gateway queues a request while the pool is saturated and dispatches
it when capacity frees, up to a time to live): :meth:`AdmissionPolicy.admit` may also answer :data:`WAIT`.
The gateway (:class:`dynlab.engine.holding.Gateway`) then holds the request in its class's FIFO and asks
again, head first, when a request gets its first token, finishes or is rejected or shed, and at the next
arrival; a new arrival of a class that has held requests joins the back of its FIFO unasked (no
overtaking). A request held longer than the policy's :attr:`AdmissionPolicy.max_wait_ms` is shed. Its
TTFT and E2E count from its arrival at the gateway (its engine request keeps that arrival time).

A policy may read the routers' load view and the run's latency model: :meth:`AdmissionPolicy.bind` gives it
a :class:`GatewayContext` before the first arrival.

``always`` (the default) admits every request and builds no gateway at all
(:func:`dynlab.sim.topology.build_policy` builds a run's policy from the registry); the built-in plugin
(``dynlab_builtins.admission``) registers it with ``queue-bound``, ``token-bucket`` and ``slo-shed``. Requests carry
their class and tenant as attributes (:func:`dynlab.routing.strategy.request_class`, ``request_tenant``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from dynlab.engine.metrics import Recorder

__all__ = ["AdmissionPolicy", "Always", "GatewayContext", "WAIT", "parse_policy"]


class _Wait:
    __slots__ = ()

    def __repr__(self) -> str:
        return "WAIT"


#: what :meth:`AdmissionPolicy.admit` answers to hold a request at the gateway (``True``: admit, ``False``: shed)
WAIT = _Wait()


@dataclass(frozen=True)
class GatewayContext:
    """What a gateway knows, given to :meth:`AdmissionPolicy.bind` before the first arrival.

    ``fleet``: the routers' load view (:class:`~dynlab.routing.strategy.FleetView`: per worker the requests in
    flight, those without a first token, their prompt tokens still to prefill), live; ``latency``: the
    workers' step latency model (:class:`~dynlab.latency.base.LatencyModel`); ``budget``: tokens per engine
    step (``--max-num-batched-tokens``); ``class_slos``: ``{class: (TTFT ms, TPOT ms)}`` of ``--slo``
    (``None`` where a class gives none)."""

    fleet: Any
    latency: Any
    budget: int
    class_slos: Mapping[str, tuple] = field(default_factory=dict)

def option_number(what: str, key: str, text: Optional[str], default: Optional[float] = None, *,
                  minimum: float = 0.0, integer: bool = False, maximum: Optional[float] = None) -> Optional[float]:
    """A plugin option's ``text`` (``KEY=VALUE`` of a :func:`parse_policy` spec; ``None``: absent, ``default``)
    as a finite number >= ``minimum`` (and <= ``maximum`` when given; an integer with ``integer``). Raises
    ``ValueError`` (``WHAT: KEY=TEXT must be ...``; ``what`` names the plugin, e.g. ``admission policy 'NAME:...'``)."""
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= minimum or value == float("inf") or (integer and value != int(value)):
        kind = "an integer" if integer else "a finite number"
        raise ValueError(f"{what}: {key}={text} must be {kind} >= {minimum:g}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{what}: {key}={text} must be at most {maximum:,.15g}")
    return int(value) if integer else value


def parse_policy(spec: str, kind: str = "admission policy") -> tuple[str, dict]:
    """``"NAME:KEY=VALUE,KEY=VALUE"`` -> ``(NAME, {KEY: VALUE})`` (text values; ``"NAME"`` alone: no options).
    Raises ``ValueError`` (one line, naming the ``kind`` of plugin: ``--controller`` parses its spec here too)
    for an empty name, an empty option, an option without ``=`` or one given twice."""
    name, colon, rest = str(spec).partition(":")
    name = name.strip()
    if not name:
        raise ValueError(f"{kind} {spec!r}: give NAME or NAME:KEY=VALUE,...")
    opts: dict = {}
    for part in (p.strip() for p in rest.split(",")) if colon else ():
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not key or not value.strip():
            raise ValueError(f"{kind} {spec!r}: {part!r} is not KEY=VALUE")
        if key in opts:
            raise ValueError(f"{kind} {spec!r}: {key} is given twice")
        opts[key] = value.strip()
    return name, opts


class AdmissionPolicy(Recorder):
    """Base class of admission policies; subclasses set ``name`` and implement :meth:`admit`.

    ``opts``: the policy's options as text (``KEY=VALUE`` of ``--admission-policy``); a subclass reads
    them in its ``__init__`` and raises ``ValueError`` (one line, naming the option) for an unknown or bad
    one. The run's JSON gains ``admission_policy`` (the spec) and ``shed`` (requests shed, the measured
    ones: those from ``warmup`` on)."""

    name: str = ""
    #: how long (ms) a request answered :data:`WAIT` may be held before it is shed (``None``: no limit)
    max_wait_ms: Optional[float] = None

    def __init__(self, opts: Mapping[str, str], spec: str = "", warmup: int = 0):
        self.spec = spec or self.name
        self.warmup = warmup
        self.shed = 0
        self.context: Optional[GatewayContext] = None

    def admit(self, request, now: float):
        """Whether ``request`` (a :class:`~dynlab.routing.strategy.Request`: its ``attrs``, lengths) arriving at
        ``now`` (ms), or held since it arrived, enters (``True``), is shed (``False``) or is held (:data:`WAIT`)."""
        raise NotImplementedError

    @classmethod
    def no_effect(cls, opts: Mapping[str, str], class_slos: Mapping[str, tuple]) -> Optional[str]:
        """Why this policy with options ``opts`` (text, as :meth:`__init__` takes them) would have no effect in a
        timed run whose ``--slo`` classes are ``class_slos`` (``{class: (TTFT ms, TPOT ms)}``, ``None`` where a
        class gives none), or ``None`` (the default: it may act). The option rules
        (:func:`dynlab.engine.option_rules.check_effective`) ask the policy ``--admission-policy`` names before
        any run and refuse it with ``--admission-policy has no effect REASON``, so the core names no policy."""
        return None

    def bind(self, context: GatewayContext) -> None:
        """Called once by the gateway before the first arrival: keeps ``context`` (:attr:`context`). A policy
        that needs something the run lacks raises ``ValueError`` (one line)."""
        self.context = context

    def on_shed(self, req) -> None:
        if not (self.warmup and req.id < self.warmup):
            self.shed += 1

    def result(self, engines: Sequence) -> dict[str, Any]:
        return {"admission_policy": self.spec, "shed": self.shed}

    @staticmethod
    def number(opts: Mapping[str, str], key: str, default: Optional[float] = None, *, minimum: float = 0.0,
               spec: str = "", integer: bool = False) -> Optional[float]:
        """The option ``key`` of ``opts`` as a finite number >= ``minimum`` (an integer with ``integer``;
        ``default`` when absent); ``ValueError`` naming it otherwise (:func:`option_number`)."""
        return option_number(f"admission policy {spec!r}", key, opts.get(key), default, minimum=minimum,
                             integer=integer)


class Always(AdmissionPolicy):
    """Admit every request (no gateway: the default)."""

    name = "always"

    def __init__(self, opts: Mapping[str, str], spec: str = "", warmup: int = 0):
        if opts:
            raise ValueError(f"admission policy {spec!r}: always takes no options, got {', '.join(opts)}")
        super().__init__(opts, spec, warmup)

    def admit(self, request, now: float) -> bool:
        return True
