"""The ``blis`` latency model: inference-sim (BLIS)'s "trained physics" step time with its global coefficients."""
from __future__ import annotations

from typing import Mapping

from dynlab.latency.base import LatencyModel, StepBatch

# inference-sim defaults.yaml -> trained_physics_coefficients.beta_coeffs at commit f90a1e3a (11 values; the
# comment there: "Trained from iter29 ... loss 34.57%"). Index: 0 prefill compute, 1 decode compute,
# 2 weight loading, 3 TP all-reduce, 4 us per layer, 5 us per request, 6 us per step, 7 us per interleaved
# MoE layer, 8 prefill KV write, 9 decode KV read, 10 MoE dispatch (EP).
BETA = (0.152128, 0.0, 1.36252915, 0.752037, 32.09546717, 4.41684444, 126.024825, 481.8613888, 0.0,
        1.94710771, 0.752037)
ALPHA = (15563.199579, 777.3455, 45.907545)
"""Request-level overheads (queueing us, post-decode us, us per output token): published, NOT applied."""

KV_BYTES = 2.0
"""Bytes per KV element: BLIS always charges fp16/bf16 KV, whatever the weights."""

# inference-sim hardware_config.json at f90a1e3a: (bf16 TFLOP/s, fp8 TFLOP/s, HBM TB/s), keyed by dynlab's GPU name.
BLIS_HARDWARE: dict[str, tuple[float, float, float]] = {
    "h100": (989.5, 1979.0, 3.35),        # "H100"
    "a100-80gb": (312.0, 0.0, 2.039),     # "A100-80" (alias of "A100-SXM")
    "l40s": (362.05, 1466.0, 0.864),      # "L40S"
}


