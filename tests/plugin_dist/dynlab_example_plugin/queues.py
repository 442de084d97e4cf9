"""The ``shortest-prompt`` queue policy, registered through the ``dynlab`` entry-point group."""
from __future__ import annotations

import heapq
from itertools import count

from dynlab import hookimpl
from dynlab.engine.queues import QueuePolicy


class ShortestPromptQueue:
    """Waiting requests by prompt length, then arrival (a heap); a preempted one back in its place."""

    def __init__(self):
        self._heap, self._seq = [], count()

    def append(self, req):
        heapq.heappush(self._heap, (req.input_length, req.arrival_ms, next(self._seq), req))

    appendleft = append

    def popleft(self):
        return heapq.heappop(self._heap)[-1]

    def remove(self, req):
        self._heap = [entry for entry in self._heap if entry[-1] is not req]
        heapq.heapify(self._heap)

    def __getitem__(self, i):
        if i != 0:
            raise IndexError(i)
        return self._heap[0][-1]

    def __len__(self):
        return len(self._heap)

    def __iter__(self):
        return (entry[-1] for entry in sorted(self._heap))


class ShortestPrompt(QueuePolicy):
    """Shortest prompt first; preempt the longest running prompt (an example third-party queue policy)."""

    name = "shortest-prompt"

    def waiting_queue(self):
        return ShortestPromptQueue()

    def victim(self, running, waiting=None):
        if waiting is not None:
            return None
        return max(range(len(running)), key=lambda j: running[j].input_length)


@hookimpl
def dynlab_register_queue_policies(register):
    register(ShortestPrompt)
