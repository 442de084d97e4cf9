"""The roofline's terms beyond a dense model on one GPU: experts, MLA, windows and state, communication.

:class:`RooflineTerms` prices one step per GPU (ms) for any model of the catalogue and any
parallelism (:mod:`dynlab.models.parallel`); the ``roofline`` model (:mod:`dynlab_builtins.latency`)
uses it for every hardware but a dense full-attention model at ``tp 1`` (its fitted closed form).

- **Compute** (at the dense bf16 peak x ``mfu``, the routed experts' at x ``moe_mfu``: grouped GEMMs of
  a few tokens per expert run far below peak): ``2 x`` the active parameters per token, the
  non-expert ones split over ``tp x dp`` GPUs (``dp`` attention replicas each take their share of the
  tokens), the ``k`` routed experts' over the expert GPUs (``ep``, or ``tp`` when experts are split
  tensor-parallel); attention pairs as the dense roofline, a window layer's queries seeing at most
  ``window`` keys; an MLA decode attends in the latent (weights absorbed, vLLM's MLA decode path):
  ``2 x heads x (2 x kv_lora_rank + qk_rope_head_dim)`` FLOPs per pair and layer instead of
  ``2 x heads x (qk_head_dim + v_head_dim)``.
- **Memory** (at HBM x ``mbu``): the non-expert weights once, and of the experts only those the step's
  ``B`` tokens touch: ``E x (1 - (1 - k/E)^B)`` of ``E`` experts per MoE layer in expectation, for
  tokens routed independently and uniformly to ``k`` of ``E`` (linearity of expectation: an expert is
  missed by one token with probability ``1 - k/E``); the KV read and written (a window layer's at
  most ``window`` tokens per request); a state layer's state read and written once per request.
- **Communication** (added to the max, not overlapped): a ring all-reduce of the step's activations
  (``hidden x dtype`` bytes per token) after each attention and MLP block when ``tp > 1``,
  ``2 (tp - 1) / tp x bytes``; an expert-parallel dispatch and combine per MoE layer, the
  ``(ep - 1) / ep`` share of each GPU's ``tokens / ep x k`` activations leaving it; ``pp - 1``
  stage-to-stage sends of the activations. Each over the GPU's link, one direction (half the
  datasheet's bidirectional NVLink/PCIe figure, :attr:`dynlab.models.gpus.GpuSpec.link_gbps_each_way`)
  at ``link_util`` of it, plus ``comm_latency_us`` per collective (no datasheet gives a latency; both
  fitted, with ``moe_mfu``, to aiconfigurator: :data:`MOE_MFU`).
- **Fixed**: ``layer_us`` per MoE layer and step (routing, token permutation, grouped-GEMM launches:
  what makes a one-token MoE decode far slower than its bytes), added with the communication.
- **Kernel floors** (:func:`kernel_floors`, added with the communication): ``mla_layer_us`` per MLA layer
  and step, the time of vLLM's MLA attention at one token, its chain of small kernels (:data:`MLA_LAYER_US`);
  and, for block-quantised fp8 weights (a ``weight_block_size`` in ``quantization_config``, as DeepSeek-V3
  and Kimi-K2 ship), ``fp8_gemm_us`` per block-fp8 GEMM priced above only by its bytes and FLOPs: each
  dense MLP's two (gate-up, down), each non-MLA attention layer's two (QKV, output) and each MoE layer's
  shared experts' two (:data:`FP8_GEMM_US`). In a step of at most :data:`SHARED_EXPERTS_STREAM_TOKENS`
  tokens vLLM runs the shared experts on a second CUDA stream beside the routed ones, so there they add
  only what exceeds ``layer_us``; above it, all of their time.
- **Pipeline**: one batch in flight, so a step is the sum of its ``pp`` stages (the same compute and
  memory time as ``tp`` alone, plus the sends); the bubble, ``(pp - 1) / pp`` of each GPU's time idle,
  is not hidden (vLLM overlaps ``pp`` batches, this engine runs one).
"""
from __future__ import annotations

from dynlab.models.config import text_config_of
from dynlab.models.quant import quantization_of

