"""What an elastic fleet's scaling cost and how the SLOs fared while it scaled (``--controller``): a recorder whose
keys follow :class:`~dynlab.engine.elastic.Elastic`'s.

- ``gpu_hours``: the sum over workers of ``(left - joined) x GPUs per worker``, in hours; a worker still there at
  the end counts to the run's last finish (and one leaving after it, to it), a starting worker counts from its add
  (it holds its GPUs while loading);
- ``scale_events``: ``[s, "add" | "retire", worker]`` of every decision applied, in order;
- ``oscillations``: reversals: a controller call whose net decisions (adds minus retires) go the opposite way of the
  previous call that changed anything, within ``OSCILLATION_PERIODS`` (4) periods of it; the count of 2<->1 flapping
  (issue 41), 0 under HPA's default scale-down stabilisation window (300 s, 20 of its 15 s periods);
- with an SLO (``--slo-ttft-ms``, ``--slo-tpot-ms`` or ``--slo``): ``goodput_over_time`` (``[window start s,
  goodput]`` per controller period of arrival times, windows without arrivals left out) and
  ``worst_window_goodput``, the lowest of them. A request counts in the window of its (first) arrival, as the
  run's ``goodput`` counts it (a rejected or shed request fails; a requeued one counts once, at its finish).
- ``queue_over_time``: ``[window start s, requests waiting]`` per controller period, from the window of the first
  arrival to the last one's, empty windows as 0: the mean number of requests between their arrival and their first
  scheduled step (``first_scheduled_ms``: the queue wait of ``queue_wait_ms``), the time they waited in the window
  over its length (a request waiting the whole window adds 1; one never scheduled, shed or rejected, adds nothing).
  What an operator's ``num_requests_waiting`` gauge averages to over the window, the gateway's holds included.

In a P/D fleet (:mod:`dynlab.disagg.elastic`: the decode pool scales, the prefill pool keeps its workers unless the
controller scales it too) every ``scale_events`` entry names its pool (``[s, "add" | "retire", worker, "decode"]``,
``worker`` an id within that pool; both pools' events in the order they were applied), ``gpu_hours`` counts both pools
(a fixed prefill pool's workers from 0 ms to the run's last finish, a scaling one's over their lifetimes as the decode
pool's) and ``gpu_hours_per_pool`` gives each (``{"prefill": h, "decode": h}``, each rounded; ``gpu_hours`` is the
rounded sum of the unrounded two); ``oscillations`` is the sum of each pool's.

``--price`` and ``--spot-discount`` price ``gpu_hours`` (``cost_usd``, ``price_source``: :mod:`dynlab.sim.cost`,
after this recorder's keys are built).
"""
from __future__ import annotations

from typing import Any, Sequence

from dynlab.engine.metrics import Recorder, client_times, client_tpot, failed, meets, ratio
from dynlab.routing.strategy import request_class

#: a reversal of direction within this many controller periods is an oscillation
OSCILLATION_PERIODS = 4


