"""The step driver (dynlab.engine.steps.StepDriver), the one step loop of aggregated and P/D pools: hand
cases on one engine with flat 10 ms steps (a test double), and a pool that publishes nothing."""
from __future__ import annotations

from dynlab.engine.loop import EventLoop
from dynlab.engine.request import EngineRequest
from dynlab.engine.steps import StepDriver
from dynlab.engine.worker import EngineWorker
from test_tiers import Flat  # every step takes ms: hand-computable times


class Bus:
    """A bus without delay or loss that records what it is sent."""

    delay_ms, loss = 0.0, 0.0

    def __init__(self):
        self.sent = []

    def send_one(self, event):
        self.sent.append(event)

    def send(self, events):
        self.sent.extend(events)


def drive(engine, requests, publishes=True):
    """Submit ``(arrival ms, EngineRequest)`` pairs at their times through the driver's ``resume``; the
    ``(worker, start, end, finished ids)`` of every step the driver ended, and the bus."""
    loop, bus, ends = EventLoop(), Bus(), []
    driver = StepDriver([engine], loop, bus, lambda w, res: ends.append(
        (w, res.start, res.end, [r.id for r, _ in res.finished])), publishes=publishes)

    def submit(req):
        before = engine.step_end
        assert engine.submit(req, loop.now)
        driver.resume(0, before)

    for t, req in requests:
        loop.at(t, 2, submit, req)
    loop.run()
    return ends, bus, driver


def test_steps_follow_each_other_until_the_last_finish():
    # one request of 8 tokens (2 blocks of 4) and 3 output tokens, single steps (bulk=False), 10 ms each:
    # the prefill step 0-10 gives token 1, decode steps 10-20 and 20-30 tokens 2 and 3: it finishes at 30
    engine = EngineWorker(0, 16, 4, Flat(10.0), bulk=False)
    ends, bus, _ = drive(engine, [(0.0, EngineRequest("a", 0.0, 8, 3, [1, 2]))])
    assert ends == [(0, 0.0, 10.0, []), (0, 10.0, 20.0, []), (0, 20.0, 30.0, ["a"])]
    assert engine.idle and bus.sent == []


def test_a_request_arriving_mid_step_joins_the_next_one():
    # a (t=0): 4 tokens, 2 outputs: steps 0-10 (prefill) and 10-20 (decode, finish). b arrives at 5, while
    # step 0-10 runs: resume() leaves that step alone (its end is unchanged) and b joins the step at 10:
    # 10-20 prefills b (first token) and decodes a (finished); 20-30 decodes b (its 2nd token, finished)
    engine = EngineWorker(0, 16, 4, Flat(10.0), bulk=False)
    ends, _, _ = drive(engine, [(0.0, EngineRequest("a", 0.0, 4, 2, [1])), (5.0, EngineRequest("b", 5.0, 4, 2, [2]))])
    assert ends == [(0, 0.0, 10.0, []), (0, 10.0, 20.0, ["a"]), (0, 20.0, 30.0, ["b"])]


def evicting_pair():
    # a pool of 2 blocks of 4 tokens: a (4 tokens, name 1, 1 output: 4 + 1 - 1 = 4 tokens, 1 block) finishes
    # at 10, its block 1 cached; b (t=100, names 2 and 3, 8 tokens, 1 output: 8 tokens, 2 blocks) needs the
    # whole pool: it evicts block 1 at its step's start (100)
    return [(0.0, EngineRequest("a", 0.0, 4, 1, [1])), (100.0, EngineRequest("b", 100.0, 8, 1, [2, 3]))]


def test_a_publishing_pool_sends_what_a_step_start_evicts():
    engine = EngineWorker(0, 2, 4, Flat(10.0), bulk=False)
    ends, bus, driver = drive(engine, evicting_pair())
    assert [e[3] for e in ends] == [["a"], ["b"]]
    assert [(type(ev).__name__, ev.worker, ev.hashes) for ev in bus.sent] == [("BlockRemoved", 0, (1,))]
    assert driver.evicted_blocks == 1


def test_a_pool_that_publishes_nothing_sends_nothing():
    # the same run as a P/D decode pool (publishes=False): the same steps, no event, no eviction counted
    engine = EngineWorker(0, 2, 4, Flat(10.0), bulk=False)
    ends, bus, driver = drive(engine, evicting_pair(), publishes=False)
    assert [e[3] for e in ends] == [["a"], ["b"]]
    assert bus.sent == [] and driver.evicted_blocks == 0
