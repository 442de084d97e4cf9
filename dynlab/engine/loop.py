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

#: the latest simulated time (ms) a run may reach: 10^12 ms, about 31.7 years. Up to it the float
#: clock still tells apart times 2^-13 ms (0.12 us) apart (a double's 53-bit mantissa), and sums of
#: millions of per-request times stay far from overflowing; beyond it, a step's few ms vanish into
#: rounding and absurd inputs (``--time-scale 1e308``) end in infinities. The producers of times
#: (arrivals, engine steps, loads, KV transfers) refuse to pass it, naming the option to change.
HORIZON_MS = 1e12


def past_horizon(t: float, what: str, fix: str) -> ValueError:
    """The one-line ``ValueError`` for a time ``t`` (ms) past :data:`HORIZON_MS` (or not a number):
    ``WHAT would reach T ms, past the simulated clock's horizon (1e+12 ms, 31.7 years); FIX``."""
    return ValueError(f"{what} would reach {t:g} ms, past the simulated clock's horizon "
                      f"({HORIZON_MS:g} ms, 31.7 years); {fix}")


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

    def run(self) -> None:
        """Pop and run events in time order until none is left; :attr:`now` follows them."""
        heap, pop = self._heap, heapq.heappop
        while heap:
            t, _, _, fn, args = pop(heap)
            self.now = t
            fn(*args)
