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


@given(st.integers(0, 2**70), st.lists(st.integers(), max_size=6).map(tuple))
def test_the_quick_event_makers_make_the_dataclasses_events(worker, hashes):
    # routing.events.stored_event / removed_event set the slots directly: the same object as the constructor's
    from dynlab.routing.events import BlockStored, removed_event, stored_event

    for quick, cls in ((stored_event, BlockStored), (removed_event, BlockRemoved)):
        ev, ref = quick(worker, hashes), cls(worker, hashes)
        assert type(ev) is cls
        assert ev == ref and hash(ev) == hash(ref) and repr(ev) == repr(ref)
        assert ev.runs is None and ev.medium == "GPU" and ev.block_hashes is hashes
