"""The KV-event bus: what the workers publish reaches the router late, or not at all.

Timed runs (``--timing``): a worker publishes a batch of events when they happen (its
``BlockRemoved`` when a step's allocation evicts cached blocks, at the step's start; its
``BlockStored`` at the end of the step that computed the blocks). Each event is dropped with
probability ``loss`` (its own RNG, so the routing RNG is untouched); the rest reach the
router ``delay_ms`` later (at once when 0, before anything else happens at that time).
"""
from __future__ import annotations

import random
from typing import Callable, Sequence

from dynlab.engine.loop import DELIVER, EventLoop


class EventBus:
    """Publishes KV events to ``deliver`` (the strategy's ``on_event``) through ``loop``.

    ``delay_ms`` (>= 0), ``loss`` (probability in [0, 1]), ``rng`` (draws one number per
    event when ``loss`` > 0), ``publish`` (False: workers publish nothing).
    Counts: :attr:`published` (events the workers produced while publishing) and :attr:`dropped`.
    """

    __slots__ = ("loop", "deliver", "delay_ms", "loss", "rng", "publish", "published", "dropped")

    def __init__(self, loop: EventLoop, deliver: Callable, *, delay_ms: float = 0.0, loss: float = 0.0,
                 rng: random.Random | None = None, publish: bool = True):
        self.loop = loop
        self.deliver = deliver
        self.delay_ms = delay_ms
        self.loss = loss
        self.rng = rng or random.Random(0)
        self.publish = publish
        self.published = 0
        self.dropped = 0

    def send(self, events: Sequence) -> None:
        """Publish ``events`` (one batch, at the loop's current time)."""
        if not self.publish or not events:
            return
        self.published += len(events)
        if self.loss:
            rand, loss = self.rng.random, self.loss
            kept = [ev for ev in events if rand() >= loss]
            self.dropped += len(events) - len(kept)
            events = kept
        if not events:
            return
        if self.delay_ms:
            self.loop.at(self.loop.now + self.delay_ms, DELIVER, self._deliver, events)
        else:
            self._deliver(events)

    def _deliver(self, events: Sequence) -> None:
        deliver = self.deliver
        for ev in events:
            deliver(ev)
