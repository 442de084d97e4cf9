"""What a real server's step pays beyond its GPU kernels: the server terms of the ``roofline`` and ``linear`` models.

Two terms, each a latency-model option (``--latency-opt NAME=VALUE``; 0 switches it off), on by default:

- **Step CPU time** (``cpu_step_us`` per step plus ``cpu_us_per_request`` per request in the step): the
  scheduler, input preparation, sampling and the output processor, which grow with the batch. Defaults:
  the per-step (126.02 us) and per-request (4.4168 us) constants of inference-sim (BLIS)'s trained-physics
  step time (``defaults.yaml`` -> ``trained_physics_coefficients.beta_coeffs[6]`` and ``[5]`` at commit
  f90a1e3a), fitted end to end to real vLLM servers on H100 (:mod:`dynlab_builtins.latency_blis`).
- **CUDA-graph padding** (``cuda_graph_max``): a step of at most ``cuda_graph_max`` scheduled tokens (prefill
  tokens plus decodes) runs as the captured graph of the next capture size, so its linear layers compute the
  padded rows too. The sizes are vLLM's (``vllm/config/compilation.py``, V1): 1, 2, 4, then multiples of 8
  below 256, then multiples of 16 up to ``min(2 x max_num_seqs, 512)``; the default 512 is that cap at
  vLLM's default ``max_num_seqs`` 256. A padded row is a decode of no context: it adds compute, and reads
  no KV and no state (vLLM gives it KV slot ``-1`` and a Mamba layer the null state index: ``roofline``'s
  :meth:`dynlab_builtins.latency_roofline.RooflineTerms.parts`).

Two more are the run's (request-level: they delay what the client sees, not the engine's steps), also on by
default (:class:`dynlab.engine.metrics.ServingMetrics`; 0 switches each off):

- **Front end** (``--request-overhead-ms``, :data:`FRONT_END_MS`): HTTP, validation, tokenisation and queue
  insertion before the engine sees a request, in every TTFT and E2E. Default: inference-sim (BLIS)'s
  ``alpha_coeffs[0]`` (15,563 us, "API processing overhead") at commit f90a1e3a, fitted to real vLLM on H100;
  ``dynlab calibrate`` on BLIS's real Llama-2-7B H100 runs fits 13.4 ms with the other terms on (docs/calibrate.md).
- **Detokenisation and streaming** (``--detok-us-per-token``, :data:`DETOK_US_PER_TOKEN`): per output token,
  added to each token's arrival at the client as BLIS does (``sim/simulator.go``: each ITL is the step plus
  ``alpha_coeffs[2]``), so TTFT gains one, TPOT and each ITL one, E2E one per output token. Default: BLIS's
  ``alpha_coeffs[2]``, 45.9 us.

Left out: BLIS's ``alpha_coeffs[1]`` (0.78 ms once per request after its last token), a front end slower than
the engine (the client would fall behind), and SGLang's values (no SGLang engine yet; issue 40).
"""
from __future__ import annotations

import bisect

from dynlab.latency.base import StepBatch
from dynlab.routing.strategy import StrategyOption

#: inference-sim trained-physics beta_coeffs[6] and [5] (us per step, us per request in the step), commit f90a1e3a
CPU_STEP_US = 126.024825
CPU_US_PER_REQUEST = 4.41684444
#: inference-sim alpha_coeffs[0] (us -> ms): the front end per request, commit f90a1e3a
FRONT_END_MS = 15.563199579
#: inference-sim alpha_coeffs[2]: detokenisation and streaming per output token (us), commit f90a1e3a
DETOK_US_PER_TOKEN = 45.907545
#: vLLM's largest captured size at its default max_num_seqs 256: min(2 x 256, 512)
CUDA_GRAPH_MAX = 512

#: the run's request-level terms and their defaults (SimConfig fields; shown by ``dynlab latency``)
CLIENT_TERMS = {"request_overhead_ms": FRONT_END_MS, "detok_us_per_token": DETOK_US_PER_TOKEN}

CPU_OPTIONS = (
    StrategyOption("cpu_step_us", float, CPU_STEP_US,
                   "server CPU time per step in us: scheduler, input preparation, sampling (BLIS, real H100 vLLM)",
                   minimum=0.0),
    StrategyOption("cpu_us_per_request", float, CPU_US_PER_REQUEST,
                   "server CPU time per request in the step in us: its growth with the batch (BLIS, real H100 vLLM)",
                   minimum=0.0),
)
GRAPH_OPTIONS = (
    StrategyOption("cuda_graph_max", int, CUDA_GRAPH_MAX,
                   "steps of at most this many tokens are padded to vLLM's next CUDA-graph capture size (0: off)",
                   minimum=0),
)

#: the latency-model options that are server terms (shown by ``dynlab latency`` for a model declaring them)
SERVER_TERMS = tuple(o.name for o in CPU_OPTIONS + GRAPH_OPTIONS)

#: the server terms off, per built-in latency model that declares them (``--latency-opt`` values): the GPU step
#: model alone, as compared with aiconfigurator's kernel data (benchmarks/fit_roofline.py, fidelity_latency.py)
SERVER_TERMS_OFF = {"roofline": {name: "0" for name in SERVER_TERMS},
                    "linear": {o.name: "0" for o in CPU_OPTIONS}}


def capture_sizes(largest: int) -> tuple[int, ...]:
    """vLLM's CUDA-graph capture sizes up to ``largest``: 1, 2, 4, multiples of 8 below 256, multiples of 16
    from 256 (``()`` for ``largest`` 0). ``largest`` itself is not added when it is off that ladder."""
    ladder = [1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)]
    return tuple(s for s in ladder if s <= largest)


class ServerTerms:
    """The terms above for one latency model's options (``opts``: the converted option values; a model
    that declares only :data:`CPU_OPTIONS` has no padding)."""

    def __init__(self, opts):
        self.step_ms = opts.get("cpu_step_us", 0.0) / 1000.0
        self.request_ms = opts.get("cpu_us_per_request", 0.0) / 1000.0
        self.sizes = capture_sizes(opts.get("cuda_graph_max", 0))

    def cpu_ms(self, batch: StepBatch) -> float:
        """Step CPU time (ms) of ``batch``: 0 for an empty step."""
        requests = sum(1 for t in batch.prefill_tokens if t > 0) + batch.decode_requests
        return self.step_ms + self.request_ms * requests if requests else 0.0

    def decode_cpu_ms(self, requests: int) -> float:
        """Step CPU time (ms) of a decode-only step of ``requests`` requests."""
        return self.step_ms + self.request_ms * requests if requests > 0 else 0.0

    def padded_rows(self, tokens: int) -> int:
        """Rows a step of ``tokens`` scheduled tokens adds to reach its capture size (0 above the largest)."""
        sizes = self.sizes
        if tokens <= 0 or not sizes or tokens > sizes[-1]:
            return 0
        return sizes[bisect.bisect_left(sizes, tokens)] - tokens
