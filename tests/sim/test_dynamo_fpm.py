"""dynamo-load's forward-pass store (plugins/dynlab_builtins/dynamo_fpm.py): which pass a call reads per worker
(Dynamo's get_recent_stats: the latest), the moving averages, the bucketed retirement and the rejected fits, each
against figures worked by hand."""
import pytest

from dynlab.engine.controller import FleetState, StepSample, WorkerState
from dynlab_builtins.dynamo_fpm import Average, Fpm, Latest


def _w(i, running=0, waiting=0, queued=0):
    return WorkerState(i, "live", 0.0, waiting, running, 0.0, running + waiting, queued, 0, 100_000, 2048)


def test_a_moving_average_skips_leading_zeros_and_keeps_its_last_values():
    avg = Average(3)
    for v in (0, 0, 4, 0, 2):  # the two leading zeros are skipped: (4, 0, 2), mean 2
        avg.add(v)
    assert avg.value == 2.0
    avg.add(6)  # (0, 2, 6): 8 / 3
    assert avg.value == pytest.approx(8 / 3)
    assert Average(3).value == 0.0


def test_the_latest_pass_of_each_worker_as_dynamo_reads_it():
    prefill = StepSample(0, 100, 1, 2, 1000, 25.0, 10.0)  # a prefill step ending at 10 s
    decode = StepSample(0, 0, 0, 3, 1100, 8.0, 10.5)  # then a bulk decode run of 8 ms steps ending at 10.5 s
    late = StepSample(1, 300, 1, 2, 900, 30.0, 10.995)  # worker 1: a prefill step 5 ms before the call
    early = StepSample(1, 0, 0, 2, 800, 8.0, 10.9)
    queued = StepSample(3, 0, 0, 4, 500, 9.0, 10.2)
    seen = Latest().read(11.0, (prefill, decode, early, late, queued),
                         [_w(0, running=3), _w(1, running=3), _w(2), _w(3, running=4, queued=700), _w(4, running=1)])
    # worker 0 decodes with nothing to prefill; 0.5 s >= 8 ms since its last pass: a step of its decode run is done
    assert seen[0] == decode
    # worker 1: 11.0 - 10.995 = 5 ms < one 8 ms decode step: its latest is still the prefill step
    assert seen[1] == late
    # worker 2 idle, worker 4 never ran a step: heartbeats (all zeros, wall time 0)
    assert seen[2] == StepSample(2, 0, 0, 0, 0, 0.0, 11.0)
    assert seen[4] == StepSample(4, 0, 0, 0, 0, 0.0, 11.0)
    # worker 3 has 700 prompt tokens to compute (a prefill step in progress): its last reported pass
    assert seen[3] == queued


def test_the_store_retires_from_the_fullest_cell_and_a_heartbeat_feeds_only_the_step_average():
    fpm = Fpm(3)
    a, b, c, d = (StepSample(0, 0, 0, 1, 0, 5.0), StepSample(0, 10, 1, 0, 0, 6.0), StepSample(0, 100, 1, 1, 100, 9.0),
                  StepSample(0, 12, 1, 0, 1, 6.2))
    for s in (a, b, c, d):
        fpm.add(s)
    # 4 points > 3: range 0..100 on both axes, 4 cells each: a (0, 0), b (0.4 -> 0, 0), c (4 -> 3, 3),
    # d (0.48 -> 0, 0.04 -> 0): cell (0, 0) holds three, its oldest (a) goes
    assert fpm.points == [b, c, d]
    fpm.add(StepSample(0, 0, 0, 0, 0, 0.0))  # a heartbeat: no point; the prompt tokens per step average gets a 0
    assert len(fpm.points) == 3
    # the averages keep the last 3 values each. Prompt tokens per step: a's 0 skipped (leading), 10, 100, 12, then
    # the heartbeat's 0: (100 + 12 + 0) / 3
    assert fpm.avg_prefill.value == pytest.approx(112 / 3)
    # prompt tokens per prefill request (b, c, d): (10 + 100 + 12) / 3; KV per decode request: a's 0 / 1 skipped
    # (leading), c's 100 / 1: 100
    assert fpm.avg_isl.value == pytest.approx(122 / 3)
    assert fpm.avg_decode_len.value == pytest.approx(100.0)


def test_a_fit_with_a_negative_load_coefficient_is_rejected():
    fpm = Fpm(64)
    # ms = 10 - 0.05 x prompt tokens + 0.02 x KV tokens, exactly: more prompt tokens, less time
    for p, kv in ((0, 0), (100, 0), (0, 100), (100, 100), (50, 50)):
        fpm.add(StepSample(0, p, 1 if p else 0, 1, kv, 10 - 0.05 * p + 0.02 * kv))
    assert fpm.model(5) is None
    good = Fpm(64)
    for p, kv in ((0, 0), (100, 0), (0, 100), (100, 100), (50, 50)):
        good.add(StepSample(0, p, 1 if p else 0, 1, kv, 10 + 0.05 * p + 0.02 * kv))
    assert good.model(6) is None  # 5 points < min_observations 6
    assert good.model(5) == pytest.approx((10.0, 0.05, 0.02), abs=1e-6)


def test_dynamo_load_reads_one_pass_per_worker_and_call():
    from dynlab.engine.controller import Add
    from dynlab.sim.control import build_controller

    ctl = build_controller("dynamo-load:cold_start_s=0,ttft=20,itl=100")
    # each call: one worker 4,000 prompt tokens queued; its period ran a prefill step of 100 tokens, then (the last)
    # one of 200: the latest is the 200-token step (ms 10 + 0.05 x 200 = 20), one point a call
    for k in range(1, 6):
        steps = (StepSample(0, 100, 1, 0, 0, 15.0, 5.0 * k - 1), StepSample(0, 200 + k, 1, 0, 0, 20.0 + 0.05 * k,
                                                                              5.0 * k - 0.5))
        out = ctl.decide(FleetState(5.0 * k, 5.0, (_w(0, running=1, queued=4000),), 0, (), 0.0, steps))
        assert len(ctl.fpm.points) == k
        # calls 1-4: fewer than 5 points, no decision; call 5: points (201..205 tokens, 20.05..20.25 ms) fit
        # ms = 10 + 0.05 x tokens, and 4,000 + avg_isl 203 tokens in chunks of 2,048 cost far above 20 ms: up
        assert out == ([Add(0.0)] if k == 5 else ())


def test_every_pass_counts_a_bulk_decode_run_as_its_steps():
    from dynlab.sim.control import build_controller

    ctl = build_controller("dynamo-load:cold_start_s=0,fpm=every")
    # a prefill step (300 tokens) then a bulk run of 5 decode steps: six iterations, one prompt-carrying: 300 / 6 = 50
    # prompt tokens per step (one sample per run would give 300 / 2 = 150)
    steps = (StepSample(0, 300, 1, 0, 0, 20.0, 1.0), StepSample(0, 0, 0, 1, 400, 8.0, 1.04, 5))
    ctl.decide(FleetState(5.0, 5.0, (_w(0, running=1),), 0, (), 0.0, steps))
    assert len(ctl.fpm.points) == 6
    assert ctl.avg_prefill == pytest.approx(50.0)
