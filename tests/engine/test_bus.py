"""``EventBus.send_one(ev)`` is ``send([ev])``: the same loss draws, delays, deliveries and counts."""
from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from dynlab.engine.bus import EventBus
from dynlab.engine.loop import STEP_START, EventLoop
from dynlab.routing.events import BlockRemoved


def _drive(one: bool, delay: float, loss: float, publish: bool, batches: list) -> tuple:
    """Publish one event at each time in ``batches`` through a fresh bus; what reached the subscriber
    (time, event), the counts, and the loss RNG's next draw."""
    loop = EventLoop()
    got = []
    bus = EventBus(loop, lambda ev: got.append((loop.now, ev)), delay_ms=delay, loss=loss,
                   rng=random.Random(7), publish=publish)
    for i, t in enumerate(batches):
        ev = BlockRemoved(i % 3, (i,))
        loop.at(t, STEP_START, bus.send_one if one else (lambda e: bus.send([e])), ev)
    loop.run()
    return got, bus.published, bus.dropped, bus.rng.random()


@given(delay=st.sampled_from([0.0, 0.5, 20.0]), loss=st.sampled_from([0.0, 0.1, 0.5, 1.0]), publish=st.booleans(),
       times=st.lists(st.integers(0, 50).map(float), max_size=30))
def test_send_one_is_send_of_a_list_of_one(delay, loss, publish, times):
    times.sort()
    assert _drive(True, delay, loss, publish, times) == _drive(False, delay, loss, publish, times)
