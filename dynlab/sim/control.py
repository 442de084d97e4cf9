"""The run layer's controller driver: builds ``--controller``'s :class:`~dynlab.engine.controller.Controller`,
calls it every ``period`` seconds of simulated time and applies its decisions to the fleet's
:class:`~dynlab.engine.elastic.Elastic`.

Calls happen at ``period``, ``2 period``, ... (ms on the run's clock), after every step end, KV event and
arrival of that time; they stop when nothing is left to happen but workers becoming ready (the last request
has finished), so a controller that keeps adding workers to an idle fleet never keeps a finished run alive.

With a controller's ``scrape_delay_s`` (d s) the call at ``t`` observes the fleet and the call's decisions are made
and applied at ``t + d``, on that observation (the metrics a controller reads are d s old) but with the fleet's members
as they are at ``t + d`` (an orchestrator's API, Kubernetes' or Dynamo's deployment object, is read at once: a worker
retired or added since keeps its state now, a worker added since has no metric yet: zeros); with its
``discovery_delay_s`` an added worker is routable that long after its cold start, and a retired one that long
after the decision stops receiving routes (:meth:`~dynlab.engine.elastic.Elastic.retire`'s ``after_ms``).

A P/D fleet's prefill pool scales too when the controller says so (``Controller.scales_prefill``: an autoscaler given
``prefill_min=`` or ``prefill_max=``): each call then observes and decides for each pool in turn, the prefill pool
first (:class:`~dynlab.engine.controller.FleetState` ``pool`` ``"prefill"``, then ``"decode"``). A decision names the
pool it scales (``Add.pool``, ``Retire.pool``): ``""`` (the pool of the state decided on) or a pool that scales; another
pool is refused (:class:`~dynlab.errors.DynlabError`).
"""
from __future__ import annotations

from typing import Optional

from dynlab.engine.controller import Add, Controller, NoController, Retire, RunInfo
from dynlab.engine.elastic import Elastic
from dynlab.engine.gateway import parse_policy
from dynlab.engine.loop import STEP_START
from dynlab.errors import DynlabError


def build_controller(spec: str, shown: Optional[str] = None) -> Optional[Controller]:
    """The controller of ``spec`` (``--controller NAME[:KEY=VALUE,...]``), ``None`` for ``none`` (no controller,
    a fixed fleet). Raises ``ValueError`` (one line) for an unknown name or an unknown or bad option, quoting
    ``shown`` (what the user typed, when a caller added options to it: ``plan``'s ``max=``) or else ``spec``."""
    from dynlab.plugins import controllers

    name, opts = parse_policy(spec, "controller")
    registry = controllers()
    if name not in registry:
        raise ValueError(f"unknown controller {name!r}; available: {', '.join(registry.names())}")
    controller = registry.get(name)(opts, shown or spec)
    unread = controller.unread()
    if unread:
        raise ValueError(f"controller {shown or spec!r}: unknown option(s) {', '.join(unread)}")
    return None if type(controller) is NoController else controller


class Control:
    """``controller`` driving ``elastic`` (give ``elastic`` to the run's recorders before the fleet is built,
    then :meth:`start` once the fleet is attached); ``prefill``: a P/D fleet's prefill pool's, when it scales too."""

    def __init__(self, controller: Controller, elastic: Elastic, prefill: Optional[Elastic] = None):
        self.controller, self.elastic = controller, elastic
        self.pools = [e for e in (prefill, elastic) if e is not None]  # observed and decided in this order
        self.period_ms = controller.period_s * 1000.0
        self.scrape_ms = controller.scrape_delay_s * 1000.0
        self.discovery_ms = controller.discovery_delay_s * 1000.0
        self.pending = 0  # observations whose decision is still to come (scrape delay)

    def start(self, gpus: int = 1, config=None) -> None:
        """Give the controller the run's :class:`~dynlab.engine.controller.RunInfo` (worker 0's engine, ``gpus`` per
        worker, the run's ``config``) and schedule the first call, at one period."""
        e = self.elastic.fleet.engines[0]
        seqs = getattr(e.scheduler, "max_num_seqs", None) or getattr(e.scheduler, "max_running", 1)  # vLLM, SGLang
        self.controller.bind(RunInfo(e.latency, gpus, seqs, e.max_num_batched_tokens, e.capacity * e.block, config))
        loop = self.elastic.fleet.loop
        loop.at(loop.now + self.period_ms, STEP_START, self._tick)

    def _tick(self) -> None:
        c, loop = self.controller, self.elastic.fleet.loop
        for elastic in self.pools:
            state = elastic.observe(c.period_s)
            if self.scrape_ms > 0:
                self.pending += 1
                loop.at(loop.now + self.scrape_ms, STEP_START, self._decide, state, True)
            else:
                self._decide(state)
        waits = sum(e.pending_ready + e.pending_leave for e in self.pools)
        if len(loop) > waits + self.pending:  # work is left: the next call
            loop.at(loop.now + self.period_ms, STEP_START, self._tick)

    def _pool(self, name: str, decision) -> Elastic:
        """The elastic of the pool ``name`` a decision scales; :class:`DynlabError` when it does not scale."""
        for elastic in self.pools:
            if elastic.pool == name:
                return elastic
        c = self.controller
        raise DynlabError(f"controller {c.spec!r} decided {decision!r}: "
                          + ("an aggregated fleet has no pools" if not self.elastic.pool else
                             "the prefill pool keeps --split's P workers unless the controller scales it "
                             "(prefill_min= or prefill_max=)" if name == "prefill" else
                             f"only the {' and '.join(e.pool for e in self.pools)} pool scales"))

    def _decide(self, state, delayed: bool = False) -> None:
        c = self.controller
        own = self._pool(state.pool, state)
        if delayed:
            self.pending -= 1
            state = state._replace(workers=members_now(state.workers, own.workers_now()))
        for decision in c.decide(state) or ():
            elastic = own
            if type(decision) in (Add, Retire) and decision.pool not in ("", own.pool):
                elastic = self._pool(decision.pool, decision)
            if type(decision) is Add:
                if not decision.ready_in_s >= 0 or decision.ready_in_s == float("inf"):
                    raise DynlabError(f"controller {c.spec!r}: Add(ready_in_s={decision.ready_in_s!r}) must be "
                                      f"a finite number of seconds >= 0")
                elastic.add(decision.ready_in_s * 1000.0 + self.discovery_ms)
            elif type(decision) is Retire:
                elastic.retire(decision.worker, decision.kill, self.discovery_ms)
            else:
                raise DynlabError(f"controller {c.spec!r} decided {decision!r}, not an Add or a Retire")


def members_now(seen, now) -> tuple:
    """The workers ``now`` (their ids, states and ready times) with the metrics ``seen`` earlier (zeros for a worker
    not seen then); both tuples of :class:`~dynlab.engine.controller.WorkerState`."""
    old = {w.id: w for w in seen}
    return tuple(old[w.id]._replace(state=w.state, ready_s=w.ready_s) if w.id in old else
                 w._replace(waiting=0, running=0, kv_usage=0.0, active=0, queued_prefill_tokens=0, kv_tokens=0)
                 for w in now)
