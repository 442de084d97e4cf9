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

import json

import pytest
from click.testing import CliRunner

from dynlab import hookimpl, plugins
from dynlab.cli import main
from dynlab.latency.base import LatencyModel

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
