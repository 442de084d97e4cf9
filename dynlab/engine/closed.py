"""Closed-loop arrivals: ``C`` virtual users, each sending its next request when its previous one finished.

This is how the benchmark clients drive a server: ``vllm bench serve --max-concurrency C`` (a semaphore
of ``C`` around requests issued at once), aiperf's and guidellm's ``concurrency`` modes,
inference-perf's concurrent load. The users take the workload's requests in its order (their
timestamps, if any, are ignored): the first ``C`` are sent at time 0, and each finished or rejected
request's user sends the next one ``think_time_ms`` later (0: at the very time its last token came,
so it joins the engine's next step). ``stop_ms``: no request is sent after that time (``--duration``);
the requests in flight then finish (the drain).

:class:`ClosedLoop` is a :class:`~dynlab.engine.metrics.Recorder` (its ``on_finish`` and
``on_reject`` hooks are the users' cue) and the environment's arrivals (:meth:`initial`); the run layer
attaches the fleet's ``arrive`` (:meth:`attach`) once the fleet is built. It adds no result key.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Iterable, Iterator, Optional

from dynlab.engine.loop import ARRIVAL
from dynlab.engine.metrics import Recorder


class ClosedLoop(Recorder):
    """``concurrency`` users sending ``requests`` (in order) through ``loop`` (module docstring).

    ``token_ms``: ms per output token between the engine's finish and the user's last token (detokenisation
    and streaming, :class:`~dynlab.engine.metrics.ServingMetrics`), waited before the next request.
    Raises ``ValueError`` for ``concurrency`` < 1 or a negative ``think_time_ms``."""

    def __init__(self, requests: Iterable, concurrency: int, loop, think_time_ms: float = 0.0,
                 stop_ms: Optional[float] = None, token_ms: float = 0.0):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if not think_time_ms >= 0:
            raise ValueError(f"think_time_ms must be >= 0, got {think_time_ms}")
        self._requests = iter(requests)
        self.concurrency, self.think_ms, self.stop_ms, self.loop = concurrency, think_time_ms, stop_ms, loop
        self._arrive: Optional[Callable] = None
        self.sent = 0
        self.token_ms = token_ms
        self._pending: deque = deque()  # requests taken for sends scheduled, in the workload's order

    def initial(self) -> Iterator[tuple]:
        """The first ``concurrency`` requests, all at time 0: ``(request, 0.0)`` (a fleet's arrivals)."""
        for _ in range(self.concurrency):
            req = next(self._requests, None)
            if req is None:
                return
            self.sent += 1
            yield req, 0.0

    def attach(self, arrive: Callable) -> None:
        """The fleet's ``arrive(request)`` (it routes and submits a request at the loop's time)."""
        self._arrive = arrive

    def on_finish(self, req, t: float) -> None:
        self._next(t + self.think_ms + self.token_ms * req.output_length)

    def on_reject(self, req) -> None:
        self._next(self.loop.now + self.think_ms)

    on_shed = on_reject  # a shed request's user gets its refusal at once, as a rejected one's

    def _next(self, t: float) -> None:
        if self.stop_ms is not None and t > self.stop_ms:
            return
        req = next(self._requests, None)
        if req is None:
            return
        if self._arrive is None:
            raise RuntimeError("ClosedLoop.attach(fleet.arrive) was not called before the run")
        self.sent += 1
        # the request goes to whichever send comes first: with detokenisation a user may see its answer (and
        # send) before one whose engine finish came earlier, and the users take the requests in their order
        self._pending.append(req)
        self.loop.at(t, ARRIVAL, self._send)

    def _send(self) -> None:
        self._arrive(self._pending.popleft())


class SessionTurns(Recorder):
    """Session turns sent after the previous turn's answer (a workload spec's ``"sessions": {"closed": true}``).

    ``follows``: ``{request index: (previous turn's index, think time ms)}``. :meth:`initial` passes the
    open-loop ``arrivals`` (``(request, ms)``) of every request that follows none; a turn is sent
    ``think time`` after its previous turn finished (or was rejected), through the fleet's ``arrive``
    (:meth:`attach`), plus what the client waits for the answer beyond the engine's finish: ``front_ms``
    (the server's front end, which the next turn pays before the engine sees it) and ``token_ms`` per output
    token (detokenisation and streaming, :class:`~dynlab.engine.metrics.ServingMetrics`). It adds no result key."""

    def __init__(self, requests: Iterable, follows: dict, loop, front_ms: float = 0.0, token_ms: float = 0.0):
        by_index = {req.index: req for req in requests}
        self.after = {parent: (by_index[child], think) for child, (parent, think) in follows.items()
                      if child in by_index}
        self.held = set(follows)
        self.loop = loop
        self._arrive: Optional[Callable] = None
        self.front_ms, self.token_ms = front_ms, token_ms

    def initial(self, arrivals: Iterator[tuple]) -> Iterator[tuple]:
        """The ``arrivals`` of the requests that follow no earlier turn."""
        return ((req, t) for req, t in arrivals if req.index not in self.held)

    def attach(self, arrive: Callable) -> None:
        """The fleet's ``arrive(request)``."""
        self._arrive = arrive

    def on_finish(self, req, t: float) -> None:
        self._next(req.id, t + self.front_ms + self.token_ms * req.output_length)

    def on_reject(self, req) -> None:
        self._next(req.id, self.loop.now + self.front_ms)

    on_shed = on_reject

    def _next(self, index, t: float) -> None:
        nxt = self.after.pop(index, None)
        if nxt is None:
            return
        if self._arrive is None:
            raise RuntimeError("SessionTurns.attach(fleet.arrive) was not called before the run")
        self.loop.at(t + nxt[1], ARRIVAL, self._arrive, nxt[0])


__all__ = ["ClosedLoop", "SessionTurns"]