# Fitted on 2026-12-01 by grid searches (moe_mfu 0.2-0.758, comm_latency_us 3-30, link_util 0.25-1, layer_us 0-160)
# minimising the sum of the prefill and decode MAPEs of the MoE models and of the dense models at tp > 1
# against aiconfigurator-core 0.12.0 (vLLM 0.24.0 data) on benchmarks/fidelity_latency.py's grid: the
# same grid as the fidelity table, so that table is in-sample for these four (docs/latency.md).
MOE_MFU = 0.3
"""Share of the bf16 peak the routed experts' grouped GEMMs reach (the ``moe_mfu`` option)."""
LINK_UTIL = 0.4
"""Share of one direction of the link a collective reaches (the ``link_util`` option)."""
LAYER_US = 40.0
"""Fixed time per MoE layer and step in us (the ``layer_us`` option): routing, token permutation, launches."""
DEFAULT_COMM_LATENCY_US = 10.0
"""Latency of one collective or send in us (the ``comm_latency_us`` option)."""
MLA_LAYER_US = 90.0
"""Fixed time of one MLA attention layer per step in us (the ``mla_layer_us`` option): vLLM's MLA module at
one token, a chain of small kernels (fused q_a/kv_a projection, two RMSNorms, q_b projection, rotary, the
latent cache write, the attention kernel, the absorbed up-projections, the output projection) whose weights
alone take ~9 us to read on an H200. Source: aiconfigurator-core 0.12.0's measured vLLM 0.24.0 MLA module
table (h200_sxm, DeepSeek-V3's 16 heads per GPU at tp 8, one token): 88.7 us prefill, 93.7 us decode with
block-fp8 projections, 90.5 and 92.6 us with bf16 ones (``benchmarks/aic_breakdown.py --kernels``);
rounded to 90. Not fitted to step times."""
FP8_GEMM_US = 59.0
"""Fixed time of one block-quantised fp8 GEMM in us (the ``fp8_gemm_us`` option): the per-token-group
activation quantisation and the block-scaled GEMM of vLLM's fp8 linear layer (128 x 128 weight blocks).
Source: aiconfigurator-core 0.12.0's measured vLLM 0.24.0 GEMM table (h200_sxm, ``fp8_block``) at 1 and
16 rows for DeepSeek-V3's five GEMM shapes (N x K = 512 x 7,168, 7,168 x 256, 2,112 x 7,168,
3,072 x 1,536, 7,168 x 2,048) and 4,096 x 4,096 (``benchmarks/aic_breakdown.py --kernels``):
57.0-61.1 us, median 59.5, against 3.2-12.8 us for bf16 GEMMs of the same shapes; the same table gives
80-92 us at 128-2,048 rows, so the floor is a lower bound. Not fitted."""
SHARED_EXPERTS_STREAM_TOKENS = 256
"""vLLM 0.33.0 runs the shared experts on a second CUDA stream, beside the router and routed experts, in a
step of at most this many tokens (``VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD`` in ``vllm/envs.py``, read by
``SharedExperts._determine_shared_experts_order`` in ``vllm/model_executor/layers/fused_moe/runner/shared_experts.py``)."""

FIT_GPUS = ("h100", "h200")
FIT_TP = (1, 2)


def block_fp8(model) -> bool:
    """Whether ``model`` (a :class:`dynlab.models.spec.ModelSpec`) has block-quantised fp8 weights: an fp8
    ``quantization_config`` with a ``weight_block_size`` (DeepSeek-V3's and Kimi-K2's ``[128, 128]``)."""
    quant = quantization_of(model.config, text_config_of(model.config))
    return model.quantization == "fp8" and bool(quant.get("weight_block_size"))


def _shared_experts(model) -> bool:
    """Whether the MoE layers of ``model`` have shared experts (DeepSeek's ``n_shared_experts``, Qwen2-MoE's
    ``shared_expert_intermediate_size``, Llama 4's one), as :func:`dynlab.models.params.param_parts` counts them."""
    c = text_config_of(model.config)
    return bool(c.get("n_shared_experts") or c.get("shared_expert_intermediate_size")
                or str(c.get("model_type", "")).startswith("llama4"))


