"""Attention-DP ranks (dynlab issue 43 item 1): plan's per-request floors on one rank's latency model, and a
lockstep step composed of each rank's attention on its own batch plus the expert layers on every rank's tokens.

The hand model, :class:`ToyMoe` (``--latency-model toy-moe``, registered by the tests), separates the two parts:
each rank's attention on its own batch, ``a(b) = 1 ms x prefill tokens + 2 ms x decodes``, and the expert layers,
``0.5 ms x tokens`` (prefill tokens + decodes) of the tokens they are given, plus 10 ms a step:

- one rank's model (``dp`` 1, what the run prices each rank with: :func:`dynlab.engine.lockstep.rank_latency`):
  ``10 + a(b) + 0.5 x tokens(b)``;
- the worker's model (``dp`` > 1, one batch for the whole worker, split evenly over the ranks as the roofline's
  busiest-replica guess does): ``10 + a(b) / dp + 0.5 x tokens(b)``;
- the lockstep step of the ranks' batches ``b_1..b_dp``: ``10 + max_i a(b_i) + 0.5 x sum_i tokens(b_i)``.

Qwen3-30B-A3B at ``--tp 1 --ep 2 --dp-attention``: 2 ranks a worker; every overhead term off.
"""
from __future__ import annotations

import functools
import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab import hookimpl, plugins
from dynlab.cli import main
from dynlab.latency.base import LatencyModel, StepBatch
from dynlab.latency.grid import build_latency_model, hardware_for
from dynlab.latency.overheads import SERVER_TERMS_OFF

CLIENT_OFF = ["--request-overhead-ms", "0", "--detok-us-per-token", "0"]
DP = ["--model", "qwen3-30b-a3b", "--tp", "1", "--ep", "2", "--dp-attention", "--latency-model", "toy-moe"]


def _attention(b) -> float:
    return sum(b.prefill_tokens) + 2 * b.decode_requests


def _tokens(b) -> float:
    return sum(b.prefill_tokens) + b.decode_requests


class ToyMoe(LatencyModel):
    """Toy MoE step model for tests: attention per rank, experts over every rank's tokens (module docstring)."""

    name = "toy-moe"
    options = ()

    def __init__(self, hardware, options):
        super().__init__(hardware, options)
        self.dp = hardware.parallel.dp

    def step_ms(self, batch) -> float:
        return 10 + _attention(batch) / self.dp + 0.5 * _tokens(batch)

    def lockstep_step_ms(self, batches):
        if self.dp == 1:
            return None
        return 10 + max(_attention(b) for b in batches) + 0.5 * sum(_tokens(b) for b in batches)


class _Plugin:
    @hookimpl
    def dynlab_register_latency_models(self, register):
        register(ToyMoe)


@pytest.fixture(autouse=True)
def toy_model():
    pm = plugins.get_plugin_manager()
    plugin = _Plugin()
    pm.register(plugin, name="toy-moe-test")
    yield
    pm.unregister(plugin)


