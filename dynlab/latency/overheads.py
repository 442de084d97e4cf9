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

Left out: BLIS's ``alpha_coeffs[1]`` (0.78 ms once per request after its last token) and a front end slower
than the engine (the client would fall behind).

**An SGLang engine** (``--engine sglang``) takes SGLang's own server terms as its defaults
(:meth:`dynlab.engine.kinds.EngineKind.latency_defaults`, resolved in :mod:`dynlab.engine.sglang.defaults`);
a ``--latency-opt`` given still wins and 0 still switches a term off:

- step CPU time 0 (``cpu_step_us``, ``cpu_us_per_request``): SGLang's overlap scheduler (on by default in
  0.5.6 and 0.5.23; ``--disable-overlap-schedule`` turns it off) schedules batch N+1 and processes batch N's
  results on the CPU while batch N runs on the GPU, so that time is hidden under the GPU's pass (LMSYS blog,
  "SGLang v0.4: Zero-Overhead Batch Scheduler", 2024-12-04: no GPU idle time between five consecutive decode
  batches in an Nsight profile). docs/fidelity.md's InferenceMAX SGLang fit agrees: it wants no per-step time
  beyond the kernels.
- CUDA graphs (``cuda_graphs=sglang``, :data:`SGLANG`): a decode pass of at most ``cuda_graph_max`` requests runs
  the graph of the next size of :func:`sglang_decode_sizes`; a prefill (extend or mixed) pass of at most
  ``cuda_graph_prefill_max`` tokens (input ids: its chunks' tokens plus its decodes) runs the breakable prefill
  graph of the next size of :func:`sglang_prefill_sizes`, eager when that size is more than twice its tokens.
  Sources (sglang 0.5.23 from PyPI): ``arg_groups/cuda_graph_hook.py`` ``generate_decode_cuda_graph_batch_sizes``
  and ``generate_prefill_cuda_graph_batch_sizes``; ``model_executor/cuda_graph_config.py`` (the decode graph
  ``full``, the prefill graph ``breakable`` on CUDA by default: ``default_prefill_backend``);
  ``model_executor/runner/prefill_cuda_graph_runner.py`` ``can_replay_locally``
  (``_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR`` 2). sglang 0.5.6 has the same decode ladder
  (``server_args.py`` ``_generate_cuda_graph_batch_sizes``) and no prefill graph by default
  (``enable_piecewise_cuda_graph`` False): ``cuda_graph_prefill_max=0``.
- front end and detokenisation: BLIS's vLLM values, kept. No SGLang measurement of its TokenizerManager and
  DetokenizerManager was found published; dynlab's one fit on real SGLang (docs/fidelity.md, InferenceMAX's
  DeepSeek-R1 on 8 H200, 58-77 ms) is one model on one server, fitted beside ``mfu``/``mbu`` at their bounds,
  so it absorbs the step model's error, and SGLang's front end has the same parts as vLLM's (an HTTP server
  and tokenizer process, a detokenizer process streaming the text).
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
#: the CUDA-graph rules (``cuda_graphs``): vLLM's (the default) and SGLang's
VLLM, SGLANG = "vllm", "sglang"
#: sglang 0.5.23 ``prefill_cuda_graph_runner.py``: a prefill pass whose graph would be more than this many times
#: its tokens runs eagerly (``_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR``)
SGLANG_MAX_PADDING_FACTOR = 2

GRAPH_OPTIONS = (
    StrategyOption("cuda_graph_max", int, CUDA_GRAPH_MAX,
                   "steps of at most this many tokens are padded to vLLM's next CUDA-graph capture size (0: off); "
                   "with cuda_graphs=sglang, decode passes of at most this many requests to SGLang's", minimum=0),
    StrategyOption("cuda_graphs", str, VLLM,
                   "whose CUDA-graph rule pads a step: vllm, or sglang (the default of --engine sglang)"),
    StrategyOption("cuda_graph_prefill_max", int, 0,
                   "with cuda_graphs=sglang: prefill passes of at most this many tokens are padded to SGLang's "
                   "breakable prefill graph sizes (0: off, sglang 0.5.6's default)", minimum=0),
)

#: the latency-model options that are server terms (shown by ``dynlab latency`` for a model declaring them)
SERVER_TERMS = tuple(o.name for o in CPU_OPTIONS + GRAPH_OPTIONS[:1])
#: the CUDA-graph options shown only with SGLang's rule (a vLLM-rule model's output is as before them)
SGLANG_GRAPH_TERMS = ("cuda_graphs", "cuda_graph_prefill_max")

#: the server terms off, per built-in latency model that declares them (``--latency-opt`` values): the GPU step
#: model alone, as compared with aiconfigurator's kernel data (benchmarks/fit_roofline.py, fidelity_latency.py)
SERVER_TERMS_OFF = {"roofline": {name: "0" for name in SERVER_TERMS + SGLANG_GRAPH_TERMS[1:]},
                    "linear": {o.name: "0" for o in CPU_OPTIONS}}