def kernel_floors(model, layer_us: float, mla_layer_us: float, fp8_gemm_us: float) -> tuple[float, float] | None:
    """``(ms, ms)``: the fixed kernel time of one step (module docstring, **Kernel floors**) in a step of at
    most :data:`SHARED_EXPERTS_STREAM_TOKENS` tokens and in a larger one; ``None`` when it is 0 (neither MLA
    nor block-fp8 weights). ``model``: a :class:`dynlab.models.spec.ModelSpec`; the times in us.

    Per step: ``layers x mla_layer_us`` for MLA; with block-fp8 weights ``fp8_gemm_us x`` (2 per dense MLP
    layer + 2 per attention layer that is not MLA), and the shared experts' ``2 x fp8_gemm_us`` per MoE
    layer, of which a small step adds only ``max(0, 2 x fp8_gemm_us - layer_us)`` (they overlap the router
    and routed experts on their own stream).
    """
    mla = model.layers * mla_layer_us if model.attention == "mla" else 0.0
    gemms = shared = 0.0
    if block_fp8(model):
        gemms = 2 * ((model.num_layers or model.layers) - model.moe_layers) * fp8_gemm_us
        if model.attention != "mla":
            gemms += 2 * model.layers * fp8_gemm_us
        if model.experts and _shared_experts(model):
            shared = 2 * fp8_gemm_us
    if not (mla or gemms or shared):
        return None
    small = mla + gemms + model.moe_layers * max(0.0, shared - layer_us)
    return small / 1e3, (mla + gemms + model.moe_layers * shared) / 1e3


def _window_pairs(tokens: int, context: int, window: int) -> float:
    """``sum(min(context + j, window) for j in 1..tokens)``: (query, key) pairs of a window layer for a
    chunk of ``tokens`` queries after ``context`` cached tokens."""
    full = max(0, min(tokens, window - context))  # queries that still see every earlier token
    seen = full * context + full * (full + 1) / 2.0
    return seen + (tokens - full) * window


