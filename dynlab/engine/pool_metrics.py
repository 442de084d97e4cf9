"""A mixed fleet's figures per pool (``--pool``, :mod:`dynlab.engine.pools`): :class:`PoolRecorder`.

Its keys follow the serving keys of a ``--pool`` run:

- ``gpus``: the run's GPUs, the sum over pools of workers x GPUs per worker (tp x pp; :class:`dynlab.models.parallel`);
- ``pools``: one object per pool, in worker order: ``gpu``, ``tp``, ``workers`` (their ids: ``worker_ids``
  ``[first, last]``), ``gpus``, ``kv_blocks`` (each worker's pool, blocks), ``requests`` (routed to its workers),
  ``ttft_ms`` ``{p50, p99}`` and ``tpot_ms`` ``{p50}`` (ms, as the client sees them: the serving keys' rule,
  :func:`dynlab.engine.metrics.client_times`; ``--warmup``'s requests and failed ones left out, as there), and
  ``gpu_hours``: its GPUs held from the run's start (0 ms) to its last finish, in hours (a fixed fleet is held
  the whole run; the rule of :mod:`dynlab.engine.scaling_metrics` for a worker present from the start);
- ``gpu_hours_by_gpu``: ``{GPU name: gpu_hours}`` summed over the pools of each GPU, the mapping a price table
  turns into a cost (no price is applied here).
"""
from __future__ import annotations

from typing import Any, Sequence

from dynlab.engine.metrics import Recorder, client_times, client_tpot, failed, stats
from dynlab.engine.pools import pool_of_worker

__all__ = ["PoolRecorder"]


class PoolRecorder(Recorder):
    """The per-pool keys (module docstring) of the run ``setup`` (a :class:`~dynlab.engine.serving.TimedSetup`
    with ``pools``); :meth:`attach` gives the fleet's router each worker's pool."""

    def __init__(self, setup):
        self.pools = [p for p, _ in setup.pools]
        self.subs = [sub for _, sub in setup.pools]
        self.of = pool_of_worker(self.pools)
        c = setup.config
        self.front_ms, self.token_ms, self.warmup = c.request_overhead_ms, c.detok_ms, c.warmup
        self.worker: dict = {}  # request index -> the worker it was routed to, until it finishes
        self.requests = [0] * len(self.pools)
        self.ttft: list = [[] for _ in self.pools]
        self.tpot: list = [[] for _ in self.pools]
        self.fleet = None

    def attach(self, fleet):
        """Mark each worker of ``fleet`` (a :class:`~dynlab.engine.timed.TimedFleet`) with its pool in the router's
        view (:attr:`~dynlab.routing.strategy.FleetView.pool`); returns ``fleet``."""
        fleet.pools[:] = self.of
        self.fleet = fleet
        return fleet

    def on_route(self, request, worker, predicted, actual, cap) -> None:
        self.worker[request.index] = worker
        self.requests[self.of[worker]] += 1

    def on_finish(self, req, t: float) -> None:
        w = self.worker.pop(req.id, None)
        if w is None or (self.warmup and req.id < self.warmup) or failed(req):
            return
        k = self.of[w]
        self.ttft[k].append(client_times(req, t, self.front_ms, self.token_ms)[0])
        tpot = client_tpot(req, t, self.token_ms)
        if tpot is not None:
            self.tpot[k].append(tpot)

    def result(self, engines: Sequence) -> dict[str, Any]:
        end_ms = self.fleet.env.serving.last_finish if self.fleet is not None else 0.0
        out, by_gpu, first = [], {}, 0
        for k, (pool, sub) in enumerate(zip(self.pools, self.subs)):
            gpus = pool.workers * sub.latency.hardware.parallel.gpus
            hours = round(end_ms * gpus / 3.6e6, 6)
            name = sub.latency.hardware.gpu.name
            by_gpu[name] = round(by_gpu.get(name, 0.0) + hours, 6)
            ttft, tpot = stats(self.ttft[k]), stats(self.tpot[k])
            out.append({"gpu": name, "tp": pool.tp, "workers": pool.workers,
                        "worker_ids": [first, first + pool.workers - 1], "gpus": gpus, "kv_blocks": sub.capacity,
                        "requests": self.requests[k], "ttft_ms": {"p50": ttft["p50"], "p99": ttft["p99"]},
                        "tpot_ms": {"p50": tpot["p50"]}, "gpu_hours": hours})
            first += pool.workers
        return {"gpus": sum(p["gpus"] for p in out), "pools": out, "gpu_hours_by_gpu": by_gpu}