def capture_sizes(largest: int) -> tuple[int, ...]:
    """vLLM's CUDA-graph capture sizes up to ``largest``: 1, 2, 4, multiples of 8 below 256, multiples of 16
    from 256 (``()`` for ``largest`` 0). ``largest`` itself is not added when it is off that ladder."""
    ladder = [1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)]
    return tuple(s for s in ladder if s <= largest)


def sglang_decode_sizes(largest: int) -> tuple[int, ...]:
    """SGLang's decode CUDA-graph batch sizes up to ``largest`` requests (``()`` for 0): 1, 2, 4, 8, 12, multiples
    of 8 from 16 to 256, of 16 from 272 below 512, of 32 from 512; ``largest`` itself added when off that ladder
    (sglang 0.5.23 ``arg_groups/cuda_graph_hook.py`` ``generate_decode_cuda_graph_batch_sizes``, no speculative
    decoding, padding on)."""
    if largest <= 0:
        return ()
    ladder = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, largest + 1, 32)]
    sizes = [s for s in ladder if s <= largest]
    return tuple(sizes if sizes[-1] == largest else sizes + [largest])


def sglang_prefill_sizes(largest: int) -> tuple[int, ...]:
    """SGLang's breakable prefill CUDA-graph sizes up to ``largest`` tokens (``()`` below 4): multiples of 4 up to
    32, of 16 from 48 to 256, of 32 from 288 to 512, of 64 from 576 to 1,024, of 256 from 1,280 to 4,096, of 512
    from 4,608 (sglang 0.5.23 ``arg_groups/cuda_graph_hook.py`` ``generate_prefill_cuda_graph_batch_sizes``;
    ``largest`` is not added when off that ladder)."""
    ladder = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
              *range(1280, 4097, 256), *range(4608, largest + 1, 512)]
    return tuple(s for s in ladder if s <= largest)


def _next_size(sizes: tuple, n: int) -> int:
    """The smallest of ``sizes`` (ascending) holding ``n`` (> 0) rows, 0 when none does."""
    if n <= 0 or not sizes or n > sizes[-1]:
        return 0
    return sizes[bisect.bisect_left(sizes, n)]


class ServerTerms:
    """The terms above for one latency model's options (``opts``: the converted option values; a model
    that declares only :data:`CPU_OPTIONS` has no padding). Raises ``ValueError`` for a ``cuda_graphs`` that is
    neither ``vllm`` nor ``sglang``."""

    def __init__(self, opts):
        self.step_ms = opts.get("cpu_step_us", 0.0) / 1000.0
        self.request_ms = opts.get("cpu_us_per_request", 0.0) / 1000.0
        rule = opts.get("cuda_graphs", VLLM)
        if rule not in (VLLM, SGLANG):
            raise ValueError(f"option 'cuda_graphs' takes vllm or sglang, got {rule!r}")
        self.sglang = rule == SGLANG
        largest = opts.get("cuda_graph_max", 0)
        #: the decode-only step's sizes (requests; vLLM: tokens, one per decode)
        self.sizes = sglang_decode_sizes(largest) if self.sglang else capture_sizes(largest)
        #: SGLang's prefill-pass sizes (tokens); ``()`` under vLLM's rule (its steps use :attr:`sizes`)
        self.prefill_sizes = sglang_prefill_sizes(opts.get("cuda_graph_prefill_max", 0)) if self.sglang else ()

    def cpu_ms(self, batch: StepBatch) -> float:
        """Step CPU time (ms) of ``batch``: 0 for an empty step."""
        requests = sum(1 for t in batch.prefill_tokens if t > 0) + batch.decode_requests
        return self.step_ms + self.request_ms * requests if requests else 0.0

    def decode_cpu_ms(self, requests: int) -> float:
        """Step CPU time (ms) of a decode-only step of ``requests`` requests."""
        return self.step_ms + self.request_ms * requests if requests > 0 else 0.0

    def padded_rows(self, tokens: int) -> int:
        """Rows a decode-only step of ``tokens`` decodes (vLLM's rule: a step of ``tokens`` scheduled tokens) adds
        to reach its capture size (0 above the largest)."""
        size = _next_size(self.sizes, tokens)
        return size - tokens if size else 0

    def step_pad(self, batch: StepBatch) -> int:
        """Padding rows of ``batch``: vLLM's rule pads its scheduled tokens (prefill tokens plus decodes) on
        :attr:`sizes`; SGLang's pads a decode-only pass on :attr:`sizes` and a pass with prefill tokens (its input
        ids: prefill tokens plus any mixed-in decodes) on :attr:`prefill_sizes`, none when that size is more than
        :data:`SGLANG_MAX_PADDING_FACTOR` times its tokens (it runs eagerly)."""
        tokens = int(sum(batch.prefill_tokens))
        if not self.sglang or tokens <= 0:
            return self.padded_rows(tokens + batch.decode_requests)
        n = tokens + batch.decode_requests
        size = _next_size(self.prefill_sizes, n)
        return size - n if size and size <= SGLANG_MAX_PADDING_FACTOR * n else 0