class RooflineTerms:
    """One step's ``(compute ms, memory ms, communication ms)`` per GPU (module docstring).

    ``hardware``: :class:`dynlab.latency.base.Hardware`; ``flops_per_ms`` / ``bytes_per_ms``: the
    reachable peak and bandwidth of one GPU; ``comm_latency_us``: per collective; ``layer_us``,
    ``mla_layer_us``, ``fp8_gemm_us``: the fixed times (us) of :data:`LAYER_US`, :data:`MLA_LAYER_US` and
    :data:`FP8_GEMM_US` (0: none).
    """

    def __init__(self, hardware, flops_per_ms: float, bytes_per_ms: float, comm_latency_us: float,
                 expert_flops_per_ms: float | None = None, link_util: float = 1.0, layer_us: float = 0.0,
                 mla_layer_us: float = 0.0, fp8_gemm_us: float = 0.0):
        m, g, par = hardware.model, hardware.gpu, hardware.parallel
        tp, dp = par.tp, par.dp
        self.dp = dp
        self.windowed = any(grp.kind == "sliding_window" for grp in m.kv_groups)
        share, expert_share = tp, (par.ep if par.ep > 1 else tp)
        active_experts = m.moe_layers * m.experts_per_tok * m.expert_params
        expert_flops_per_ms = expert_flops_per_ms or flops_per_ms
        self._token = 2.0 * (m.active_params - active_experts) / share / flops_per_ms  # per replica token
        self._expert_token = 2.0 * active_experts / expert_share / expert_flops_per_ms  # per step token
        per_layer_pair = m.attention_flops_per_pair / max(m.layers, 1) / share / flops_per_ms
        self._groups = []  # (layers' pair ms, window or 0, KV ms per token)
        for grp in m.kv_groups or ():
            if grp.kind in ("mamba", "linear_attention"):
                continue
            kv = grp.bytes_per_token / (1 if m.attention == "mla" else min(tp, m.kv_heads)) / bytes_per_ms
            self._groups.append((per_layer_pair * grp.layers, grp.window if grp.kind == "sliding_window" else 0, kv))
        if not self._groups:  # a ModelSpec without groups: every layer full
            self._groups.append((per_layer_pair * m.layers, 0, m.kv_bytes_per_token_per_gpu(tp) / bytes_per_ms))
        self._mla_decode_pair = 0.0
        if m.attention == "mla":
            c = m.config.get("text_config", m.config) if "num_hidden_layers" not in m.config else m.config
            rank, rope = c["kv_lora_rank"], c["qk_rope_head_dim"]
            self._mla_decode_pair = 2.0 * m.layers * m.heads * (2 * rank + rope) / share / flops_per_ms
        self._state = 2.0 * sum(grp.state_bytes for grp in m.kv_groups if grp.state_bytes) / tp / bytes_per_ms
        self._dense_weights = (m.weight_bytes - m.expert_weight_bytes) / tp / bytes_per_ms
        self._expert_weights = m.expert_weight_bytes / expert_share / bytes_per_ms
        self._miss = 1.0 - m.experts_per_tok / m.experts if m.experts else 0.0
        self._comm = self._comm_terms(m, g, par, comm_latency_us, link_util)
        self._layers_ms = m.moe_layers * layer_us / 1e3  # per step: routing, permutation, grouped-GEMM launches
        self._floors = kernel_floors(m, layer_us, mla_layer_us, fp8_gemm_us)  # MLA, block-fp8 GEMMs; or None

    @staticmethod
    def _comm_terms(m, g, par, latency_us, link_util) -> tuple[float, float]:
        """``(ms per step token, ms per step)`` of the step's collectives and sends."""
        link_per_ms = g.link_gbps_each_way * 1e9 / 1e3 * link_util
        act = m.hidden_size * m.dtype_bytes  # bytes per token
        lat = latency_us / 1e3
        per_token = fixed = 0.0
        layers = m.num_layers or m.layers
        hybrid = "hybrid_override_pattern" in m.config
        if par.tp > 1:
            reduces = (layers if hybrid else 2 * layers) - (m.moe_layers if par.ep > 1 else 0)
            per_token += reduces * 2.0 * (par.tp - 1) / par.tp * act / par.dp / link_per_ms
            fixed += reduces * lat
        if par.ep > 1:
            per_token += m.moe_layers * 2.0 * m.experts_per_tok * act / par.ep * (par.ep - 1) / par.ep / link_per_ms
            fixed += m.moe_layers * 2 * lat
        if par.pp > 1:
            per_token += (par.pp - 1) * act / link_per_ms
            fixed += (par.pp - 1) * lat
        return per_token, fixed

    def _attention(self, prefill_tokens, prefill_context, decode_requests: int, decode_context: int):
        """``(pair ms, KV ms)`` of the step's attention over every KV group."""
        pair_ms = kv_ms = 0.0
        for layer_pair, window, kv in self._groups:
            if window:
                pairs = sum(_window_pairs(t, c, window) for t, c in zip(prefill_tokens, prefill_context))
                seen = min(decode_context, decode_requests * window)
                kept = sum(min(c, window) for c in prefill_context) + sum(prefill_tokens)
            else:
                pairs = sum(t * (c + t / 2.0) for t, c in zip(prefill_tokens, prefill_context))
                seen = decode_context
                kept = sum(prefill_context) + sum(prefill_tokens)
            decode_pair = self._mla_decode_pair or layer_pair  # an MLA model has one group
            pair_ms += layer_pair * pairs + decode_pair * seen
            kv_ms += kv * (seen + kept)
        return pair_ms, kv_ms

    def _replicas(self, batch, pad: int = 0):
        """Candidates for the busiest attention replica's share of ``batch`` and its ``pad`` CUDA-graph padding
        rows, as ``(share, rows)``: ``rows`` the share's token rows, padding included. ``batch`` itself when ``dp``
        is 1; else the largest prefill chunk alone (a chunk stays on one replica) and an even ``1/dp`` share of
        every chunk, each with ``1/dp`` of the decodes and of the padding. Each is non-decreasing in every batch
        field, so the step (priced at the costlier) is too."""
        if self.dp == 1:
            return ((batch, sum(batch.prefill_tokens) + batch.decode_requests + pad),)
        decodes, context = batch.decode_requests / self.dp, batch.decode_context / self.dp
        rows = (batch.decode_requests + pad) / self.dp  # decode and padding rows
        chunks = [(t, c) for t, c in zip(batch.prefill_tokens, batch.prefill_context) if t > 0]
        even = type(batch)(tuple(t / self.dp for t, _ in chunks), tuple(c / self.dp for _, c in chunks),
                           decodes, context)
        if not chunks:
            return ((even, rows),)
        t, c = max(chunks, key=lambda tc: tc[0] * (tc[1] + tc[0] / 2.0))
        return (even, sum(even.prefill_tokens) + rows), (type(batch)((t,), (c,), decodes, context), t + rows)

    def parts(self, batch, replicas=None, pad: int = 0) -> tuple[float, float, float]:
        """``(compute, memory, communication)`` ms of one step (a :class:`~dynlab.latency.base.StepBatch`) run as a
        CUDA graph of ``pad`` padding rows more (:meth:`dynlab.latency.overheads.ServerTerms.step_pad`); the
        third adds the fixed times (``layer_us``, :func:`kernel_floors`) to the collectives. ``replicas``: the
        attention replicas' own batches and padding rows, ``(StepBatch, rows)`` pairs, when known (attention-DP
        ranks in lockstep, whose sum is ``batch`` and ``pad``), priced at the busiest instead of
        :meth:`_replicas`' guess; the expert layers take all of ``batch``.

        A padding row is a decode of no context that computes the linear layers, the experts and the
        collectives like a token, and reads no KV and no state: vLLM 0.33.0 gives it slot ``-1`` (``PAD_SLOT_ID``,
        ``GPUModelRunner`` in ``vllm/v1/worker/gpu_model_runner.py``) and a Mamba layer the null state index
        its kernel skips (``vllm/v1/attention/backends/mamba_attn.py``, ``selective_state_update`` in
        ``vllm/model_executor/layers/mamba/ops/mamba_ssm.py``), so it adds no window keys and no state read."""
        tokens = sum(batch.prefill_tokens) + batch.decode_requests + pad
        touched = 1.0 - self._miss ** tokens if self._miss else (1.0 if tokens else 0.0)
        compute = memory = 0.0
        for rep, rep_tokens in self._replicas(batch, pad) if replicas is None else [
                (b, sum(b.prefill_tokens) + b.decode_requests + p) for b, p in replicas]:
            pair_ms, kv_ms = self._attention(rep.prefill_tokens, rep.prefill_context, rep.decode_requests,
                                             rep.decode_context)
            requests = sum(1 for t in rep.prefill_tokens if t > 0) + rep.decode_requests
            compute = max(compute, self._token * rep_tokens + pair_ms)
            memory = max(memory, kv_ms + self._state * requests)
        compute += self._expert_token * tokens
        memory += self._dense_weights + self._expert_weights * touched
        comm = self._comm[0] * tokens + (self._comm[1] + self._layers_ms if tokens else 0.0)
        if self._floors is not None and tokens:
            comm += self._floors[tokens > SHARED_EXPERTS_STREAM_TOKENS]
        return compute, memory, comm


