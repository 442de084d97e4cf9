"""A controller's metric scrape delay and the router's discovery delay (issue 41, item 2), on the hand-derived step
scenario of ``tests/sim/test_autoscale.py`` (flat 100 ms steps, one request per batch, HPA every 5 s on the queue,
target 1, max 4, cold start 10 s). Without a delay, HPA's first call in the step (65 s) adds three workers, ready at
75 s (that file's first test derives it)."""
from __future__ import annotations

import re

import pytest

from dynlab.sim.control import build_controller
from test_autoscale import HPA, _step


def test_a_scrape_delay_shifts_the_scale_up_by_exactly_the_delay(tmp_path):
    out = _step(tmp_path, controller=HPA + ",scrape_delay_s=2")
    # the observation at 65 s is the same as without the delay (nothing the controller did differs before it): 10
    # waiting, desired 4; the decision is made and applied at 65 + 2 = 67 s, the workers ready at 67 + 10 = 77 s
    adds = [e for e in out["scale_events"] if e[1] == "add"]
    assert adds == [[67.0, "add", 1], [67.0, "add", 2], [67.0, "add", 3]]
    assert [w["ready_s"] for w in out["worker_lifetimes"]] == [0.0, 77.0, 77.0, 77.0]
    # the observations keep the 5 s grid: every retirement is a call's time (a multiple of 5) plus the 2 s
    assert {e[0] % 5 for e in out["scale_events"]} == {2.0}


def test_a_discovery_delay_makes_a_join_routable_and_a_leave_unroutable_that_much_later(tmp_path):
    out = _step(tmp_path, controller=HPA + ",discovery_delay_s=3")
    # the same adds at 65 s; routable after the cold start and the discovery: 65 + 10 + 3 = 78 s
    assert [e[:2] for e in out["scale_events"] if e[1] == "add"] == [[65.0, "add"]] * 3
    assert [w["ready_s"] for w in out["worker_lifetimes"]] == [0.0, 78.0, 78.0, 78.0]
    assert out["workers_over_time"][1:4] == [[78.0, 2], [78.0, 3], [78.0, 4]]
    # every retirement: the worker leaves the routable set 3 s after the decision (its drain starts then: the
    # workers are idle at the end of the step and leave at once)
    retires = {e[2]: e[0] for e in out["scale_events"] if e[1] == "retire"}
    lifetimes = out["worker_lifetimes"]
    assert retires and all(lifetimes[w]["left_s"] == pytest.approx(t + 3.0) for w, t in retires.items())
    drops = [t for t, _ in out["workers_over_time"][4:]]
    assert drops == pytest.approx(sorted(t + 3.0 for t in retires.values()))


def test_without_delays_the_result_is_the_same_as_with_zero_delays(tmp_path):
    plain = _step(tmp_path)
    zero = _step(tmp_path, controller=HPA + ",scrape_delay_s=0,discovery_delay_s=0")
    assert {k: v for k, v in zero.items() if k != "controller"} == {k: v for k, v in plain.items() if k != "controller"}


@pytest.mark.parametrize("spec", ["hpa:max=2,target=1,scrape_delay_s=-1", "hpa:max=2,target=1,discovery_delay_s=x",
                                  "static:scrape_delay_s=1"])
def test_bad_delays_are_refused(spec):
    with pytest.raises(ValueError, match="scrape_delay_s|discovery_delay_s|unknown option"):
        build_controller(spec)


def test_delayed_metrics_are_read_against_the_fleet_as_it_is_now(tmp_path):
    from dynlab.engine.controller import WorkerState
    from dynlab.sim.control import members_now

    seen = (WorkerState(0, "live", 0.0, 7, 1, 0.5, 8), WorkerState(1, "live", 0.0, 3, 1, 0.2, 4))
    now = (WorkerState(0, "live", 0.0, 0, 0, 0.0, 0), WorkerState(1, "draining", 0.0, 0, 0, 0.0, 1),
           WorkerState(2, "starting", 20.0, 0, 0, 0.0, 0))
    # worker 0: its metrics as seen; worker 1: retired since (draining now), its old metrics; worker 2: added since,
    # not seen: zeros
    assert members_now(seen, now) == (seen[0], seen[1]._replace(state="draining"), now[2])
    # a delay of 12 s at a 5 s period: three decisions in flight at once, each on its 12 s old metrics; without the
    # members read now, a later one would retire a worker an earlier one had retired (a run-stopping error)
    out = _step(tmp_path, controller=HPA + ",down_window=0,scrape_delay_s=12")
    assert out["scale_events"] and {e[0] % 5 for e in out["scale_events"]} == {2.0}
    assert all(w["left_s"] is None or w["left_s"] >= w["ready_s"] for w in out["worker_lifetimes"])


def test_a_retirement_applied_after_the_last_finish_bills_no_idle_hours():
    from dynlab.engine.scaling_metrics import _held_until

    # a worker joined at 0 ms, retired by a delayed decision at 3,600,000 ms, the run's last finish at 1,325 ms:
    # billed 1,325 ms, not an hour; still there: to the end; added after the end: nothing
    assert _held_until(3_600_000.0, 0.0, 1_325.0) == 1_325.0
    assert _held_until(500.0, 0.0, 1_325.0) == 500.0
    assert _held_until(None, 0.0, 1_325.0) == 1_325.0
    assert _held_until(None, 2_000.0, 1_325.0) == 2_000.0


@pytest.mark.parametrize("spec, words", [
    ("hpa:metric=running,target=32,max=2,scrape_delay_s=1e300", "scrape_delay_s=1e300 must be at most 1,000,000,000"),
    ("hpa:metric=running,target=32,max=2,discovery_delay_s=2e9", "discovery_delay_s=2e9 must be at most"),
    ("hpa:metric=running,target=32,max=2,period=1e10", "period=1e10 must be at most"),
    ("dynamo-throughput:itl=20,replay_requests=100000000000", "replay_requests=100000000000 must be at most 100,000"),
])
def test_controller_times_and_replays_are_bounded_when_parsed(spec, words):
    # past the simulated clock's horizon (1e12 ms = 1e9 s) a delay or period would never come; a capacity replay
    # of more than 100,000 requests is refused before it starts
    with pytest.raises(ValueError, match=re.escape(words)):
        build_controller(spec)
