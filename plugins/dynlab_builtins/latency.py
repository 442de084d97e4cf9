"""Built-in step-latency models, registered through the ``dynlab`` entry-point group.

``roofline`` (the default), ``linear`` and ``blis`` (:mod:`dynlab_builtins.latency_blis`) are closed
forms over the hardware catalogue;
``aiconfigurator`` wraps NVIDIA's estimator when the ``dynlab[aiconfigurator]`` extra is installed
(:mod:`dynlab_builtins.latency_aic`). The interface is :class:`dynlab.latency.base.LatencyModel`.
"""
from __future__ import annotations

import math

from dynlab import hookimpl
from dynlab.latency.base import LatencyModel, StepBatch
from dynlab.latency.overheads import CPU_OPTIONS, GRAPH_OPTIONS, ServerTerms
from dynlab.routing.strategy import StrategyOption
from dynlab_builtins.latency_roofline import (DEFAULT_COMM_LATENCY_US, FP8_GEMM_US, LAYER_US, LINK_UTIL, MLA_LAYER_US,
                                                MOE_MFU, RooflineTerms, roofline_domain)


def _dense_on_one_gpu(hardware) -> bool:
    """A dense model whose every layer keeps every token, on one GPU: the roofline's fitted closed form."""
    m = hardware.model
    return (not getattr(m, "experts", 0) and m.attention != "mla" and getattr(m, "uniform_kv", True)
            and hardware.parallel.gpus == 1 and hardware.tp == 1)


def _arith(a: float, b: float, lo: int, hi: int) -> float:
    """``sum(a + b*k for k in range(lo, hi))`` in closed form (0 when ``hi <= lo``)."""
    n = hi - lo
    if n <= 0:
        return 0.0
    return n * a + b * n * (lo + hi - 1) / 2.0


