"""The routing-strategy interface: ``Strategy``, ``Request``, the run context and the fleet view.

Strategies are plugins (see :mod:`dynlab.hookspecs`). A strategy never reads a
worker's cache: it learns only what it routed, what KV events told it, and the
read-only :class:`FleetView`.
"""
from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Hashable, Mapping, Optional, Sequence

from dynlab.routing.events import KvEvent
from dynlab.slots import quick_maker, quick_replacer

#: the attributes of a request that has none: one shared empty read-only mapping (``Request.attrs``'s default)
NO_ATTRS: Mapping[str, Any] = MappingProxyType({})
#: the class (and tenant) of a request whose attributes name none
DEFAULT_CLASS = "default"


def request_class(attrs: Mapping[str, Any]) -> str:
    """A request's class: its ``class`` attribute (a trace field or a workload spec's), else (none, or empty)
    ``default`` (``attrs``: :attr:`Request.attrs`)."""
    return attrs.get("class") or DEFAULT_CLASS


def request_tenant(attrs: Mapping[str, Any]) -> str:
    """A request's tenant: its ``tenant`` attribute, else its ``user``, else (none, or empty) ``default``."""
    return attrs.get("tenant") or attrs.get("user") or DEFAULT_CLASS


@dataclass(frozen=True, slots=True)
class Request:
    """One request as the router sees it.

    - ``hashes``: the prompt's block names in order (chained, so each names its whole prefix).
    - ``input_length``: prompt tokens; ``output_length``: generated tokens (0 if unknown).
    - ``timestamp``: arrival time in ms (``None`` when the workload has none); in a timed run
      (``--timing``) the strategy sees the simulated arrival time (trace timestamp times
      ``--time-scale``, or the Poisson arrival), the clock a router has.
    - ``index``: position in the workload, from 0.
    - ``prefix``: the seed workload's prefix id (``None`` for traces).
    - ``runs`` (dynlab's own, ``None``: not given): ``hashes`` as runs ``(first name, count)`` in
      order (names ``first .. first + count - 1``), when the timed engine names blocks by trace
      block (:func:`dynlab.engine.names.engine_block_runs`); an index keyed by runs reads it
      (:meth:`dynlab.routing.run_index.RunIndex.find_matches`). Not compared, not shown.
    - ``output_hashes`` (``None``: the trace gives no reply token ids): the names of the full blocks
      past the prompt's that a finished request has computed, the chain of ``hashes`` continued over the
      prompt and the reply's first ``output_length - 1`` tokens (the last one's KV is never computed);
      a token trace's ``output_tokens`` (:class:`dynlab_builtins.trace_formats.TokenTrace`). Not shown.
    - ``attrs``: the request's attributes, a read-only mapping of the trace fields its format carries
      (:attr:`dynlab.traces.format.TraceFormat.attributes`: ``priority`` an int; ``tenant``, ``user``,
      ``lora_name``, ``session_id``, ``class`` strings; a format plugin's own), for strategies, recorders and
      policies to read; :data:`NO_ATTRS` (shared, empty) when it has none. Not compared, not shown.
    """

    hashes: tuple
    input_length: int = 0
    output_length: int = 0
    timestamp: Optional[float] = None
    index: int = 0
    prefix: Optional[Hashable] = None
    runs: Optional[Sequence[tuple]] = field(default=None, compare=False, repr=False)
    output_hashes: Optional[tuple] = field(default=None, repr=False)
    attrs: Mapping[str, Any] = field(default=(), compare=False, repr=False)  # NO_ATTRS: set below


def _set_default(cls: type, name: str, value: Any) -> None:
    """Make ``value`` the last field ``name``'s default after the class is built: Python 3.11's dataclasses
    refuse an unhashable default (a ``MappingProxyType``) that a ``default_factory`` would rebuild per object."""
    f = cls.__dataclass_fields__[name]
    assert list(cls.__dataclass_fields__)[-1] == name and f.default == ()
    f.default = value
    cls.__init__.__defaults__ = cls.__init__.__defaults__[:-1] + (value,)


_set_default(Request, "attrs", NO_ATTRS)


#: ``Request(hashes, input_length, output_length, timestamp, index)`` (every other field its default),
#: about twice as fast as the constructor (:func:`dynlab.slots.quick_maker`): a trace reader makes one a row
make_request = quick_maker(Request, ("hashes", "input_length", "output_length", "timestamp", "index"))
#: ``dataclasses.replace(request, hashes=, timestamp=, runs=)``, faster (:func:`dynlab.slots.quick_replacer`):
#: the timed fleet's request as routed, every other field (``attrs`` among them) the workload's
reroute = quick_replacer(Request, ("hashes", "timestamp", "runs"))


