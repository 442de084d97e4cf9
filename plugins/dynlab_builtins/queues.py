"""Built-in queue policies (``--queue-policy``), registered through the ``dynlab`` entry-point group.

``fcfs`` lives in :mod:`dynlab.engine.queues` (the core's default); ``priority`` and ``priority-displace``
live here, registered exactly as a third-party package would register its own.

A request's priority is its ``priority`` attribute (an int from the trace or the workload spec; 0 when it
has none, vLLM's default); a lower value is more important (vLLM's convention).
"""
from __future__ import annotations

import heapq
from itertools import count
from typing import Optional

from dynlab import hookimpl
from dynlab.engine.queues import Fcfs, QueuePolicy


def priority_of(req) -> int:
    """``req``'s priority: its ``priority`` attribute, 0 without one (vLLM's ``SamplingParams`` default)."""
    return req.attrs.get("priority", 0)


class PriorityQueue:
    """Waiting requests in ``(priority, arrival_ms, id)`` order (a binary heap, stdlib ``heapq``): vLLM's
    ``PriorityRequestQueue`` (``vllm/v1/core/sched/request_queue.py``), whose ``Request.__lt__`` orders by
    priority, then arrival time, then request id. A preempted request goes back in its place, not to the
    front (vLLM's ``prepend_request`` of this queue is its ``add_request``)."""

    __slots__ = ("_heap", "_seq")

    def __init__(self):
        self._heap: list = []
        self._seq = count()  # (never compares two requests: ids are unique within an engine)

    def append(self, req) -> None:
        heapq.heappush(self._heap, (priority_of(req), req.arrival_ms, req.id, next(self._seq), req))

    appendleft = append

    def popleft(self):
        return heapq.heappop(self._heap)[-1]

    def remove(self, req) -> None:
        heap = self._heap
        for k, entry in enumerate(heap):
            if entry[-1] is req:
                heap[k] = heap[-1]
                heap.pop()
                heapq.heapify(heap)  # (rare: async scheduling's stale output; vLLM's remove_request heapifies too)
                return
        raise ValueError(f"{req!r} is not waiting")

    def __getitem__(self, i: int):
        if i != 0:
            raise IndexError("a priority queue shows only its head, [0]")
        return self._heap[0][-1]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self):
        return (entry[-1] for entry in sorted(self._heap))


def _lowest(running: list) -> int:
    """The index of the running request with the largest ``(priority, arrival_ms)``, the first of equals
    (vLLM's ``max(self.running, key=lambda r: (r.priority, r.arrival_time))``)."""
    best, key = 0, (priority_of(running[0]), running[0].arrival_ms)
    for j in range(1, len(running)):
        r = running[j]
        k = (priority_of(r), r.arrival_ms)
        if k > key:
            best, key = j, k
    return best


class Priority(QueuePolicy):
    """vLLM 0.33's --scheduling-policy priority: (priority, arrival) order; preempt the least important."""

    name = "priority"
    attributes = frozenset({"priority"})

    def waiting_queue(self) -> PriorityQueue:
        return PriorityQueue()

    def victim(self, running: list, waiting=None) -> Optional[int]:
        return _lowest(running) if waiting is None else None


class PriorityDisplace(Priority):
    """priority; at max_num_seqs a strictly more important request displaces the least important (vLLM PR #54530)."""

    name = "priority-displace"
    displaces = True

    def victim(self, running: list, waiting=None) -> Optional[int]:
        j = _lowest(running)
        if waiting is None or priority_of(waiting) < priority_of(running[j]):  # priority only: no ping-pong
            return j
        return None


@hookimpl
def dynlab_register_queue_policies(register):
    for cls in (Fcfs, Priority, PriorityDisplace):
        register(cls)
