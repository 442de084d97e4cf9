"""The KV-event buses: what the workers publish reaches the router late, or not at all.

Count-based runs use :class:`CountedEventBus` (delays in requests); timed runs :class:`EventBus`:

Timed runs (``--timing``): a worker publishes a batch of events when they happen (its
``BlockRemoved`` when a step's allocation evicts cached blocks, at the step's start; its
``BlockStored`` at the end of the step that computed the blocks; without delay or loss, the
block boundaries of a bulk run crossed in one go as one merged ``BlockRemoved``, counted once
per boundary: :meth:`EventBus.send_merged`). Each event is dropped with
probability ``loss`` (its own RNG, so the routing RNG is untouched); the rest reach the
router ``delay_ms`` later (at once when 0, before anything else happens at that time).
"""
from __future__ import annotations

import random
from collections import deque
from typing import Callable, Sequence

from dynlab.engine.loop import DELIVER, EventLoop
from dynlab.routing.events import removed_event, stored_event


class _Bus:
    """What both buses share: the subscriber, the publish switch, loss and the counts."""

    __slots__ = ("deliver", "loss", "rng", "publish", "published", "dropped")

    def __init__(self, deliver: Callable, loss: float, rng: random.Random | None, publish: bool):
        self.deliver = deliver
        self.loss = loss
        self.rng = rng or random.Random(0)
        self.publish = publish
        self.published = 0
        self.dropped = 0

    def _keep(self, events: Sequence) -> Sequence:
        """Count ``events`` as published; the ones not dropped (one draw each when ``loss`` > 0)."""
        self.published += len(events)
        if not self.loss:
            return events
        rand, loss = self.rng.random, self.loss
        kept = [ev for ev in events if rand() >= loss]
        self.dropped += len(events) - len(kept)
        return kept


class EventBus(_Bus):
    """Publishes KV events to ``deliver`` (the strategy's ``on_event``) through ``loop``.

    ``delay_ms`` (>= 0), ``loss`` (probability in [0, 1]), ``rng`` (draws one number per
    event when ``loss`` > 0), ``publish`` (False: workers publish nothing).
    Counts: :attr:`published` (events the workers produced while publishing) and :attr:`dropped`.
    """

    __slots__ = ("loop", "delay_ms")

    def __init__(self, loop: EventLoop, deliver: Callable, *, delay_ms: float = 0.0, loss: float = 0.0,
                 rng: random.Random | None = None, publish: bool = True):
        super().__init__(deliver, loss, rng, publish)
        self.loop = loop
        self.delay_ms = delay_ms

    def send(self, events: Sequence) -> None:
        """Publish ``events`` (one batch, at the loop's current time)."""
        if not self.publish or not events:
            return
        events = self._keep(events)
        if not events:
            return
        if self.delay_ms:
            self.loop.at(self.loop.now + self.delay_ms, DELIVER, self._deliver, events)
        else:
            self._deliver(events)

    def send_one(self, event) -> None:
        """Publish one event: :meth:`send` of ``[event]`` (the same draw, delay and delivery), without the list."""
        if not self.publish:
            return
        self.published += 1
        if self.loss and self.rng.random() < self.loss:
            self.dropped += 1
            return
        if self.delay_ms:
            self.loop.at(self.loop.now + self.delay_ms, DELIVER, self._deliver, (event,))
        else:
            self.deliver(event)

    def send_merged(self, event, count: int) -> None:
        """Publish ``count`` (>= 1) events of one worker as ``event``, their merge (a ``BlockRemoved``
        naming all their blocks, in order): counted as ``count`` published, delivered once. For the
        router's index the merge is the events one after the other; only without loss or delay, which
        act on each event (raises ``ValueError`` otherwise)."""
        if self.loss or self.delay_ms:
            raise ValueError("send_merged: events are lost or delayed one by one (use send)")
        if not self.publish:
            return
        self.published += count
        self.deliver(event)

    def _deliver(self, events: Sequence) -> None:
        deliver = self.deliver
        for ev in events:
            deliver(ev)


class CountedEventBus(_Bus):
    """The count-based replay's KV-event bus: delays count requests, not time.

    Events produced while serving request ``i`` reach ``deliver`` just before request
    ``i + 1 + delay`` is routed (:meth:`tick` with the index of the request about to be routed
    delivers what is due); each is dropped with probability ``loss`` (its own ``rng``).
    :meth:`flush` delivers what is still pending at the end. Counts as :class:`EventBus`.
    ``direct``: the strategy's ``on_change``, called with the net change instead of making and
    delivering the two events when there is neither delay nor loss (the events still count as published).
    """

    __slots__ = ("delay", "_pending", "_now", "direct")

    def __init__(self, deliver: Callable, *, delay: int = 0, loss: float = 0.0,
                 rng: random.Random | None = None, publish: bool = True, direct: Callable | None = None):
        super().__init__(deliver, loss, rng, publish)
        self.delay = delay
        #: the strategy's ``on_change`` (:attr:`dynlab.routing.strategy.Strategy.on_change`), or ``None``
        self.direct = direct
        self._pending: deque = deque()  # (due request index, event)
        self._now = 0

    def tick(self, i: int) -> None:
        """Request ``i`` is about to be routed: deliver every event due by then."""
        self._now = i
        pending = self._pending
        while pending and pending[0][0] <= i:
            self.deliver(pending.popleft()[1])

    def change(self, worker: int, stored: Sequence, removed: Sequence) -> None:
        """Publish a worker's net change for the request being served: ``BlockRemoved``, then ``BlockStored``."""
        if not self.publish:
            return
        if not (self.loss or self.delay):  # the common case, delivered at once: no list, no bookkeeping
            direct = self.direct
            if direct is not None:  # the strategy takes the net change itself: no event objects
                self.published += (1 if removed else 0) + (1 if stored else 0)
                direct(worker, stored, removed)
                return
            deliver = self.deliver
            if removed:
                self.published += 1
                deliver(removed_event(worker, tuple(removed)))
            if stored:
                self.published += 1
                deliver(stored_event(worker, tuple(stored)))
            return
        events = []
        if removed:
            events.append(removed_event(worker, tuple(removed)))
        if stored:
            events.append(stored_event(worker, tuple(stored)))
        events = self._keep(events)
        if self.delay:
            due = self._now + 1 + self.delay
            self._pending.extend((due, ev) for ev in events)
        else:
            for ev in events:
                self.deliver(ev)

    def flush(self) -> None:
        """Deliver every pending event (late events still reach the strategy; no decision depends on them)."""
        pending = self._pending
        while pending:
            self.deliver(pending.popleft()[1])
