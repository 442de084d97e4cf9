"""The result's queue_over_time (dynlab.engine.scaling_metrics.ScalingRecorder): requests waiting per controller
window, worked by hand on stub requests."""
from types import SimpleNamespace

from dynlab.engine.scaling_metrics import ScalingRecorder


def test_requests_waiting_per_window_by_hand():
    serving = SimpleNamespace(slo_ttft_ms=None, slo_tpot_ms=None, class_slos=None, warmup=0)
    rec = ScalingRecorder(SimpleNamespace(fleet=SimpleNamespace(env=SimpleNamespace(serving=serving))), 1, 10.0)
    reqs = [SimpleNamespace(id=0, arrival_ms=2000.0, first_scheduled_ms=7000.0),
            SimpleNamespace(id=1, arrival_ms=8000.0, first_scheduled_ms=25000.0),
            SimpleNamespace(id=2, arrival_ms=12000.0, first_scheduled_ms=None),  # shed: never scheduled
            SimpleNamespace(id=3, arrival_ms=41000.0, first_scheduled_ms=41000.0)]
    for r in reqs:
        rec.on_arrival(r, r.arrival_ms)
    for r in reqs:
        rec.on_finish(r, 50000.0)
    # windows of 10 s. Window 0: request 0 waits 2-7 s (5 s) and request 1 8-10 s (2 s): 7 / 10 = 0.7; window 1:
    # request 1 all of it, 1.0; window 2: request 1 20-25 s, 0.5; window 3: nobody, 0; window 4: request 3 arrives
    # and is scheduled at once, 0 (listed: the last arrival's window)
    assert rec.queue_over_time() == [[0.0, 0.7], [10.0, 1.0], [20.0, 0.5], [30.0, 0.0], [40.0, 0.0]]
    assert ScalingRecorder(None, 1, 10.0).queue_over_time() == []
