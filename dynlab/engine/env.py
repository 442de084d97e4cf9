"""The run environment of a timed fleet: one object instead of a dozen keyword arguments; the arrivals.

Arrivals (:func:`arrival_times`): trace timestamps (ms) times ``time_scale``; a workload without
timestamps arrives as a Poisson process of ``rate`` requests/s from its own RNG. Timestamps must not
go backwards (the trace readers refuse such traces).

A :class:`RunEnv` holds what every topology runs in: the event loop (the clock), the KV-event bus,
the arrivals (``(request, ms)`` in workload order), the routing recorder, the other recorders
(:class:`~dynlab.engine.metrics.Recorder`, the serving recorder first) and the progress bar.
:meth:`RunEnv.timed` builds one from the configuration's sections.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional, Sequence

from dynlab.engine.bus import EventBus
from dynlab.engine.class_metrics import ClassMetrics, parse_class_slos
from dynlab.engine.config import POISSON_RATE, EventsSection, SloSection, TrafficSection
from dynlab.engine.holding import Gateway
from dynlab.engine.loop import EventLoop
from dynlab.engine.metrics import Recorder, RoutingMetrics, ServingMetrics
from dynlab.limits import HORIZON_MS, past_horizon
from dynlab.routing.strategy import Request


def arrival_times(requests: Iterable[Request], time_scale: float, rate: float,
                  rng: random.Random) -> Iterator[tuple[Request, float]]:
    """``(request, arrival ms)`` in workload order; raises ``ValueError`` when timestamps go backwards,
    or when an arrival is past :data:`~dynlab.limits.HORIZON_MS` (naming ``--time-scale`` or ``--rate``)."""
    now = 0.0
    for req in requests:
        if req.timestamp is None:
            now += rng.expovariate(rate) * 1000.0
            if not now <= HORIZON_MS:
                raise past_horizon(now, f"request {req.index}'s Poisson arrival at --rate {rate:g} requests/s",
                                   "use a larger --rate")
        else:
            t = req.timestamp * time_scale
            if t < now:
                raise ValueError(f"request {req.index}: timestamp {req.timestamp} is earlier than the previous "
                                 f"request's; timed runs need arrivals in time order")
            if not t <= HORIZON_MS:
                raise _arrival_past_horizon(req, t, time_scale)
            now = t
        yield req, now


def check_arrivals(requests: Sequence[Request], time_scale: float) -> None:
    """Raise the ``ValueError`` :func:`arrival_times` would raise for a timestamp times ``time_scale``
    past :data:`~dynlab.limits.HORIZON_MS`, before anything runs. ``requests``: a loaded trace,
    in time order (the readers refuse others), so its last timestamp is the latest arrival."""
    if not requests or requests[-1].timestamp is None or requests[-1].timestamp * time_scale <= HORIZON_MS:
        return
    for req in requests:
        t = req.timestamp * time_scale
        if not t <= HORIZON_MS:
            raise _arrival_past_horizon(req, t, time_scale)


def _arrival_past_horizon(req: Request, t: float, time_scale: float) -> ValueError:
    return past_horizon(t, f"request {req.index}'s arrival (timestamp {req.timestamp} ms x --time-scale "
                           f"{time_scale:g})", "use a smaller --time-scale")


@dataclass
class RunEnv:
    """``loop``, ``bus``, ``arrivals`` (an iterator of ``(Request, arrival ms)``), ``routing`` (the
    routing recorder, sized to the workers the strategy routes to), ``recorders`` (serving first, then
    any others, in the order their keys appear in the result), ``progress`` (a tqdm bar or ``None``)."""

    loop: EventLoop
    bus: EventBus
    arrivals: Optional[Iterator]
    routing: RoutingMetrics
    recorders: list = field(default_factory=list)
    progress: Any = None
    closed_loop: Any = None  # a ClosedLoop (dynlab.engine.closed) when the users send as requests finish
    gate: Any = None  # the gateway (dynlab.engine.holding.Gateway) of the admission policy, None: every request enters

    def attach(self, fleet) -> None:
        """Give the closed-loop users (if any) the ``fleet``'s ``arrive``; call it before ``fleet.run()``."""
        if self.closed_loop is not None:
            self.closed_loop.attach(fleet.arrive)

    @property
    def serving(self) -> ServingMetrics:
        """The serving recorder (the first of :attr:`recorders`)."""
        return self.recorders[0]

    @classmethod
    def timed(cls, requests: Iterable, strategy, workers: int, *, traffic: TrafficSection = TrafficSection(),
              events: EventsSection = EventsSection(), slo: SloSection = SloSection(),
              loss_rng: Optional[random.Random] = None, arrival_rng: Optional[random.Random] = None,
              recorders: Sequence[Recorder] = (), progress=None, front_ms: float = 0.0,
              token_ms: float = 0.0, gate=None) -> "RunEnv":
        """The environment of a timed run of ``requests`` routed by ``strategy`` to ``workers`` workers.

        Arrivals: with ``traffic.concurrency``, closed loop (:class:`~dynlab.engine.closed.ClosedLoop`:
        that many users, ``traffic.think_time_ms``, none sent after ``traffic.duration`` s; call
        :meth:`attach` with the fleet); else trace timestamps times ``traffic.time_scale``, or Poisson at ``traffic.rate``
        (``None``: :data:`~dynlab.engine.config.POISSON_RATE`) requests/s from ``arrival_rng`` (default: seeded ``dynlab-arrivals-<seed>``, the run's own),
        except session turns a workload spec sends after the previous answer (``requests.follows``:
        :class:`~dynlab.engine.closed.SessionTurns`, attached as the closed-loop users are);
        KV events: ``events.publish``, ``events.event_delay_ms``, ``events.event_loss`` (draws from
        ``loss_rng``); goodput SLOs from ``slo``; the serving metrics leave out requests whose id is below
        ``traffic.warmup``. ``recorders`` follow the serving recorder. ``front_ms``: the server's front end
        before the engine sees a request (in every TTFT and E2E; a closed-loop user's next request
        reaches the engine that much later too); ``token_ms``: detokenisation and streaming per output
        token (:class:`~dynlab.engine.metrics.ServingMetrics`; a closed-loop user sees its last token
        ``token_ms`` x its output tokens after the engine's finish). ``gate``: the gateway's admission policy
        (:mod:`dynlab.engine.gateway`; ``None``: none), a recorder right after the serving one, then its
        :class:`~dynlab.engine.holding.Gateway` (:attr:`gate`: it holds requests), then the
        per-class figures (:class:`~dynlab.engine.class_metrics.ClassMetrics`: ``slo.slo_classes``).
        """
        loop = EventLoop()
        bus = EventBus(loop, strategy.on_event, delay_ms=events.event_delay_ms, loss=events.event_loss,
                       rng=loss_rng, publish=events.publish == "yes")
        rng = arrival_rng or random.Random(f"dynlab-arrivals-{traffic.seed}")
        class_slos = parse_class_slos(slo.slo_classes)
        serving = ServingMetrics(slo.slo_ttft_ms, slo.slo_tpot_ms, warmup=traffic.warmup, front_ms=front_ms,
                                 token_ms=token_ms, class_slos=class_slos)
        classes = ClassMetrics(class_slos, slo.slo_ttft_ms, slo.slo_tpot_ms, traffic.warmup, front_ms, token_ms)
        if gate is not None:  # the policy, then its gateway (holding: dynlab.engine.holding), as recorders
            policy, gate = gate, Gateway(gate, loop, class_slos, traffic.warmup)
            recorders = [policy, gate, classes, *recorders]
        else:
            recorders = [classes, *recorders]
        if traffic.concurrency is not None:  # closed loop: the users' recorder sends requests as others finish
            from dynlab.engine.closed import ClosedLoop

            stop = None if traffic.duration is None else traffic.duration * 1000.0
            users = ClosedLoop(requests, traffic.concurrency, loop, traffic.think_time_ms + front_ms, stop,
                               token_ms=token_ms)
            return cls(loop, bus, users.initial(), RoutingMetrics(workers), [serving, *recorders, users], progress,
                       users, gate)
        rate = POISSON_RATE if traffic.rate is None else traffic.rate
        arrivals = arrival_times(requests, traffic.time_scale, rate, rng)
        follows = getattr(requests, "follows", None)
        if follows:  # closed session turns: sent after the previous turn's answer
            from dynlab.engine.closed import SessionTurns

            turns = SessionTurns(requests, follows, loop, front_ms, token_ms)
            return cls(loop, bus, turns.initial(arrivals), RoutingMetrics(workers), [serving, *recorders, turns],
                       progress, turns, gate)
        return cls(loop, bus, arrivals, RoutingMetrics(workers), [serving, *recorders], progress, gate=gate)

    def counts(self, evicted_blocks: int) -> dict:
        """``evicted_blocks``, ``events_published``, ``events_dropped``: the counts of the result."""
        return {"evicted_blocks": evicted_blocks, "events_published": self.bus.published,
                "events_dropped": self.bus.dropped}