class Blis(LatencyModel):
    """BLIS trained physics: roofline terms x learned corrections + per-layer/request/step overheads.

    inference-sim (github.com/inference-sim/inference-sim, Go, Apache-2.0) at commit
    ``f90a1e3a6787da17c2cd463dab6fb2660b1b1760`` (2026-08-22): ``sim/latency/trained_physics_model.go``
    (``TrainedPhysicsModel.StepTime``), the global coefficients ``defaults.yaml`` ->
    ``trained_physics_coefficients`` ("Trained from iter29", fitted to end-to-end TTFT/ITL/E2E of
    H100 vLLM traces) and the GPU table ``hardware_config.json``. Re-implemented for dense models at
    data parallelism 1; a step costs, in microseconds, with ``L`` layers, hidden ``d``,
    ``dH = d / n_heads``, ``dKV = n_kv_heads * dH``, FFN width ``dff``, ``T`` prefill tokens, ``R``
    decode requests of summed context ``C``, ``B`` requests in the step, ``F`` = peak FLOP/us, ``W``
    = HBM bytes/us::

        T_pf  = [L*2*T*d*(2d+2dKV)/tp + L*sum(4*(nh/tp)*t*(s+t/2)*dH) + L*T*6*d*dff/tp] / F
        T_pkv = L*2*(dKV/tp)*T*2 / W
        T_dc  = [L*2*R*d*(2d+2dKV)/tp + L*4*(nh/tp)*C*dH + L*R*6*d*dff/tp] / F
        T_dkv = L*2*(dKV/tp)*2*(C+R) / W
        T_w   = [L*d*(2d+2dKV) + L*3*d*dff] * weight bytes per param / tp / W
        T_tp  = 2L*(T+R)*d*act bytes*2*(tp-1)/tp / W
        step  = 0.152128*T_pf + 0*T_pkv + 0*T_dc + 1.94710771*T_dkv + 1.36252915*T_w
                + 0.752037*T_tp + 32.09546717*L + 4.41684444*B + 126.024825

    ``t`` is a prefill chunk and ``s`` BLIS's ``InputLen`` (the whole prompt); a :class:`StepBatch`
    does not carry the prompt length, so ``s = context + t`` (the prompt up to the end of this chunk):
    exact for an unchunked prefill and for a prompt's last chunk, an undercount for earlier chunks.
    An empty step costs 1 us (as in BLIS). Left out: BLIS's truncation to whole microseconds (so
    that :meth:`decode_ms` has a closed form; < 1 us per step), LoRA adapters, and the request-level
    alpha overheads (15.6 ms queueing per request, 0.78 ms after the last token, 46 us per output
    token: :data:`ALPHA`), which belong to the serving front end, not to a step.

    GPUs: BLIS's table has H100 (989.5 TFLOP/s bf16, 1,979 fp8, 3.35 TB/s), A100-80 (312, -, 2.039)
    and L40S (362.05, 1,466, 0.864), used as published; h200 and b200 are not in it and take
    dynlab's datasheet figures (:mod:`dynlab.latency.hardware`) with no fp8 peak. BLIS uses the raw
    peaks (no MFU); fp8 weights on a GPU with an fp8 peak use that peak.

    Known to be off (``benchmarks/fidelity_latency.py``, docs/latency.md): the prefill coefficient
    0.152 puts prefill far below the physical bound (2,048 tokens of an 8B model need >= 33 TFLOP,
    >= 34 ms at 989 TFLOP/s; this model says 11.9 ms for Qwen3-8B on H100 against aiconfigurator's
    44.5 ms), because the coefficients were fitted end to end and alpha0's 15.6 ms of queueing
    absorbs part of every TTFT; ``head_dim`` in the config is ignored (``dH = hidden / heads``), so
    attention and KV are mis-sized where they differ (Qwen3-0.6B: 64 used, 128 real, KV halved);
    the coefficients were trained on H100 only and are carried to other GPUs by peak figures alone.
    Dense models only: a mixture-of-experts or MLA model (DeepSeek-V3) raises ``ValueError``, as
    does a ``tp`` that does not divide the query and KV heads (BLIS's own check).
    """

    name = "blis"
    options = ()

    def __init__(self, hardware, options: Mapping):
        super().__init__(hardware, options)
        m, g, tp = hardware.model, hardware.gpu, hardware.tp
        if m.attention == "mla" or m.active_params != m.params:
            raise ValueError(f"blis: {m.name} is a mixture-of-experts or MLA model; this port of BLIS "
                             "covers dense models only")
        if m.heads % tp or m.kv_heads % tp:
            raise ValueError(f"blis: tp {tp} must divide the query heads ({m.heads}) and KV heads ({m.kv_heads})")
        c = m.config if "num_hidden_layers" in m.config else m.config.get("text_config", m.config)
        dff = c.get("intermediate_size")
        if isinstance(dff, bool) or not isinstance(dff, int) or dff <= 0:
            raise ValueError(f"blis: {m.name} has no positive integer intermediate_size")
        bf16, fp8, tbs = BLIS_HARDWARE.get(g.name, (g.bf16_tflops, 0.0, g.hbm_gbps / 1000.0))
        flops_us = (fp8 if m.weight_bytes_per_param == 1 and fp8 > 0 else bf16) * 1e6
        bytes_us = tbs * 1e6
        L, d, tpf = float(m.layers), float(m.hidden_size), float(tp)
        dh = float(m.hidden_size // m.heads)  # BLIS: hidden / heads, config head_dim ignored
        dkv = m.kv_heads * dh
        proj_ffn = L * 2 * d * (2 * d + 2 * dkv) / tpf + L * 6 * d * dff / tpf  # FLOPs per token
        self._token_compute = proj_ffn / flops_us                      # us per prefill/decode token
        self._pair = L * 4 * (m.heads / tpf) * dh / flops_us          # us per (query, key) pair
        self._kv = L * 2 * (dkv / tpf) * KV_BYTES / bytes_us           # us per KV token read or written
        weights = (L * d * (2 * d + 2 * dkv) + L * 3 * d * dff) * m.weight_bytes_per_param / tpf
        self._fixed = BETA[2] * weights / bytes_us + BETA[4] * L + BETA[6]
        self._comm = 2 * L * d * m.dtype_bytes * 2 * (tpf - 1) / tpf / bytes_us  # us per token, 0 at tp 1

    def step_us(self, batch: StepBatch) -> float:
        """One step in microseconds, before BLIS's truncation to an integer (>= 1 us)."""
        tokens = sum(batch.prefill_tokens)
        r = batch.decode_requests
        n = len(batch.prefill_tokens) + r
        if n == 0:
            return 1.0
        pairs = sum(t * (c + t + t / 2.0) for t, c in zip(batch.prefill_tokens, batch.prefill_context))
        prefill = self._token_compute * tokens + self._pair * pairs if tokens else 0.0
        prefill_kv = self._kv * tokens
        decode = self._token_compute * r + self._pair * batch.decode_context if r else 0.0
        decode_kv = self._kv * (batch.decode_context + r) if r else 0.0
        step = (BETA[0] * prefill + BETA[8] * prefill_kv + BETA[1] * decode + BETA[9] * decode_kv
                + self._fixed + BETA[3] * self._comm * (tokens + r) + BETA[5] * n)
        return max(1.0, step)

    def step_ms(self, batch: StepBatch) -> float:
        return self.step_us(batch) / 1000.0

    def decode_ms(self, requests: int, context: int, steps: int) -> float:
        """Closed form: a decode-only step is affine in the summed context, which grows by ``requests``."""
        if steps <= 0:
            return 0.0
        first = self.step_ms(StepBatch((), (), requests, context))
        if requests <= 0:
            return steps * first
        slope = self.step_ms(StepBatch((), (), requests, context + requests)) - first
        return steps * first + slope * steps * (steps - 1) / 2.0
