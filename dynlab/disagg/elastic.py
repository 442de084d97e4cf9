"""An elastic P/D fleet (``--split P:D --controller ...``): the decode pool's workers join and leave during the run,
and the prefill pool's when the controller's ``scales_prefill`` (:class:`PrefillElastic`, below); otherwise the prefill
pool keeps its ``P`` workers (a controller's decision naming ``prefill`` is refused, :class:`dynlab.sim.control.Control`).

:class:`DecodeElastic` is :class:`~dynlab.engine.elastic.Elastic` (ready times, drain, kill, discovery delay, the
result's lifetimes) driving a :class:`~dynlab.disagg.fleet.DisaggFleet`'s decode pool through :class:`DecodePool`,
which gives it the fleet interface an aggregated fleet has. Worker ids are ``0..`` within each pool (never reused);
the recorders' ids (``on_step``, the result's per-worker lists) are given in order of creation across both pools
(:meth:`DisaggFleet.new_id <dynlab.disagg.fleet.DisaggFleet.new_id>`): a fixed fleet's prefill workers ``0..P-1``, its
decode workers ``P..P+D-1``, then each worker added to either pool the next id, so every id ever given keeps one entry.

- **Add**: a decode engine (the run's engine kind, ``decode=True``) gets the next id at once; at its ready time it
  joins ``DisaggFleet.droutable``, the decode router's ``FleetView.routable`` (the built-in decode routers pick among
  it: :mod:`dynlab.disagg.decode_router`).
- **Retire, draining**: the worker leaves ``routable`` (no new request is sent to it), finishes what it was given
  (reservations waiting, transfers in flight, requests decoding) and leaves when its engine is idle and nothing is
  left assigned to it (``DisaggFleet.dload``). NVIDIA Dynamo scales a decode worker down the same way: its discovery
  entry is removed, so the router stops sending to it, and it finishes its streams (Dynamo's
  ``docs/architecture/load_planner.md``: "revokes the etcd lease ... finishes all the current requests").
- **Retire, killing**: the worker leaves now. A request whose KV had not arrived there (waiting for a reservation or
  on the link) still has its KV on its prefill worker: it is sent again, to a decode worker the decode router picks
  among the others (a new transfer; the bytes already sent are lost). A request whose KV had arrived (decoding, or
  received and waiting for admission, or preempted there) has lost it: it goes back through the prefill router as a
  new arrival keeping its first arrival time (counted in ``requeued``, as an aggregated worker's killed requests are,
  :mod:`dynlab.engine.elastic`), prefilled and transferred again.

The prefill pool (:class:`PrefillElastic`, an :class:`~dynlab.engine.elastic.Elastic` on the prefill pool's
:class:`~dynlab.engine.timed.TimedFleet`, whose router sees joins and leaves as an aggregated fleet's does):

- **Add**: a prefill engine (``handoff=True``) gets the next prefill id and the next recorders' id, and a link of its
  own; routable at its ready time.
- **Retire, draining**: no new route; it finishes its prefills and leaves once the KV of every request it prefilled has
  arrived at its decode worker (its link may still be sending when its engine is idle).
- **Retire, killing**: a request whose KV had not arrived at its decode worker (on the link, waiting for a
  reservation, or still prefilling with ``overlap_transfer``) loses it: the decode worker gives back its reservation
  (or its place in the queue: :meth:`DisaggFleet.cancel_transfer <dynlab.disagg.fleet.DisaggFleet.cancel_transfer>`)
  and the request goes back through the prefill router keeping its first arrival time (``requeued``), as do the
  requests in the worker's engine. A request whose KV had arrived is not touched.

Its :class:`FleetState` has ``pool`` ``"prefill"``: the prefill workers, their engines' queues and steps. With both
pools elastic the :class:`DecodeElastic`'s result gives both (``elastic_pool`` ``prefill+decode``, ``worker_lifetimes``
with each one's ``pool``, ``workers_over_time`` summed: :meth:`DecodeElastic.result`).

What a controller observes (:meth:`DecodeElastic.observe`): a :class:`~dynlab.engine.controller.FleetState` of
``pool`` ``"decode"`` whose workers are the decode workers (``waiting``: requests in its engine's waiting queue, plus
those received and not admitted, plus those waiting for a reservation; ``active``: requests assigned and not
finished) and whose ``steps`` are the decode workers' engine iterations; ``arrivals``, ``prompt_tokens``,
``finished`` and ``output_tokens`` are the fleet's, ``ttft_ms`` its prefill workers' first tokens (plus the front
end's and detokenisation's overheads).
"""
from __future__ import annotations

from collections import deque
from typing import Any, Sequence

from dynlab.engine.elastic import Elastic


