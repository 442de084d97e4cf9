"""``LatencyModel.decode_ms_at``: one call for a bulk decode run's block boundaries and end, the same
floats as ``decode_ms`` per step count, and the roofline's the same floats as its closed form had
before ``decode_ms_at`` computed it (the reference below is that code, kept to pin the doubles: the
timed engine's outputs must stay byte-identical), with the server terms off; with them on, the closed form is
the sum of its steps (tests/latency/test_overheads.py)."""
from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynlab.latency.grid import build_latency_model, hardware_for
from helpers import SERVER_TERMS_OFF


def _arith(a, b, lo, hi):
    n = hi - lo
    if n <= 0:
        return 0.0
    return n * a + b * n * (lo + hi - 1) / 2.0


def reference_roofline_decode_ms(model, requests, context, steps):
    """``Roofline.decode_ms`` as it was at d90a0de, one step count at a time."""
    if steps <= 0:
        return 0.0
    c0 = model._token_ms * requests + model._pair_ms * context
    c1 = model._pair_ms * requests
    m0 = model._weights_ms + model._kv_ms * context
    m1 = model._kv_ms * requests

    def split_at(x):
        return min(max(math.ceil(x), 0), steps)

    if c1 > m1:
        split = split_at((m0 - c0) / (c1 - m1))
        total = _arith(m0, m1, 0, split) + _arith(c0, c1, split, steps)
    elif c1 < m1:
        split = split_at((c0 - m0) / (m1 - c1))
        total = _arith(c0, c1, 0, split) + _arith(m0, m1, split, steps)
    else:
        total = _arith(c0, c1, 0, steps) if c0 >= m0 else _arith(m0, m1, 0, steps)
    return total + model._overhead * steps


# dense models on one GPU: the fitted closed form, unchanged (tp > 1 adds the all-reduce: the test below)
HARDWARE = [("llama-3.1-8b", "h100", 1), ("qwen3-0.6b", "l40s", 1), ("qwen3-32b", "h200", 1)]


@given(hw=st.sampled_from(HARDWARE), mfu=st.floats(0.01, 1), mbu=st.floats(0.01, 1),
       overhead=st.floats(0, 10), requests=st.integers(0, 1024), context=st.integers(0, 1 << 24),
       steps=st.lists(st.integers(-2, 5000), max_size=20))
def test_roofline_decode_ms_at_is_the_old_closed_form_bit_for_bit(hw, mfu, mbu, overhead, requests, context,
                                                                   steps):
    model = build_latency_model("roofline", hardware_for(*hw), {"mfu": mfu, "mbu": mbu, "overhead_ms": overhead,
                                                                **SERVER_TERMS_OFF["roofline"]})
    want = [reference_roofline_decode_ms(model, requests, context, j) for j in steps]
    got = model.decode_ms_at(requests, context, steps)
    assert [x.hex() for x in got] == [x.hex() for x in want]  # the same doubles, not just close
    assert [model.decode_ms(requests, context, j).hex() for j in steps] == [x.hex() for x in want]


def test_roofline_crossing_inside_the_run():
    # a crossing strictly inside the steps asked, so both parts of the sum count: at mfu 0.05 the
    # compute line is steep enough to cross the memory line after a few steps (asserted below)
    model = build_latency_model("roofline", hardware_for("qwen3-0.6b", "l40s"), {"mfu": 0.05, "mbu": 1.0,
                                                                                   **SERVER_TERMS_OFF["roofline"]})
    c0 = model._token_ms * 64 + model._pair_ms * 64 * 100
    m0 = model._weights_ms + model._kv_ms * 64 * 100
    c1, m1 = model._pair_ms * 64, model._kv_ms * 64
    split = math.ceil((m0 - c0) / (c1 - m1)) if c1 > m1 else math.ceil((c0 - m0) / (m1 - c1))
    assert 1 < split < 400
    steps = [1, split - 1, split, split + 1, 399]
    assert model.decode_ms_at(64, 6400, steps) == [reference_roofline_decode_ms(model, 64, 6400, j) for j in steps]


@pytest.mark.parametrize("name", ["linear", "blis"])
@given(requests=st.integers(0, 300), context=st.integers(0, 1 << 20), steps=st.lists(st.integers(0, 400), max_size=8))
def test_default_decode_ms_at_is_decode_ms_per_step_count(name, requests, context, steps):
    model = build_latency_model(name, hardware_for())
    assert model.decode_ms_at(requests, context, steps) == [model.decode_ms(requests, context, j) for j in steps]


# every other hardware: RooflineTerms (experts, MLA, windows, state, communication); the closed form
# (or, with window layers, one pass) equals the sum of the steps it stands for
OTHER = [("qwen3-32b", "h200", 2, {}), ("qwen3-30b-a3b", "h100", 1, {}), ("deepseek-v3", "h200", 8, {"ep": 8}),
         ("gpt-oss-120b", "h100", 1, {}), ("nemotron-h-56b", "h100", 2, {}), ("llama-3.1-70b", "h100", 2, {"pp": 2})]


@given(hw=st.sampled_from(OTHER), requests=st.integers(0, 512), context=st.integers(0, 1 << 20),
       steps=st.lists(st.integers(-2, 300), max_size=6))
def test_every_roofline_decode_run_is_the_sum_of_its_steps(hw, requests, context, steps):
    from dynlab.latency.base import StepBatch

    name, gpu, tp, extra = hw
    model = build_latency_model("roofline", hardware_for(name, gpu, tp, **extra))
    got = model.decode_ms_at(requests, context, steps)
    for j, value in zip(steps, got):
        want = sum(model.step_ms(StepBatch((), (), requests, context + i * requests)) for i in range(max(j, 0)))
        assert value == pytest.approx(want, rel=1e-9, abs=1e-9)
