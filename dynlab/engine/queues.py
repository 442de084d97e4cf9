"""Queue policies: the order of an engine's waiting queue and the running request it preempts.

A queue policy (``--queue-policy NAME``, a plugin kind: :func:`dynlab.plugins.queue_policies`) is a
:class:`QueuePolicy` subclass with a class attribute ``name`` and two methods:

- :meth:`QueuePolicy.waiting_queue` gives each engine's waiting queue, a :class:`WaitingQueue`: the
  scheduler appends an arriving request (``append``), puts a preempted one back (``appendleft``), looks
  at the next to admit (``queue[0]``) and takes it (``popleft``), or takes one out (``remove``);
- :meth:`QueuePolicy.victim` picks the running request to preempt: when a running request cannot get
  its KV slots (always), and, for a policy whose ``displaces`` is true, when a waiting request finds
  ``max_num_seqs`` requests running (it may displace one, or not).

``fcfs`` (:class:`Fcfs`, the default) is vLLM's ``FCFSRequestQueue`` and its preemption of the newest
running request (``vllm/v1/core/sched/request_queue.py``, ``scheduler.py``); the built-in plugin
(``dynlab_builtins.queues``) registers it with vLLM's priority policies. The scheduler
(:mod:`dynlab.engine.scheduler`) never looks inside a request for the policy: a policy reads what it
needs from the request (its :attr:`~dynlab.engine.request.EngineRequest.attrs`, ``arrival_ms``).
"""
from __future__ import annotations

from collections import deque
from typing import Optional, Protocol

__all__ = ["QueuePolicy", "WaitingQueue", "Fcfs", "FcfsQueue"]


class WaitingQueue(Protocol):
    """An engine's waiting queue: what the scheduler calls (``deque``'s names, so FCFS is a deque)."""

    def append(self, req) -> None:
        """An arriving request (or one whose KV arrived by a transfer and must recompute)."""

    def appendleft(self, req) -> None:
        """A request preempted while running: FCFS puts it at the front, a priority queue in its place."""

    def popleft(self):
        """Take the request ``self[0]`` names (the next to admit)."""

    def remove(self, req) -> None:
        """Take ``req`` out wherever it is (async scheduling: a preempted request whose step in flight
        finished it); ``ValueError`` when it is not there."""

    def __getitem__(self, i: int):
        """``self[0]``: the next request to admit (``IndexError`` when empty)."""

    def __len__(self) -> int: ...

    def __iter__(self): ...


class FcfsQueue(deque):
    """First come, first served: arrivals at the back, preempted requests at the front (a ``deque``)."""

    __slots__ = ()


class QueuePolicy:
    """Base class of queue policies; subclasses set ``name`` (the ``--queue-policy`` value).

    ``displaces``: whether :meth:`victim` is also asked when a waiting request meets ``max_num_seqs``
    running requests (``False``: the waiting loop stops there, as vLLM 0.33 does). ``attributes``: the
    request attributes the policy reads (:data:`dynlab.traces.format.ATTRIBUTES` names), for the docs
    and ``dynlab plugins``.
    """

    name: str = ""
    displaces: bool = False
    attributes: frozenset = frozenset()

    def waiting_queue(self) -> WaitingQueue:
        """A new, empty waiting queue for one engine."""
        raise NotImplementedError

    def victim(self, running: list, waiting=None) -> Optional[int]:
        """The index in ``running`` (the scheduler's running list, in running order, non-empty) of the
        request to preempt. ``waiting`` ``None``: a running request cannot get its KV slots, and one must
        go (it may be that request itself). Else ``waiting`` (a waiting request that passed every other
        admission check) finds ``max_num_seqs`` running: return the index of the runner it displaces, or
        ``None`` to keep them all (asked only when :attr:`displaces`)."""
        raise NotImplementedError


class Fcfs(QueuePolicy):
    """First come, first served; preempt the newest running request (vLLM's default policy)."""

    name = "fcfs"

    def waiting_queue(self) -> FcfsQueue:
        return FcfsQueue()

    def victim(self, running: list, waiting=None) -> Optional[int]:
        return len(running) - 1 if waiting is None else None