class DecodePool:
    """The decode pool of ``pd`` (a :class:`~dynlab.disagg.fleet.DisaggFleet`) as :class:`Elastic` drives a fleet:
    ``engines``, ``routable``, ``active``, ``strategy`` (the decode router), ``loop``, ``env`` and :meth:`grow`."""

    def __init__(self, pd):
        self.pd = pd
        self.loop, self.env = pd.loop, pd.env
        self.engines, self.routable, self.active = pd.decode, pd.droutable, pd.dload
        self.strategy = pd.decode_strategy

    def grow(self, engine) -> int:
        """Give ``engine`` the next decode id and a place in every per-decode-worker list; not routable yet."""
        pd = self.pd
        d = len(pd.decode)
        pd.decode.append(engine)  # the decode pool's StepDriver steps this very list
        pd.decode_pool.elastic.local[pd.new_id(engine, "decode")] = d  # the recorders' id: the next of either pool
        for books in (pd.dload, pd.drouted, pd.decode_pool.generation):
            books.append(0)
        pd.pending.append(deque())
        pd.awaiting.append({})
        pd.dview = pd.decode_view()
        return d


class DecodeElastic(Elastic):
    """The joins and leaves of a P/D fleet's decode pool (module docstring); ``build(decode_id) -> engine``. Give it
    to the run's recorders before the :class:`~dynlab.disagg.fleet.DisaggFleet` is built, then :meth:`attach` it."""

    pool = "decode"

    def attach(self, pd) -> None:
        """Drive ``pd``'s decode pool: every decode worker it has is live from 0 ms."""
        self.pd = pd
        self.local = {i: d for d, i in enumerate(pd.dids)}  # the recorders' id -> decode worker (on_step)
        pd.decode_pool.elastic = self  # an idle decode worker: a draining one may leave
        pd.prefill_fleet.origins = self.origin  # a killed decode worker's requests go back through the prefill router
        self.start_books(DecodePool(pd))

    def can_leave(self, d: int) -> bool:
        """Whether draining decode worker ``d`` has finished: its engine idle and nothing assigned to it."""
        return self.pd.decode[d].idle and self.pd.dload[d] == 0

    def kill(self, d: int, now: float) -> None:
        """Stop decode worker ``d`` now: its engine's requests lose their KV and go back through the prefill router,
        the ones whose KV had not arrived are sent to another decode worker (module docstring)."""
        pd = self.pd
        engine = pd.decode[d]
        pd.decode_pool.generation[d] += 1  # its step end and block boundaries scheduled are void
        sch, kv = engine.scheduler, engine.kv
        kv.accumulate(now)  # its usage integral ends now
        held = [*sch.running, *sch.loading, *sch.ready, *sch.received]
        for req in held:
            kv.free(req)
        for req, (keys, _) in list(kv.reserved.items()):  # reservations whose KV is still on the link
            kv.pool.release(keys, req.seq)
        kv.reserved.clear()
        lost = sorted([*held, *sch.waiting], key=lambda r: r.id)
        sch.running = []
        while sch.waiting:
            sch.waiting.popleft()
        for queue in (sch.loading, sch.ready, sch.arrived, sch.received):
            queue.clear()
        self.leave(d, "kill", now)
        pd.pending[d].clear()
        pd.awaiting[d].clear()
        pd.dload[d] = 0
        # its KV still on the prefill worker: another decode worker takes it (a new reservation and transfer)
        moved = sorted((r for r in pd.records.values() if r.decode == d and r.arrived is None),
                       key=lambda r: r.request.id)
        for rec in moved:
            pd.ask_decode(rec.request, rec.prefill, now)
            pd.records[rec.request.id].prefill_done = rec.prefill_done
        for req in lost:  # its KV lost: prefilled again (a fresh transfer record at its next handoff)
            del pd.records[req.id]
            self.requeued += 1
            new = pd.prefill_fleet.enter(self.origin[req.id], req.arrival_ms, requeued=True)
            for r in pd.env.recorders:  # a recorder keeping requests follows the new one (RequestRecorder)
                if hasattr(r, "on_requeue"):
                    r.on_requeue(new, now)

    # -- what a controller observes ----------------------------------------------------------
    def waiting_outside(self, d: int) -> int:
        """Requests given to decode worker ``d`` whose KV arrived and that wait for admission, and those waiting for
        a reservation there."""
        return len(self.pd.decode[d].scheduler.received) + len(self.pd.pending[d])

    def on_step(self, worker: int, result) -> None:
        d = self.local.get(worker)
        if d is not None:  # a decode worker's (a prefill worker's steps are not the pool's)
            super().on_step(d, result)

    # -- the result ----------------------------------------------------------------------------
    def result(self, engines: Sequence) -> dict[str, Any]:
        """:meth:`Elastic.result` of the decode pool (its ids and engines), with ``elastic_pool``: ``decode``; with a
        :class:`PrefillElastic` (``partner``) both pools' (module docstring)."""
        out = {**super().result(self.pd.decode), "elastic_pool": self.pool}
        p = self.partner
        if p is None:
            return out
        theirs = Elastic.result(p, self.pd.engines)
        lives = [{**x, "pool": p.pool} for x in theirs["worker_lifetimes"]]
        lives += [{**x, "pool": self.pool} for x in out["worker_lifetimes"]]
        return {**out, "requeued": theirs["requeued"] + out["requeued"],
                "misrouted": theirs["misrouted"] + out["misrouted"],
                "workers_over_time": summed(p.timeline, self.timeline), "worker_lifetimes": lives,
                "mean_kv_usage_alive": theirs["mean_kv_usage_alive"] + out["mean_kv_usage_alive"],
                "elastic_pool": f"{p.pool}+{self.pool}"}

    partner = None  # a PrefillElastic: the prefill pool scales too


