"""A mixed fleet's figures per pool (``--pool``, :mod:`dynlab.engine.pools`): :class:`PoolRecorder`.

Its keys follow the serving keys of a ``--pool`` run:

- ``gpus``: the run's GPUs, the sum over pools of workers x GPUs per worker (tp x pp; :class:`dynlab.models.parallel`);
- ``pools``: one object per pool, in worker order: ``gpu``, ``tp``, ``workers`` (their ids: ``worker_ids``
  ``[first, last]``), ``gpus``, ``kv_blocks`` (each worker's pool, blocks), ``requests`` (routed to its workers),
  ``ttft_ms`` ``{p50, p99}`` and ``tpot_ms`` ``{p50}`` (ms, as the client sees them: the serving keys' rule,
  :func:`dynlab.engine.metrics.client_times`; ``--warmup``'s requests and failed ones left out, as there), and
  ``gpu_hours``: its GPUs held from the run's start (0 ms) to its last finish, in hours (a fixed fleet is held
  the whole run; the rule of :mod:`dynlab.engine.scaling_metrics` for a worker present from the start); in a
  P/D fleet ``role`` first, and a request counts in both pools it went through;
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
    with ``pools``) served in an environment whose serving recorder is ``serving`` (its last finish ends the
    GPU-hours); :meth:`attach` gives an aggregated fleet's router each worker's pool. In a P/D fleet
    (pools with roles) a request counts in the prefill pool it was routed to and in the decode pool it was
    handed to (``on_handoff``), its figures in both."""

    def __init__(self, setup, serving):
        self.pools = [p for p, _ in setup.pools]
        self.subs = [sub for _, sub in setup.pools]
        self.serving = serving
        roles = {p.role: k for k, p in enumerate(self.pools)}
        # routed worker -> pool index (the prefill pool's workers in a P/D fleet), the decode pool's index
        self.of = pool_of_worker(self.pools) if None in roles else [roles["prefill"]] * self.pools[roles["prefill"]].workers
        self.decode_pool = roles.get("decode")
        c = setup.config
        self.front_ms, self.token_ms, self.warmup = c.request_overhead_ms, c.detok_ms, c.warmup
        self.where: dict = {}  # request index -> the pools it went through, until it finishes
        self.requests = [0] * len(self.pools)
        self.ttft: list = [[] for _ in self.pools]
        self.tpot: list = [[] for _ in self.pools]

    def attach(self, fleet):
        """Mark each worker of ``fleet`` (an aggregated :class:`~dynlab.engine.timed.TimedFleet`) with its pool in the
        router's view (:attr:`~dynlab.routing.strategy.FleetView.pool`); returns ``fleet``."""
        fleet.pools[:] = self.of
        return fleet

    def on_route(self, request, worker, predicted, actual, cap) -> None:
        k = self.of[worker]
        self.where[request.index] = [k]
        self.requests[k] += 1

    def on_handoff(self, record) -> None:
        self.where.setdefault(record.request.id, []).append(self.decode_pool)
        self.requests[self.decode_pool] += 1

    def on_finish(self, req, t: float) -> None:
        pools = self.where.pop(req.id, ())
        if (self.warmup and req.id < self.warmup) or failed(req):
            return
        ttft = client_times(req, t, self.front_ms, self.token_ms)[0]
        tpot = client_tpot(req, t, self.token_ms)
        for k in pools:
            self.ttft[k].append(ttft)
            if tpot is not None:
                self.tpot[k].append(tpot)

    def _worker_ids(self) -> list:
        """``[first, last]`` worker id of each pool: pool order in an aggregated fleet; prefill pool then decode
        pool in a P/D fleet (the order of its per-worker lists)."""
        if self.decode_pool is None:
            firsts = [sum(p.workers for p in self.pools[:k]) for k in range(len(self.pools))]
        else:
            p = self.pools[1 - self.decode_pool].workers
            firsts = [p if k == self.decode_pool else 0 for k in range(len(self.pools))]
        return [[f, f + pool.workers - 1] for f, pool in zip(firsts, self.pools)]

    def result(self, engines: Sequence) -> dict[str, Any]:
        end_ms = self.serving.last_finish
        out, by_gpu = [], {}
        for k, (pool, sub, ids) in enumerate(zip(self.pools, self.subs, self._worker_ids())):
            gpus = pool.workers * sub.latency.hardware.parallel.gpus
            hours = round(end_ms * gpus / 3.6e6, 6)
            name = sub.latency.hardware.gpu.name
            by_gpu[name] = round(by_gpu.get(name, 0.0) + hours, 6)
            ttft, tpot = stats(self.ttft[k]), stats(self.tpot[k])
            out.append({**({"role": pool.role} if pool.role else {}), "gpu": name, "tp": pool.tp,
                        "workers": pool.workers, "worker_ids": ids, "gpus": gpus, "kv_blocks": sub.capacity,
                        "requests": self.requests[k], "ttft_ms": {"p50": ttft["p50"], "p99": ttft["p99"]},
                        "tpot_ms": {"p50": tpot["p50"]}, "gpu_hours": hours})
        return {"gpus": sum(p["gpus"] for p in out), "pools": out, "gpu_hours_by_gpu": by_gpu}
