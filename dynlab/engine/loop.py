"""The event loop: a clock and a heap of timed callbacks. It knows nothing of workers, strategies or metrics.

Events at the same time run in ``priority`` order, then in the order they were scheduled.
The timed replay (:mod:`dynlab.engine.timed`) uses the priorities below, which make a
request that arrives exactly when a step starts join that step (vLLM's scheduler sees it
in its waiting queue): a step that ends at ``t`` is applied first, then KV events due at
``t`` reach the router, then requests arriving at ``t`` are routed, then idle workers start
their next step.
"""
from __future__ import annotations

import heapq
from typing import Any, Callable

STEP_END, DELIVER, ARRIVAL, STEP_START = 0, 1, 2, 3


class EventLoop:
    """A discrete-event loop over ``(time ms, priority, sequence, callback, args)`` (stdlib ``heapq``)."""

    __slots__ = ("now", "_heap", "_seq")

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list = []
        self._seq = 0

    def at(self, t: float, priority: int, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` at time ``t`` (ms, not before :attr:`now`)."""
        self._seq += 1
        heapq.heappush(self._heap, (t, priority, self._seq, fn, args))

    def __len__(self) -> int:
        """Events still to run."""
        return len(self._heap)

    def run(self) -> None:
        """Pop and run events in time order until none is left; :attr:`now` follows them."""
        heap, pop = self._heap, heapq.heappop
        while heap:
            t, _, _, fn, args = pop(heap)
            self.now = t
            fn(*args)