@dataclass(frozen=True)
class RunContext:
    """What a strategy gets at construction.

    - ``workers``: number of workers (ids ``0..workers-1``); ``block``: tokens per block.
    - ``rng``: the run's ``random.Random`` (the seed workload's shuffle uses it first;
      strategies that draw must draw from it, once per decision, in request order).
    - ``options``: strategy options from ``--opt NAME=VALUE``, already converted.
    - ``publish``: whether workers publish KV events in this run.
    - ``timed``: whether the run is timed (``--timing``): requests carry the simulated arrival
      time and the fleet view carries load; count-based runs have neither.
    - ``pool_blocks``: each worker's KV pool in blocks as the deployment configures it
      (``--capacity``, or with ``--timing`` the hardware-derived pool), ``None`` when unbounded
      or not known yet (a configuration checked before the run).
    - ``max_loras``: each worker's LoRA adapter slots as the deployment configures them (``--max-loras``),
      ``None`` when the workers do not model adapters.
    """

    workers: int
    block: int = 16
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    options: Mapping[str, Any] = field(default_factory=dict)
    publish: bool = True
    timed: bool = False
    pool_blocks: Optional[int] = None
    max_loras: Optional[int] = None


class _ReadOnlyList(Sequence):
    """A read-only window on a list the engine keeps updating (no copy per request)."""

    __slots__ = ("_data",)

    def __init__(self, data: list):
        self._data = data

    def __getitem__(self, i):
        return self._data[i]

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self):
        return iter(self._data)

    def __repr__(self) -> str:
        return f"ReadOnly({self._data!r})"


class FleetView:
    """Read-only view of the workers at routing time.

    - ``len(fleet)`` / ``fleet.workers``: number of workers.
    - ``fleet.requests[w]``: requests routed to worker ``w`` so far.
    - ``fleet.active_requests[w]``, ``fleet.active_blocks[w]``: requests in flight
      and the blocks they pin (0 without ``--timing``).
    - ``fleet.queued_prefill_tokens[w]``: prompt tokens waiting for prefill (0 without ``--timing``).
    - ``fleet.cached_blocks[w]``: blocks in the worker's KV cache.
    - ``fleet.waiting_requests[w]``: requests in flight that have no first token yet (queued or
      prefilling; 0 without ``--timing``).
    - ``fleet.routable``: the ids of the workers a request may be routed to now, ascending. In a fixed
      fleet every id ``0..workers-1``; in an elastic one (``--controller``, :mod:`dynlab.engine.elastic`)
      ``workers`` counts every id given so far (ids are never reused) and ``routable`` leaves out the
      workers not ready yet and those retired. A strategy that picks among ``routable`` works in both.
    - ``fleet.lora_adapters[w]``: the LoRA adapters of the requests in flight on ``w``, a read-only mapping
      ``lora_name -> requests`` (do not change it; empty without ``--timing``): what vLLM's ``vllm:lora_requests_info`` metric
      (its running and waiting adapters) tells llm-d's router, known here at once from the router's own requests.
    - ``fleet.pool[w]``: the index of ``w``'s pool (``--pool``, :mod:`dynlab.engine.pools`; 0 in a fleet of one GPU
      and tp); ``fleet.gpu[w]``: its GPU's name (``None`` without ``--timing``); ``fleet.kv_blocks[w]``: its KV pool
      in blocks as the deployment configures it (what vLLM logs at start-up as its GPU blocks; ``None`` without
      ``--timing``). What a router knows of a mixed fleet from its configuration: it may weigh a worker's load
      against its own pool (the built-ins' choices: docs/engine.md, mixed GPU pools).

    Each attribute is a live read-only sequence: reading it copies nothing.
    """

    __slots__ = ("workers", "requests", "active_requests", "active_blocks", "queued_prefill_tokens", "cached_blocks",
                 "waiting_requests", "routable", "lora_adapters", "pool", "gpu", "kv_blocks")

    def __init__(self, requests: list, active_requests: list, active_blocks: list,
                 queued_prefill_tokens: list, cached_blocks: list, waiting_requests: Optional[list] = None,
                 routable: Optional[list] = None, lora_adapters: Optional[list] = None):
        self.workers = len(requests)
        self.routable = _ReadOnlyList(routable if routable is not None else list(range(len(requests))))
        self.requests = _ReadOnlyList(requests)
        self.active_requests = _ReadOnlyList(active_requests)
        self.active_blocks = _ReadOnlyList(active_blocks)
        self.queued_prefill_tokens = _ReadOnlyList(queued_prefill_tokens)
        self.cached_blocks = _ReadOnlyList(cached_blocks)
        self.waiting_requests = _ReadOnlyList(waiting_requests if waiting_requests is not None
                                              else [0] * len(requests))
        self.lora_adapters = _ReadOnlyList(lora_adapters if lora_adapters is not None
                                           else [NO_ATTRS] * len(requests))
        self.pool = _ReadOnlyList([0] * len(requests))  # a timed fleet sets these three (set_hardware)
        self.gpu = self.kv_blocks = _ReadOnlyList([None] * len(requests))

    def set_hardware(self, pool: list, gpu: list, kv_blocks: list) -> None:
        """Show ``pool``, ``gpu`` and ``kv_blocks`` (per-worker lists the fleet keeps, read live) as the view's."""
        self.pool, self.gpu, self.kv_blocks = _ReadOnlyList(pool), _ReadOnlyList(gpu), _ReadOnlyList(kv_blocks)

    def __len__(self) -> int:
        return self.workers


