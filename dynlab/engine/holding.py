"""The gateway in front of the router: it asks the admission policy about each arrival, and holds requests.

:class:`Gateway` wraps a run's :class:`~dynlab.engine.gateway.AdmissionPolicy` (``--admission-policy``). For
each arrival it asks :meth:`~dynlab.engine.gateway.AdmissionPolicy.admit`: ``True`` routes the request at
once (the fleet's ``enter``), ``False`` sheds it (the fleet's ``shed``), :data:`~dynlab.engine.gateway.WAIT`
holds it. The rules of holding follow llm-d's flow control (docs ``architecture/core/router/epp/flow-control``:
"hold requests during peak saturation instead of committing them to a server's local queue", one queue per
flow, first come first served within it, a request evicted past its time to live):

- one FIFO per class (the ``class`` attribute, ``default`` without one): a new arrival of a class that has
  held requests joins the back of its FIFO without asking the policy (no overtaking);
- the policy is asked again, the head of each FIFO first (classes in the order they were first held), when
  a request gets its first token, finishes, is rejected or shed (a loop event at that time, after the step's
  other consequences, as an arrival at that time), and at the next arrival; a head answered ``WAIT`` stops
  its class until the next time; ``True`` routes the head now, ``False`` sheds it;
- a request held ``max_wait_ms`` (the policy's :attr:`~dynlab.engine.gateway.AdmissionPolicy.max_wait_ms`)
  is asked once more then, and shed if it still waits; one still held when nothing is left to run (no step,
  no arrival: nothing could ever release it) is shed at that time.

A held request keeps its arrival at the gateway: its engine request's ``arrival_ms`` is that time, so its
TTFT, E2E and ``queue_wait_ms`` include the time held (its engine sees it when it is routed, and a priority
queue orders it by that arrival, as every other request by its own). Recorders
learn of it (``on_arrival`` with its arrival time, then ``on_route`` or ``on_shed``) when it leaves the
gateway. The result gains, after the policy's ``admission_policy`` and ``shed``, only when some measured
request was held: ``held`` (requests held), ``held_shed`` (of those, shed at ``max_wait_ms`` or at the end)
and ``gateway_wait_ms`` (p50/p90/p99/mean of the time each spent held, ms).
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Mapping, Optional, Sequence

from dynlab.engine.gateway import WAIT, GatewayContext
from dynlab.engine.loop import ARRIVAL
from dynlab.engine.metrics import Recorder, stats
from dynlab.routing.strategy import request_class

__all__ = ["Gateway"]


class Gateway(Recorder):
    """The gateway of ``policy`` in ``loop`` (module docstring); ``class_slos``: ``{class: (TTFT ms, TPOT ms)}``
    of ``--slo`` for the policy's :class:`~dynlab.engine.gateway.GatewayContext`; ``warmup``: requests whose
    index is below it are left out of the figures. Call :meth:`attach` with the fleet before the first arrival."""

    def __init__(self, policy, loop, class_slos: Optional[Mapping[str, tuple]] = None, warmup: int = 0):
        self.policy, self.loop, self.warmup = policy, loop, warmup
        self.class_slos = dict(class_slos or {})
        self._fifo: dict = {}  # class -> deque of entries [request, arrival ms, still held]
        self.holding = 0  # requests held now
        self._due = False  # a release is scheduled
        self._releasing = False
        self.held = 0  # measured requests ever held
        self.held_shed = 0  # of those, shed without being routed
        self.waits: list = []  # ms each measured held request spent held
        self._enter: Optional[Callable] = None
        self._shed: Optional[Callable] = None

    def attach(self, view, enter: Callable, shed: Callable, engine: Any = None) -> None:
        """The fleet's load ``view`` (a :class:`~dynlab.routing.strategy.FleetView`), its ``enter(request,
        arrival ms)`` and ``shed(request, arrival ms)``, and one of its engines (its latency model and token
        budget go to the policy's :meth:`~dynlab.engine.gateway.AdmissionPolicy.bind`)."""
        self._enter, self._shed = enter, shed
        scheduler = getattr(engine, "scheduler", None)
        self.policy.bind(GatewayContext(view, getattr(engine, "latency", None),
                                        getattr(scheduler, "max_num_batched_tokens", None), self.class_slos))

    # -- arrivals --------------------------------------------------------------------------------------
    def arrive(self, req, t: float) -> None:
        """``req`` (a workload :class:`~dynlab.routing.strategy.Request`) arrives at ``t`` (ms, the loop's time)."""
        if self.holding:
            self.release()
            q = self._fifo.get(request_class(req.attrs))
            if q:  # its class has held requests: behind them, unasked
                return self._hold(req, t, q)
        verdict = self.policy.admit(req, t)
        if verdict is WAIT:
            return self._hold(req, t, None)
        (self._enter if verdict else self._shed)(req, t)

    def _hold(self, req, t: float, q: Optional[deque]) -> None:
        if q is None:
            q = self._fifo.setdefault(request_class(req.attrs), deque())
        entry = [req, t, True]
        q.append(entry)
        self.holding += 1
        if self._measured(req):
            self.held += 1
        limit = self.policy.max_wait_ms
        if limit is not None:
            self.loop.at(t + limit, ARRIVAL, self._expire, entry)

    def _measured(self, req) -> bool:
        return not (self.warmup and req.index < self.warmup)

    def _leave(self, entry: list, shed: bool) -> None:
        """``entry`` leaves its FIFO now: routed, or shed (``shed``)."""
        req, t, _ = entry
        entry[2] = False
        self.holding -= 1
        if self._measured(req):
            self.waits.append(self.loop.now - t)
            self.held_shed += shed
        (self._shed if shed else self._enter)(req, t)

    # -- asking again ----------------------------------------------------------------------------------
    def release(self) -> None:
        """Ask the policy again about the head of each class's FIFO, until every head waits or none is left."""
        self._due = False
        if self._releasing:
            return
        self._releasing = True
        try:
            moved = True
            while moved and self.holding:
                moved = False
                for cls, q in list(self._fifo.items()):
                    while q:
                        verdict = self.policy.admit(q[0][0], self.loop.now)
                        if verdict is WAIT:
                            break
                        self._leave(q.popleft(), shed=not verdict)
                        moved = True
                    if not q:
                        del self._fifo[cls]
        finally:
            self._releasing = False

    def _expire(self, entry: list) -> None:
        if not entry[2]:
            return  # routed or shed already
        self.release()
        if entry[2]:  # still held at its max_wait_ms: shed
            cls = request_class(entry[0].attrs)
            q = self._fifo[cls]
            q.remove(entry)
            if not q:
                del self._fifo[cls]
            self._leave(entry, shed=True)

    def drain(self) -> bool:
        """Nothing is left to run: ask once more, then shed every request still held (in arrival order).
        Returns whether anything left the gateway (the fleet then runs its loop again)."""
        if not self.holding:
            return False
        self.release()
        rest = sorted((e for q in self._fifo.values() for e in q), key=lambda e: e[1])
        self._fifo.clear()
        for entry in rest:
            self._leave(entry, shed=True)
        return True

    def _wake(self, *_: Any) -> None:
        if self.holding and not self._due:
            self._due = True
            self.loop.at(self.loop.now, ARRIVAL, self.release)

    on_first_token = on_finish = on_reject = on_shed = _wake

    def result(self, engines: Sequence) -> dict[str, Any]:
        if not self.held:
            return {}
        return {"held": self.held, "held_shed": self.held_shed, "gateway_wait_ms": stats(self.waits)}
