"""Controllers: what adds and retires a timed fleet's workers during a run (``--controller NAME[:KEY=VALUE,...]``).

A controller (a plugin kind: :func:`dynlab.plugins.controllers`) is a :class:`Controller` subclass with a class
attribute ``name``, built from its options (``KEY=VALUE`` text, as ``--admission-policy``'s:
:func:`dynlab.engine.gateway.parse_policy`), with one method: :meth:`Controller.decide`, called every
``period`` seconds of simulated time (the option ``period``, every controller's; default 1 s) with a
:class:`FleetState` (what a fleet's operator can observe), returning :class:`Add` and :class:`Retire`
decisions that the fleet applies at once (:class:`dynlab.engine.elastic.Elastic`).

In a P/D fleet (``--split P:D``) the controller scales the decode pool: its :class:`FleetState` has ``pool``
``"decode"`` and lists the decode workers (ids ``0..`` within that pool), and its decisions name that pool (``pool``
``"decode"``, or ``""``: the pool of the state decided on); with ``scales_prefill`` (an autoscaler given
``prefill_min=`` or ``prefill_max=``) it is called for the prefill pool too, each period, with a :class:`FleetState` of
``pool`` ``"prefill"`` (the prefill workers, ids ``0..`` within that pool), before the decode pool's call; otherwise
the prefill pool keeps ``P`` workers (:mod:`dynlab.disagg.elastic`; a decision naming ``"prefill"`` is refused).

``none`` (the default) builds no controller at all and leaves the fleet fixed
(:func:`dynlab.sim.control.build_controller`); the built-in plugin (``dynlab_builtins.controllers``) registers
it. A controller is the seam an autoscaler (NVIDIA Dynamo's Planner: SLA-based scaling from observed TTFT, ITL
and arrivals) plugs into; ``Add.ready_in_s`` is where a cold start goes.
"""
from __future__ import annotations

from typing import Mapping, NamedTuple, Optional, Sequence, Union

from dynlab.engine.gateway import option_number
from dynlab.limits import HORIZON_MS

__all__ = ["Add", "Controller", "FleetState", "NoController", "Retire", "RunInfo", "StepSample", "WorkerState"]

#: a worker's states: added, not routable before its ready time; routable; retired, finishing what it holds
STARTING, LIVE, DRAINING = "starting", "live", "draining"


class WorkerState(NamedTuple):
    """One worker (not yet left) as a controller sees it: ``id`` (never reused), ``state`` (``starting``,
    ``live`` or ``draining``), ``ready_s`` (when it became or becomes routable, s), ``waiting`` and
    ``running`` (requests in its engine's waiting queue and running batch), ``kv_usage`` (blocks held by
    requests / its pool's blocks, 0 to 1), ``active`` (requests routed to it and not finished), and what a
    latency estimate needs (NVIDIA Dynamo's ForwardPassMetrics, ``queued_requests``): ``queued_prefill_tokens``
    (prompt tokens its waiting and running requests have still to compute), ``kv_tokens`` (tokens of KV its
    requests hold: blocks x block size), ``kv_capacity_tokens`` (its pool's) and ``max_batched_tokens`` (its step's
    token budget)."""

    id: int
    state: str
    ready_s: float
    waiting: int
    running: int
    kv_usage: float
    active: int
    queued_prefill_tokens: int = 0
    kv_tokens: int = 0
    kv_capacity_tokens: int = 0
    max_batched_tokens: int = 0
    #: the worker's pool: ``""`` in an aggregated fleet, ``"decode"`` or ``"prefill"`` in a P/D one (module docstring)
    pool: str = ""


class FleetState(NamedTuple):
    """What :meth:`Controller.decide` observes at ``now_s`` (s of simulated time): ``workers`` (every worker
    that has not left, ascending ids), ``arrivals`` (requests that arrived in the last ``period_s`` seconds,
    shed ones included; requeued ones not), ``ttft_ms`` (the client TTFTs, ms, of the first tokens in it) and
    ``weight_bytes`` (B of one worker's model weights, the catalogue's: what a cold start loads,
    :func:`dynlab.engine.autoscale.cold_start_s`; 0 when unknown) and ``steps``: the engine iterations that ended in
    the period, each a :class:`StepSample` (a bulk run of decode steps: one sample per run, at its mean step time);
    ``prompt_tokens``: the prompt tokens of the period's arrivals; ``finished`` and ``output_tokens``: the requests that
    finished in the period and their output tokens (a frontend's ISL and OSL metrics, NVIDIA Dynamo Planner's);
    ``pool``: the pool ``workers`` and ``steps`` are of (``""`` aggregated, ``"decode"`` in a P/D fleet, whose
    ``arrivals`` and ``ttft_ms`` are the fleet's: its prefill workers' first tokens)."""

    now_s: float
    period_s: float
    workers: tuple
    arrivals: int
    ttft_ms: tuple
    weight_bytes: float = 0.0
    steps: tuple = ()
    prompt_tokens: int = 0
    finished: int = 0
    output_tokens: int = 0
    pool: str = ""


class RunInfo(NamedTuple):
    """What a controller may read of the run once, before its first call (:meth:`Controller.bind`): ``latency`` (one
    worker's step-time model, a :class:`~dynlab.latency.base.LatencyModel`: the calibrated one with
    ``--latency-profile``), ``gpus`` (GPUs per worker), ``max_num_seqs``, ``max_batched_tokens`` (a step's token
    budget), ``kv_capacity_tokens`` (one worker's KV pool, tokens) and ``config`` (the run's
    :class:`~dynlab.engine.config.SimConfig`: what a replay of one worker starts from)."""

    latency: object
    gpus: int
    max_num_seqs: int
    max_batched_tokens: int
    kv_capacity_tokens: int
    config: object = None