@dataclass(frozen=True)
class StrategyOption:
    """One ``--opt NAME=VALUE`` a strategy accepts: name, type (int/float/str/bool), default, help,
    and for numbers an optional inclusive ``minimum`` / ``maximum``. ``needs_cpu_tier``: the option
    weighs blocks in the workers' CPU tiers, so a run without one (no ``--cpu-capacity`` or
    ``--cpu-memory-gb`` with ``--timing``) refuses it when given (it would have no effect)."""

    name: str
    type: type
    default: Any
    help: str = ""
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    needs_cpu_tier: bool = False

    def convert(self, text: str) -> Any:
        """Parse ``text``; raises ``ValueError`` naming the option when it does not fit the type or range."""
        if self.type is bool:
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"option {self.name!r} takes a boolean (yes/no), got {text!r}")
        try:
            value = self.type(text)
        except ValueError:
            kind = "an int" if self.type is int else f"a {self.type.__name__}"
            raise ValueError(f"option {self.name!r} takes {kind}, got {text!r}") from None
        if self.type is float and not math.isfinite(value):
            raise ValueError(f"option {self.name!r} takes a finite number, got {text!r}")
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"option {self.name!r} must be >= {self.minimum}, got {text!r}")
        if self.maximum is not None and value > self.maximum:
            raise ValueError(f"option {self.name!r} must be <= {self.maximum}, got {text!r}")
        return value


class Strategy(ABC):
    """Base class of routing strategies. The first docstring line is shown by ``dynlab strategies``.

    Subclasses set ``name`` (the ``--mode`` value) and implement :meth:`route`.
    ``options`` declares the ``--opt NAME=VALUE`` the strategy accepts; their
    converted values arrive in ``ctx.options`` (defaults filled in).
    ``uses_events`` marks strategies that learn from KV events, so runs report ``publish``.
    ``needs_timing`` marks strategies that read what only a timed run has (requests in flight): refused
    without ``--timing`` (:func:`dynlab.engine.run.build_strategy`).
    A strategy that keeps an index sets ``self.predicted`` in :meth:`route` to the
    number of leading blocks it believes the chosen worker holds; the engine sums
    it into ``predicted_blocks`` and ``prediction_error`` (``None``: no index).
    """

    name: ClassVar[str] = ""
    options: ClassVar[Sequence[StrategyOption]] = ()
    uses_events: ClassVar[bool] = False
    needs_timing: ClassVar[bool] = False
    predicted: Optional[int] = None
    #: ``None`` (default), or a callable ``on_change(worker, stored, removed)`` the count-based replay calls
    #: instead of :meth:`on_event` with a served request's net change when its events reach the strategy at
    #: once (no ``event_delay``, no ``event_loss``): it must do what ``on_event(BlockRemoved(worker,
    #: tuple(removed)))`` (when ``removed``) then ``on_event(BlockStored(worker, tuple(stored)))`` (when
    #: ``stored``) would; ``stored`` and ``removed`` are block names in prefix order, read and not kept. It is
    #: used only while it and ``on_event`` are methods of one object (replacing ``on_event`` turns it off)
    on_change: Optional[Callable] = None

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def option(self, name: str) -> Any:
        """The value of the declared option ``name``: from ``ctx.options``, else its default.

        Raises ``KeyError`` for a name the class does not declare in ``options``.
        """
        if name in self.ctx.options:
            return self.ctx.options[name]
        for o in self.options:
            if o.name == name:
                return o.default
        raise KeyError(f"strategy {self.name!r} declares no option {name!r}")

    @abstractmethod
    def route(self, request: Request, fleet: FleetView) -> int:
        """Return the worker (``0..fleet.workers-1``) that serves ``request``."""

    def refused_events(self) -> Optional[Mapping[str, int]]:
        """Stored events the strategy's index refused: ``{"block_size": n, "parent": m, "stored": k}``
        (``k``: stored events received)
        (:meth:`dynlab.routing.index.KvIndex.apply_event`), or ``None`` (default: no index)."""
        return None

    def on_event(self, event: KvEvent) -> None:
        """Receive a KV event from a worker (default: ignore)."""

    def on_join(self, worker: int) -> None:
        """Worker ``worker`` (a new id, never reused) became routable: it is in ``fleet.routable`` from now on
        (an elastic fleet, ``--controller``; default: nothing). A strategy keeping per-worker state sizes it here."""

    def on_leave(self, worker: int) -> None:
        """Worker ``worker`` was retired: it is no longer in ``fleet.routable`` and its KV events no longer reach
        :meth:`on_event` (default: nothing). A strategy keeping an index drops the worker's blocks here.

        A strategy that still returns a worker not in ``fleet.routable`` (one written for fixed fleets, which
        picks from ``range(fleet.workers)``) keeps working: the fleet sends that request to the routable worker
        with the fewest active requests (lowest id on a tie) and counts it in the run's ``misrouted``."""