def roofline_domain(hardware) -> str | None:
    """``None`` inside what the roofline's defaults were fitted on (dense full-attention bf16 models on
    h100/h200 at tp 1-2, ``benchmarks/fit_roofline.py``), else the ways ``hardware`` lies outside it."""
    m, g, par = hardware.model, hardware.gpu, hardware.parallel
    out = []
    if m.experts:
        out.append(f"{m.name} is a mixture of experts ({m.experts} experts, {m.experts_per_tok} per token)")
    if m.attention == "mla":
        out.append(f"{m.name} uses MLA attention")
    kinds = [grp.kind for grp in m.kv_groups if grp.kind not in ("full", "mla")]
    if kinds:
        out.append(f"{m.name} has {', '.join(kinds).replace('_', '-')} layers")
    if m.quantization:
        out.append(f"{m.quantization} weights")
    if getattr(m, "kv_cache_dtype", "auto") != "auto":
        out.append(f"an {m.kv_cache_dtype} KV cache")
    if g.name not in FIT_GPUS:
        out.append(f"GPU {g.name}")
    if par.tp not in FIT_TP or not par.plain:
        out.append(par.describe())
    if not out:
        return None
    return ("outside its fit (dense full-attention bf16 models on h100/h200 at tp 1-2): "
            + "; ".join(out) + " (see docs/latency.md)")