class StepSample(NamedTuple):
    """One engine iteration as NVIDIA Dynamo's ForwardPassMetrics report it: ``worker``, ``prefill_tokens`` (prompt
    tokens computed), ``prefill_requests``, ``decode_requests``, ``kv_tokens`` (tokens of KV held by requests during
    it: blocks x block size, dynlab's stand-in for ``sum_decode_kv_tokens``), ``ms`` (its wall time), ``end_s`` (when
    it ended, s of simulated time) and ``steps`` (1; a bulk run of decode steps: its steps, ``ms`` their mean and
    ``end_s`` the last one's end)."""

    worker: int
    prefill_tokens: int
    prefill_requests: int
    decode_requests: int
    kv_tokens: int
    ms: float
    end_s: float = 0.0
    steps: int = 1


class Add(NamedTuple):
    """Add one worker now (a new id) to ``pool`` (``""``: the fleet's elastic pool, ``"decode"`` in a P/D fleet); it is
    routable ``ready_in_s`` seconds later (0: at once)."""

    ready_in_s: float = 0.0
    pool: str = ""


class Retire(NamedTuple):
    """Retire worker ``worker``: no new route from now on; it finishes what it holds and leaves (drain, the
    default), or with ``kill`` leaves now, its requests sent back through the router as new arrivals that keep
    their first arrival time (counted in the run's ``requeued``). ``pool``: as :class:`Add`'s (``worker`` is an id
    within it)."""

    worker: int
    kill: bool = False
    pool: str = ""


Decision = Union[Add, Retire]


#: the shortest controller period (s): one millisecond, the unit of the simulated clock
MIN_PERIOD_S = 0.001


class Controller:
    """Base class of controllers; subclasses set ``name`` and implement :meth:`decide`.

    ``opts``: the options as text (``KEY=VALUE`` of ``--controller``). The base reads ``period`` (seconds
    between calls, > 0; default 1); a subclass reads its own with :meth:`number` in its ``__init__``, and an
    option nobody read is refused when the run builds it (:meth:`unread`). The run's JSON gains
    ``controller`` (the spec) and the per-worker lifetimes (:class:`dynlab.engine.elastic.Elastic`)."""

    name: str = ""
    #: ``period``'s default (s), a subclass's to change (Kubernetes HPA's sync period is 15 s)
    default_period_s: float = 1.0
    #: s between a metric and the controller's sight of it: :meth:`decide` gets the state observed this long
    #: before the call and its decisions apply at the call (:class:`dynlab.sim.control.Control`); 0: at once
    scrape_delay_s: float = 0.0
    #: s before the router learns of a join or a leave (:class:`dynlab.engine.elastic.Elastic`); 0: at once
    discovery_delay_s: float = 0.0
    #: whether a P/D fleet's prefill pool scales too (module docstring)
    scales_prefill: bool = False

    def __init__(self, opts: Mapping[str, str], spec: str = ""):
        self.spec = spec or self.name
        self._opts = dict(opts)
        # at least a millisecond (the clock's unit; a shorter period makes a call per event and never ends on a
        # long trace), at most the clock's horizon
        self.period_s = self.number("period", self.default_period_s, minimum=MIN_PERIOD_S, maximum=HORIZON_MS / 1000.0)

    def decide(self, state: FleetState) -> Sequence[Decision]:
        """The decisions to apply now (``[]``: none), given ``state`` (:class:`FleetState`)."""
        raise NotImplementedError

    @classmethod
    def no_effect(cls, opts: Mapping[str, str], pd: bool) -> Optional[str]:
        """Why this controller with ``opts`` (text) would do nothing as asked in a P/D fleet (``pd``) or an aggregated
        one, completing "--controller has no effect ..." (refused by the option rules); ``None``: it works there."""
        return None

    def bind(self, info: RunInfo) -> None:
        """Read the run's :class:`RunInfo` once, before the first call (default: nothing)."""

    def number(self, key: str, default: Optional[float] = None, *, minimum: float = 0.0,
               integer: bool = False, maximum: Optional[float] = None) -> Optional[float]:
        """The option ``key`` as a finite number >= ``minimum`` (<= ``maximum`` when given; an integer with
        ``integer``; ``default`` when absent); ``ValueError`` naming it otherwise. Reading an option marks it read."""
        return option_number(f"controller {self.spec!r}", key, self._opts.pop(key, None), default, minimum=minimum,
                             integer=integer, maximum=maximum)

    def text(self, key: str, default: Optional[str] = None) -> Optional[str]:
        """The option ``key`` as text (``default`` when absent). Reading an option marks it read."""
        return self._opts.pop(key, default)

    def unread(self) -> list:
        """The options given that no one read (unknown to this controller)."""
        return sorted(self._opts)


class NoController(Controller):
    """No controller: the fleet keeps its workers for the whole run (the default)."""

    name = "none"

    def __init__(self, opts: Mapping[str, str], spec: str = ""):
        if opts:
            raise ValueError(f"controller {spec!r}: none takes no options, got {', '.join(opts)}")
        super().__init__(opts, spec)

    def decide(self, state: FleetState) -> Sequence[Decision]:
        return ()