def summed(a: list, b: list) -> list:
    """``[s, workers]`` of two pools' ``(ms, routable workers)`` timelines added up, at 0 and at each change."""
    changes = sorted([(t, 0, n) for t, n in a] + [(t, 1, n) for t, n in b], key=lambda c: c[0])
    now, out = [0, 0], []
    for t, k, n in changes:
        now[k] = n
        if out and out[-1][0] == t:
            out[-1][1] = sum(now)
        else:
            out.append([t, sum(now)])
    return [[round(t / 1000.0, 3), n] for t, n in out]


class PrefillElastic(Elastic):
    """The joins and leaves of a P/D fleet's prefill pool (module docstring): :class:`Elastic` on the prefill pool's
    :class:`~dynlab.engine.timed.TimedFleet` (its router sees joins and leaves: ``on_join``, ``on_leave``, a gone
    worker's KV events dropped), with the fleet's transfers. ``build(prefill_id) -> engine`` (``handoff=True``). Give
    it to the run's recorders before the :class:`~dynlab.disagg.fleet.DisaggFleet` is built, then :meth:`attach`
    it after the :class:`DecodeElastic`."""

    pool = "prefill"

    def attach(self, pd, decode: DecodeElastic) -> None:
        """Drive ``pd``'s prefill pool beside ``decode`` (whose ``origin`` it shares and whose result gives both)."""
        self.pd, decode.partner = pd, self
        self.origin = decode.origin  # a request killed on either pool goes back through the prefill router
        self.local = {i: p for p, i in enumerate(pd.pids)}  # the recorders' id -> prefill worker (on_step)
        super().attach(pd.prefill_fleet)

    def add(self, ready_in_ms: float = 0.0) -> int:
        p = super().add(ready_in_ms)
        self.local[self.pd.new_id(self.fleet.engines[p], "prefill")] = p  # the recorders' id: the next of either pool
        return p

    def can_leave(self, p: int) -> bool:
        """Whether draining prefill worker ``p`` has finished: its engine idle and every KV it prefilled arrived."""
        return self.fleet.engines[p].idle and not any(r.prefill == p and r.arrived is None
                                                      for r in self.pd.records.values())

    def kill(self, p: int, now: float) -> None:
        """Stop prefill worker ``p`` now: a request whose KV had not arrived at its decode worker loses it (the
        reservation there is given back) and goes back through the prefill router, as do its engine's requests."""
        pd = self.pd
        engine = self.fleet.engines[p]
        cut = sorted((r for r in pd.records.values() if r.prefill == p and r.arrived is None),
                     key=lambda r: r.request.id)
        outside = []
        for rec in cut:
            pd.cancel_transfer(rec, now)
            if rec.prefill_done is not None:  # handed off: out of its engine, its blocks held for the transfer
                engine.release(rec.request, now)
                outside.append(rec.request)
        super().kill(p, now)  # its engine's requests (a record of overlap's was cut above)
        for req in outside:
            self.requeued += 1
            new = self.fleet.enter(self.origin[req.id], req.arrival_ms, requeued=True)
            for r in pd.env.recorders:
                if hasattr(r, "on_requeue"):
                    r.on_requeue(new, now)

    def on_step(self, worker: int, result) -> None:
        p = self.local.get(worker)
        if p is not None:  # a prefill worker's
            super().on_step(p, result)

    def result(self, engines: Sequence) -> dict[str, Any]:
        """Nothing of its own: the :class:`DecodeElastic`'s result gives both pools'."""
        return {}


__all__ = ["DecodeElastic", "DecodePool", "PrefillElastic", "summed"]
