"""The run environment of a timed fleet: one object instead of a dozen keyword arguments.

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
from dynlab.engine.config import EventsSection, SloSection, WorkloadSection
from dynlab.engine.loop import EventLoop
from dynlab.engine.metrics import Recorder, RoutingMetrics, ServingMetrics
from dynlab.engine.timed import arrival_times


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

    @property
    def serving(self) -> ServingMetrics:
        """The serving recorder (the first of :attr:`recorders`)."""
        return self.recorders[0]

    @classmethod
    def timed(cls, requests: Iterable, strategy, workers: int, *, workload: WorkloadSection = WorkloadSection(),
              events: EventsSection = EventsSection(), slo: SloSection = SloSection(),
              loss_rng: Optional[random.Random] = None, arrival_rng: Optional[random.Random] = None,
              recorders: Sequence[Recorder] = (), progress=None) -> "RunEnv":
        """The environment of a timed run of ``requests`` routed by ``strategy`` to ``workers`` workers.

        Arrivals: trace timestamps times ``workload.time_scale``, or Poisson at ``workload.rate``
        requests/s from ``arrival_rng`` (default: seeded ``dynlab-arrivals-<seed>``, the run's own);
        KV events: ``events.publish``, ``events.event_delay_ms``, ``events.event_loss`` (draws from
        ``loss_rng``); goodput SLOs from ``slo``. ``recorders`` follow the serving recorder.
        """
        loop = EventLoop()
        bus = EventBus(loop, strategy.on_event, delay_ms=events.event_delay_ms, loss=events.event_loss,
                       rng=loss_rng, publish=events.publish == "yes")
        rng = arrival_rng or random.Random(f"dynlab-arrivals-{workload.seed}")
        serving = ServingMetrics(slo.slo_ttft_ms, slo.slo_tpot_ms)
        return cls(loop, bus, arrival_times(requests, workload.time_scale, workload.rate, rng),
                   RoutingMetrics(workers), [serving, *recorders], progress)

    def counts(self, evicted_blocks: int) -> dict:
        """``evicted_blocks``, ``events_published``, ``events_dropped``: the counts of the result."""
        return {"evicted_blocks": evicted_blocks, "events_published": self.bus.published,
                "events_dropped": self.bus.dropped}