def _trace(tmp_path, rows) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_plan_floors_are_one_ranks(tmp_path):
    # one 100-token prompt, 2 output tokens, alone. One rank serves it alone, so its floors are the rank model's:
    #   TTFT: 10 + 100 (attention) + 0.5 x 100 (experts) = 160 ms (the worker's model said 10 + 100 / 2 + 50 = 110:
    #   half the prompt's attention, as if the other rank took the other half);
    #   TPOT: one decode at context 101: 10 + 2 + 0.5 = 12.5 ms (the worker's model: 10 + 1 + 0.5 = 11.5).
    # With targets 150 / 12 ms the request misses both alone: compute-bound, and the floors say 160 and 12.5.
    trace = _trace(tmp_path, [{"timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [1]}])
    out = CliRunner().invoke(main, ["plan", "--trace", trace, *DP, *CLIENT_OFF, "--slo-ttft-ms", "150",
                                    "--slo-tpot-ms", "12", "--modes", "rr", "--executor", "serial", "--quiet",
                                    "--format", "json"])
    assert out.exit_code == 3, out.output
    (shape,) = json.loads(out.stdout)["shapes"]
    assert shape["slo_floors"] == {"ttft": {"never_share": 1.0, "lowest_ms": 160.0, "worst_ms": 160.0},
                                   "tpot": {"never_share": 1.0, "lowest_ms": 12.5, "worst_ms": 12.5}}


def _sim(tmp_path, rows, *args) -> list:
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(main, ["sim", "--trace", _trace(tmp_path, rows), "--timing", "--quiet", *DP, *CLIENT_OFF,
                                    "--workers", "1", "--mode", "rr", *args, "--requests-out", str(out)])
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_a_lockstep_step_prices_the_experts_on_every_ranks_tokens(tmp_path):
    # rr on one worker of 2 ranks: a 40-token prompt on rank 0, a 100-token one on rank 1, both at t = 0, 2 output
    # tokens each (distinct tokens: no hit).
    # step 1 (both prefill): attention 40 on rank 0, 100 on rank 1; the experts take all 140 tokens:
    #   10 + max(40, 100) + 0.5 x 140 = 180 ms -> both first tokens at 180. (Each rank's own step is
    #   10 + 40 + 20 = 70 and 10 + 100 + 50 = 160: the slowest rank's own step, the first version, ended at 160.)
    # step 2 (both decode one token): 10 + max(2, 2) + 0.5 x 2 = 13 ms -> both finish at 193 (own steps: 12.5).
    rows = [{"tokens": list(range(40)), "output_length": 2, "timestamp": 0},
            {"tokens": list(range(1000, 1100)), "output_length": 2, "timestamp": 0}]
    recs = _sim(tmp_path, rows)
    assert [(r["dp_rank"], r["first_token_ms"], r["finish_ms"]) for r in recs] == [(0, 180.0, 193.0),
                                                                                  (1, 180.0, 193.0)]


def test_a_rank_alone_steps_as_its_own_model_says(tmp_path):
    # one 40-token prompt, 2 output tokens, on rank 0; rank 1 idle: the experts see rank 0's tokens only, so each
    # step is rank 0's own: 10 + 40 + 0.5 x 40 = 70 ms to the first token, then 10 + 2 + 0.5 = 12.5 -> 82.5
    (rec,) = _sim(tmp_path, [{"tokens": list(range(40)), "output_length": 2, "timestamp": 0}])
    assert (rec["dp_rank"], rec["first_token_ms"], rec["finish_ms"]) == (0, 70.0, 82.5)


@functools.cache
def _roofline_pair():
    """The roofline of a Qwen3-30B-A3B worker at tp 1, ep 2 with attention-DP (2 ranks), and of one of its ranks
    (the same degrees without dp_attention, as the run builds it), every server term off."""
    opts = dict(SERVER_TERMS_OFF["roofline"])
    worker = build_latency_model("roofline", hardware_for("qwen3-30b-a3b", "h100", 1, ep=2, dp_attention=True), opts)
    rank = build_latency_model("roofline", replace(worker.hardware, dp_attention=False), opts)
    return worker, rank


_batch = st.builds(lambda chunks, d, ctx: StepBatch(tuple(t for t, _ in chunks), tuple(c for _, c in chunks), d,
                                                    d * ctx),
                   st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 8192)), max_size=3),
                   st.integers(0, 64), st.integers(1, 8192)).filter(lambda b: b.prefill_tokens or b.decode_requests)


@settings(max_examples=60, deadline=None)
@given(st.lists(_batch, min_size=1, max_size=2))
def test_roofline_lockstep_lies_between_the_slowest_rank_and_one_rank_doing_all(batches):
    # the roofline's lockstep step of the ranks' batches is at least each rank's own step (its attention, and the
    # experts on at least its own tokens) and at most one rank's step of all the batches together (attention
    # summed instead of the busiest rank's; the same expert and weight terms)
    worker, rank = _roofline_pair()
    lock = worker.lockstep_step_ms(batches)
    whole = StepBatch(tuple(t for b in batches for t in b.prefill_tokens),
                      tuple(c for b in batches for c in b.prefill_context),
                      sum(b.decode_requests for b in batches), sum(b.decode_context for b in batches))
    assert max(rank.step_ms(b) for b in batches) <= lock * (1 + 1e-12)
    assert lock <= rank.step_ms(whole) * (1 + 1e-12)
    assert rank.lockstep_step_ms(batches) is None  # a rank's model (no attention-DP) composes nothing