class ScalingRecorder(Recorder):
    """The scaling figures (module docstring) of ``elastic`` (an :class:`~dynlab.engine.elastic.Elastic`) with
    ``gpus`` GPUs per worker and a controller called every ``period_s`` seconds."""

    def __init__(self, elastic, gpus: int, period_s: float, fixed: tuple = (), also=None):
        """``fixed``: ``(pool name, workers)`` of a pool that keeps its workers beside ``elastic``'s (a P/D fleet's
        prefill pool), billed from 0 ms to the run's last finish; ``also``: instead, that pool's own elastic (it scales
        too: :class:`dynlab.disagg.elastic.PrefillElastic`), billed over its workers' lifetimes."""
        self.elastic, self.gpus, self.period_ms = elastic, gpus, period_s * 1000.0
        self.fixed, self.also = fixed, also
        self.total: dict = {}  # window index -> requests arrived (outside warm-up, not failed ones)
        self.good: dict = {}
        self.waited: dict = {}  # window index -> ms requests spent waiting in it (queue_over_time)
        self.arrived = [None, None]  # the first and last arrival's windows

    def _slo(self):
        serving = self.elastic.fleet.env.serving
        return serving, serving.slo_ttft_ms is not None or serving.slo_tpot_ms is not None or serving.class_slos

    def _window(self, req) -> int:
        return int(req.arrival_ms // self.period_ms)

    def on_arrival(self, req, t: float) -> None:
        k = self._window(req)
        if self.arrived[0] is None:
            self.arrived[0] = k
        self.arrived[1] = k if self.arrived[1] is None else max(k, self.arrived[1])
        serving, on = self._slo()
        if on and not (serving.warmup and req.id < serving.warmup) and not failed(req):
            k = self._window(req)
            self.total[k] = self.total.get(k, 0) + 1

    def wait(self, start_ms: float, end_ms: float) -> None:
        """Count a wait from ``start_ms`` to ``end_ms`` into the windows it spans."""
        k = int(start_ms // self.period_ms)
        while start_ms < end_ms:
            edge = min((k + 1) * self.period_ms, end_ms)
            self.waited[k] = self.waited.get(k, 0.0) + edge - start_ms
            start_ms, k = edge, k + 1

    def on_finish(self, req, t: float) -> None:
        if req.first_scheduled_ms is not None:
            self.wait(req.arrival_ms, req.first_scheduled_ms)
        serving, on = self._slo()
        if not on or (serving.warmup and req.id < serving.warmup) or failed(req):
            return
        ttft, _ = client_times(req, t, serving.front_ms, serving.token_ms)
        slo = (serving.slo_ttft_ms, serving.slo_tpot_ms)
        if serving.class_slos is not None:
            slo = serving.class_slos.get(request_class(req.attrs), slo)
        if meets(slo, ttft, client_tpot(req, t, serving.token_ms)):
            k = self._window(req)
            self.good[k] = self.good.get(k, 0) + 1

    def result(self, engines: Sequence) -> dict[str, Any]:
        e = self.elastic
        end = e.fleet.env.serving.last_finish
        alive_ms = _alive_ms(e, end)
        out = {"gpu_hours": round(alive_ms * self.gpus / 3.6e6, 6),
               "scale_events": [[round(t / 1000.0, 3), kind, w] for t, kind, w in e.events],
               "oscillations": oscillations(e.events, self.period_ms),
               "queue_over_time": self.queue_over_time()}
        if self.fixed:  # a P/D fleet: both pools billed, each event naming its pool (module docstring)
            name, workers = self.fixed
            fixed_ms = workers * max(end, 0.0)
            out["gpu_hours"] = round((alive_ms + fixed_ms) * self.gpus / 3.6e6, 6)
            out["gpu_hours_per_pool"] = {name: round(fixed_ms * self.gpus / 3.6e6, 6),
                                         e.pool: round(alive_ms * self.gpus / 3.6e6, 6)}
            out["scale_events"] = [[*event, e.pool] for event in out["scale_events"]]
        elif self.also is not None:  # a P/D fleet whose both pools scale: the prefill pool's first at equal times
            a = self.also
            a_ms = _alive_ms(a, end)
            out["gpu_hours"] = round((alive_ms + a_ms) * self.gpus / 3.6e6, 6)
            out["gpu_hours_per_pool"] = {a.pool: round(a_ms * self.gpus / 3.6e6, 6),
                                         e.pool: round(alive_ms * self.gpus / 3.6e6, 6)}
            both = sorted([(t, k, w, a.pool) for t, k, w in a.events] + [(t, k, w, e.pool) for t, k, w in e.events],
                          key=lambda event: event[0])
            out["scale_events"] = [[round(t / 1000.0, 3), k, w, pool] for t, k, w, pool in both]
            out["oscillations"] = oscillations(a.events, self.period_ms) + out["oscillations"]
        if self._slo()[1]:
            windows = [[round(k * self.period_ms / 1000.0, 3), ratio(self.good.get(k, 0), n)]
                       for k, n in sorted(self.total.items())]
            out["goodput_over_time"] = windows
            out["worst_window_goodput"] = min((g for _, g in windows), default=None)
        return out


    def queue_over_time(self) -> list:
        """``[[window start s, mean requests waiting]]`` (module docstring)."""
        first, last = self.arrived
        if first is None:
            return []
        return [[round(k * self.period_ms / 1000.0, 3), round(self.waited.get(k, 0.0) / self.period_ms, 4)]
                for k in range(first, max([last] + list(self.waited)) + 1)]


def _alive_ms(e, end: float) -> float:
    """ms the workers of ``e`` (an :class:`~dynlab.engine.elastic.Elastic`) held their GPUs, to ``end`` at most."""
    return sum(_held_until(e.left[w], e.joined[w], end) - e.joined[w] for w in range(len(e.state)))


def _held_until(left, joined: float, end: float) -> float:
    """When a worker that joined at ``joined`` (ms) stops being billed: when it left, but no later than the run's
    last finish ``end`` (a retirement applied after it, e.g. a decision delayed by ``scrape_delay_s``, bills no idle
    hours past the run); a worker still there is billed to ``end``, one added after it not at all."""
    stop = max(end, joined)
    return stop if left is None else min(left, stop)


def oscillations(events: Sequence, period_ms: float, periods: int = OSCILLATION_PERIODS) -> int:
    """Reversals in ``events`` (``(ms, "add" | "retire", worker)``): calls (events of one time) whose net direction
    opposes the previous changing call's and come within ``periods x period_ms`` of it."""
    net: dict = {}
    for t, kind, _ in events:
        net[t] = net.get(t, 0) + (1 if kind == "add" else -1)
    count, last = 0, None  # last: (ms, direction) of the previous call that changed the count
    for t in sorted(net):
        if net[t] == 0:
            continue
        direction = 1 if net[t] > 0 else -1
        if last is not None and direction != last[1] and t - last[0] <= periods * period_ms + 1e-9:
            count += 1
        last = (t, direction)
    return count