class Roofline(LatencyModel):
    """Roofline: max(compute, memory) per step at fitted MFU/MBU, plus a fixed overhead (default).

    One step is one forward pass over the whole batch (prefill chunks and decodes together), so a
    mixed step costs ``max(total compute time, total memory time) + overhead_ms``, per GPU:

    - compute FLOPs: ``2 * N * T + attn * T * (ctx + T/2)`` for each prefill chunk of ``T`` tokens
      after ``ctx`` cached tokens, plus ``2 * N * B + attn * C`` for ``B`` decodes of summed context
      ``C``; ``N`` = active parameters (all for dense models), ``attn`` =
      ``2 * L * n_q * (d_qk + d_v)`` FLOPs per (query, key) pair (``4 * L * n_q * d`` for GQA);
      time = FLOPs / (dense bf16 peak x ``mfu``);
    - memory bytes: the weights once (``params x bytes per param``, every expert of an MoE) plus
      the KV read and written: ``kv_bytes_per_token x (C + sum(ctx) + sum(T))``; time = bytes /
      (HBM bandwidth x ``mbu``);
    - tensor parallelism divides FLOPs and weights by ``tp`` and KV by ``min(tp, kv_heads)`` (an MLA
      latent is replicated). Every other hardware (``tp > 1``, experts, MLA, window or state layers,
      ``ep``/``pp``/``dp_attention``) is priced by :class:`dynlab_builtins.latency_roofline.RooflineTerms`:
      active experts and the distinct experts a step touches, MLA's absorbed decode, windows, state,
      the all-reduce / all-to-all / stage sends over the datasheet link, a fixed time per MoE layer, and
      the kernel floors of MLA layers and block-fp8 GEMMs (``mla_layer_us``, ``fp8_gemm_us``: measured
      module and kernel times, not fitted; :func:`dynlab_builtins.latency_roofline.kernel_floors`).

    Defaults fitted on 2026-11-30 by ``benchmarks/fit_roofline.py`` (a coarse-to-fine grid search
    minimising prefill MAPE + decode MAPE) to aiconfigurator-core 0.12.0's vLLM step times
    (``RustForwardPassPerfModel.from_native``, vLLM 0.24.0 data) for qwen3-0.6b, llama-3.1-8b,
    qwen3-8b, qwen3-32b (tp 1 and 2) on h100 and h200, 3 prefill sizes (512/2,048/8,192 tokens, no
    cached context) and 8 decode batches (1/16/64/256 at context 2,048 and 16,384), 110 steps:
    ``mfu=0.758``, ``mbu=0.878``, ``overhead_ms=1.30``; MAPE prefill 9.9% (worst 35%: qwen3-0.6b at
    512 tokens, -35%), decode 6.5% (worst 25%: qwen3-32b at tp 2, 256 decodes at 16,384, -25%).
    ``moe_mfu``, ``link_util``, ``comm_latency_us`` and ``layer_us`` were fitted on 2026-12-01 to
    aiconfigurator on ``benchmarks/fidelity_latency.py``'s grid (MoE models, dense at tp > 1). On that
    grid (docs/latency.md): dense models 12.3% prefill and 9.3% decode MAPE; MoE models 20.2% and
    13.6% before the kernel floors (2026-12-07), 19.8% and 13.1% after them; DeepSeek-V3 36.4% and
    28.9% before, 23.3% and 13.8% after. Outside the dense fit every run says so (:meth:`domain`). The
    GPU figures are datasheet numbers (:mod:`dynlab.models.gpus`).
    """

    name = "roofline"
    options = (
        StrategyOption("mfu", float, 0.758, "share of the dense bf16 peak reached (fitted to aiconfigurator, vLLM)",
                       minimum=0.01, maximum=1.0),
        StrategyOption("mbu", float, 0.878, "share of the HBM bandwidth reached (fitted to aiconfigurator, vLLM)",
                       minimum=0.01, maximum=1.0),
        StrategyOption("overhead_ms", float, 1.30, "fixed time per step in ms (fitted to aiconfigurator, vLLM)",
                       minimum=0.0),
        StrategyOption("moe_mfu", float, MOE_MFU,
                       "share of the dense bf16 peak the routed experts' grouped GEMMs reach (fitted to aiconfigurator)",
                       minimum=0.01, maximum=1.0),
        StrategyOption("link_util", float, LINK_UTIL,
                       "share of one direction of the GPU link a collective reaches (fitted to aiconfigurator)",
                       minimum=0.01, maximum=1.0),
        StrategyOption("layer_us", float, LAYER_US,
                       "fixed time per MoE layer and step in us: routing and dispatch (fitted to aiconfigurator)",
                       minimum=0.0),
        StrategyOption("mla_layer_us", float, MLA_LAYER_US,
                       "fixed time per MLA attention layer and step in us: its kernel chain (aiconfigurator's "
                       "measured vLLM MLA module at one token)", minimum=0.0),
        StrategyOption("fp8_gemm_us", float, FP8_GEMM_US,
                       "fixed time per block-fp8 GEMM outside MLA and the routed experts in us (aiconfigurator's "
                       "measured vLLM fp8_block GEMM at 1-16 rows)", minimum=0.0),
        StrategyOption("comm_latency_us", float, DEFAULT_COMM_LATENCY_US,
                       "latency of one all-reduce, all-to-all or stage send in us (fitted to aiconfigurator)",
                       minimum=0.0),
        *CPU_OPTIONS,
        *GRAPH_OPTIONS,
    )

    def __init__(self, hardware, options):
        super().__init__(hardware, options)
        self._server = ServerTerms(self.opts)
        m, g, tp = hardware.model, hardware.gpu, hardware.tp
        flops_per_ms = g.bf16_tflops * 1e12 * self.opts["mfu"] / 1e3
        bytes_per_ms = g.hbm_gbps * 1e9 * self.opts["mbu"] / 1e3
        # every model but a dense full-attention one on one GPU: experts, MLA, windows, state, communication
        self._terms = None
        if not _dense_on_one_gpu(hardware):
            expert_flops_per_ms = g.bf16_tflops * 1e12 * self.opts["moe_mfu"] / 1e3
            self._terms = RooflineTerms(hardware, flops_per_ms, bytes_per_ms, self.opts["comm_latency_us"],
                                        expert_flops_per_ms, self.opts["link_util"], self.opts["layer_us"],
                                        self.opts["mla_layer_us"], self.opts["fp8_gemm_us"])
        # per GPU, in ms: cost of one linear token, one (query, key) pair, the weights, one KV token
        self._token_ms = 2.0 * m.active_params / tp / flops_per_ms
        self._pair_ms = m.attention_flops_per_pair / tp / flops_per_ms
        self._weights_ms = m.weight_bytes / tp / bytes_per_ms
        self._kv_ms = m.kv_bytes_per_token_per_gpu(tp) / bytes_per_ms
        self._overhead = self.opts["overhead_ms"]

    def domain(self) -> str | None:
        """Outside the fit: MoE, MLA, window/state layers, quantised weights or KV, another GPU, tp > 2,
        ep/pp (:func:`dynlab_builtins.latency_roofline.roofline_domain`)."""
        return roofline_domain(self.hardware)

    def parts_ms(self, batch: StepBatch) -> tuple[float, float]:
        """``(compute ms, memory ms)`` of one step, before the max, the communication and the overhead."""
        if self._terms is not None:
            return self._terms.parts(batch)[:2]
        return self._parts(batch, sum(batch.prefill_tokens), 0)

    def _parts(self, batch: StepBatch, tokens: int, pad: int) -> tuple[float, float]:
        """:meth:`parts_ms` of the plain roofline, given ``tokens`` (the batch's prefill tokens) and ``pad``
        CUDA-graph padding rows (linear compute only: a padded row holds no KV)."""
        pairs = sum(t * (c + t / 2.0) for t, c in zip(batch.prefill_tokens, batch.prefill_context))
        compute = (self._token_ms * (tokens + batch.decode_requests + pad)
                   + self._pair_ms * (pairs + batch.decode_context))
        kv = batch.decode_context + sum(batch.prefill_context) + tokens
        memory = self._weights_ms + self._kv_ms * kv
        return compute, memory

    def step_ms(self, batch: StepBatch) -> float:
        """The GPU step of ``batch`` padded to its CUDA-graph size, plus the fixed overhead and the server's
        step CPU time (:mod:`dynlab.latency.overheads`)."""
        server = self._server
        tokens = sum(batch.prefill_tokens)
        pad = server.step_pad(batch)
        cpu = server.cpu_ms(batch)
        if self._terms is not None:
            compute, memory, comm = self._terms.parts(batch, pad=pad)
            return max(compute, memory) + comm + self._overhead + cpu
        compute, memory = self._parts(batch, tokens, pad)
        return max(compute, memory) + self._overhead + cpu

    def lockstep_step_ms(self, batches) -> float | None:
        """The lockstep step of attention-DP ranks' ``batches`` (:meth:`LatencyModel.lockstep_step_ms`) on the
        worker's terms: :meth:`RooflineTerms.parts` with the ranks' own batches (each padded to its own CUDA-graph
        size) as the replicas, so compute is the busiest rank's attention and dense layers plus the routed experts
        on every rank's tokens, memory the busiest rank's KV plus the weights and the experts those tokens
        touch, the collectives over every token; plus the overhead and the busiest rank's step CPU time (each
        rank its own scheduler). ``None`` without attention-DP ranks."""
        terms, server = self._terms, self._server
        if terms is None or terms.dp == 1:
            return None
        pads = [server.step_pad(b) for b in batches]
        whole = StepBatch(tuple(t for b in batches for t in b.prefill_tokens),
                          tuple(c for b in batches for c in b.prefill_context),
                          sum(b.decode_requests for b in batches), sum(b.decode_context for b in batches))
        compute, memory, comm = terms.parts(whole, list(zip(batches, pads)), sum(pads))
        return max(compute, memory) + comm + self._overhead + max(server.cpu_ms(b) for b in batches)

    def decode_ms(self, requests: int, context: int, steps: int) -> float:
        """Closed form (:meth:`decode_ms_at`)."""
        return self.decode_ms_at(requests, context, (steps,))[0]

    def _summed_decode_ms_at(self, requests: int, context: int, steps) -> list[float]:
        """:meth:`decode_ms_at` step by step (one pass up to the largest ``j``), for window layers."""
        wanted, out, total = sorted(set(j for j in steps if j > 0)), {}, 0.0
        i = 0
        for j in wanted:
            while i < j:
                total += self.step_ms(StepBatch((), (), requests, context + i * requests))
                i += 1
            out[j] = total
        return [out.get(j, 0.0) for j in steps]

    def _decode_lines(self, requests: int, context: int) -> tuple[float, float, float, float, float]:
        """``(c0, c1, m0, m1, per-step extra)``: step ``i`` of a decode run costs ``max(c0 + c1*i, m0 + m1*i)
        + extra + overhead``."""
        pad = self._server.padded_rows(requests)  # the CUDA graph's padding rows
        cpu = self._server.decode_cpu_ms(requests)
        if self._terms is None:
            c0 = self._token_ms * (requests + pad) + self._pair_ms * context
            m0 = self._weights_ms + self._kv_ms * context
            return c0, self._pair_ms * requests, m0, self._kv_ms * requests, cpu
        first = self._terms.parts(StepBatch((), (), requests, context), pad=pad)
        second = self._terms.parts(StepBatch((), (), requests, context + requests), pad=pad)
        return first[0], second[0] - first[0], first[1], second[1] - first[1], first[2] + cpu

    def decode_ms_at(self, requests: int, context: int, steps) -> list[float]:
        """Closed form: compute and memory are both linear in the step index, so their max crosses once.

        Step ``i`` (from 0) costs ``max(c0 + c1*i, m0 + m1*i) + overhead``: the line that wins before
        ``split`` (the first integer ``i`` at which the other one is >= it, clamped to ``[0, j]``), then
        the other; each part is an arithmetic series (:func:`_arith`). The lines and the split do not
        depend on ``j``, so they are computed once for all ``steps``.
        """
        terms = self._terms
        if terms is None:  # the plain roofline: _decode_lines' lines, inline (one call fewer per decode run)
            server = self._server
            c0 = self._token_ms * (requests + server.padded_rows(requests)) + self._pair_ms * context
            c1, m1, extra = self._pair_ms * requests, self._kv_ms * requests, server.decode_cpu_ms(requests)
            m0 = self._weights_ms + self._kv_ms * context
        elif terms.windowed:  # min(context, window) is not linear in i
            return self._summed_decode_ms_at(requests, context, steps)
        else:
            c0, c1, m0, m1, extra = self._decode_lines(requests, context)
        if c1 > m1:  # compute >= memory from i = (m0 - c0) / (c1 - m1) on
            (a0, a1), (b0, b1), split = (m0, m1), (c0, c1), max(math.ceil((m0 - c0) / (c1 - m1)), 0)
        elif c1 < m1:  # memory >= compute from i = (c0 - m0) / (m1 - c1) on
            (a0, a1), (b0, b1), split = (c0, c1), (m0, m1), max(math.ceil((c0 - m0) / (m1 - c1)), 0)
        else:  # parallel: the same one wins every step
            (a0, a1), (b0, b1), split = (c0, c1), (c0, c1) if c0 >= m0 else (m0, m1), 0
        head, overhead, out = _arith(a0, a1, 0, split), self._overhead + extra, []
        for j in steps:
            if j <= 0:
                out.append(0.0)
            elif j > split:  # _arith(a0, a1, 0, split) + _arith(b0, b1, split, j), the latter inlined
                n = j - split
                out.append(head + (n * b0 + b1 * n * (split + j - 1) / 2.0) + overhead * j)
            else:  # the first line wins every step up to j (the second part is empty)
                out.append(_arith(a0, a1, 0, j) + overhead * j)
        return out


class Linear(LatencyModel):
    """Linear (BLIS first-order): beta0 + beta1 x prefill tokens + beta2 x decode requests, in ms.

    inference-sim (BLIS)'s first-order step-time form, ignoring context length. The defaults are
    NOT BLIS's published coefficients: they are a least-squares fit (``benchmarks/fit_roofline.py``,
    2026-11-30) to this package's ``roofline`` model for llama-3.1-8b on h100 over prefill chunks of
    256-8,192 tokens and decode batches of 1-256 at context 2,048; set them with ``--latency-opt``
    for another model or GPU.

    BLIS published no global coefficients for this form, only per (model, GPU, tp, vLLM image)
    ones, and an option has one default whatever the hardware, so they are not the defaults. To
    use them, convert from microseconds: inference-sim's ``defaults.yaml`` at ``e7b124c9^`` (the
    last commit with the blackbox model, removed in ``90522ded``) gives, as ``beta0,beta1,beta2`` in
    us, meta-llama/llama-3.1-8b-instruct on H100 tp 1 (vLLM 0.11.0) ``6472.0076, 19.7972,
    304.4021`` (``--latency-opt beta0=6.472 --latency-opt beta1=0.0197972 --latency-opt
    beta2=0.3044021``), on H100 tp 2 (vLLM 0.8.4) ``6910.4205, 17.6706, 2.8377`` and on A100-80 tp 1
    (vLLM 0.8.4) ``16441.5315, 47.8374, 18.2056``. BLIS's ``beta1`` counts prefill tokens not
    served from the prefix cache, as this model's prefill tokens do.
    """

    name = "linear"
    options = (
        StrategyOption("beta0", float, 3.991, "ms per step (fit to roofline, llama-3.1-8b on h100)", minimum=0.0),
        StrategyOption("beta1", float, 0.02339, "ms per prefill token (fit to roofline, llama-3.1-8b on h100)",
                       minimum=0.0),
        StrategyOption("beta2", float, 0.10746, "ms per decode request (fit to roofline, llama-3.1-8b on h100)",
                       minimum=0.0),
        StrategyOption("spec_gamma", float, None, "ms per draft token per decoding request, the drafter's term "
                       "with --spec-method eagle|eagle3|mtp|draft (default: dynlab's rule, docs/latency.md)",
                       minimum=0.0),
        *CPU_OPTIONS,
    )

    def __init__(self, hardware, options):
        super().__init__(hardware, options)
        self._b0, self._b1, self._b2 = self.opts["beta0"], self.opts["beta1"], self.opts["beta2"]
        if self._b0 <= 0:
            raise ValueError("linear: beta0 must be positive (a step always takes some time)")
        self._server = ServerTerms(self.opts)

    def step_ms(self, batch: StepBatch) -> float:
        """``beta0 + beta1 x prefill tokens + beta2 x decodes`` plus the server's step CPU time
        (:mod:`dynlab.latency.overheads`; the betas stand for the GPU step, fitted to the roofline's)."""
        return (self._b0 + self._b1 * sum(batch.prefill_tokens) + self._b2 * batch.decode_requests
                + self._server.cpu_ms(batch))

    def drafter_ms(self, method: str, k: int, decodes: int, context: int):
        """``spec_gamma x k x decodes`` ms (0 for ``ngram``), or ``None`` without ``spec_gamma``: the
        drafter's first-order term, one more coefficient of the same form (project choice; fit it as the
        step-time difference between ``K`` and ``0`` at a fixed batch, docs/latency.md)."""
        gamma = self.opts.get("spec_gamma")
        if gamma is None:
            return None
        return 0.0 if method == "ngram" else gamma * k * decodes

    def decode_ms(self, requests: int, context: int, steps: int) -> float:
        """Closed form: every decode-only step of ``requests`` requests costs the same."""
        return max(steps, 0) * (self._b0 + self._b2 * requests + self._server.decode_cpu_ms(requests))


@hookimpl
def dynlab_register_latency_models(register):
    from dynlab_builtins.latency_aic import AIConfigurator
    from dynlab_builtins.latency_blis import Blis

    for cls in (Roofline, Linear, Blis, AIConfigurator):
        register(cls)
