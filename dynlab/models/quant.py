"""Weight bytes of a model from its ``quantization_config`` (bytes; parameters from :func:`~dynlab.models.params.param_parts`).

=====================  ===================================================================  ======================
``quant_method``       bytes                                                                source
=====================  ===================================================================  ======================
(none)                 every parameter at the ``torch_dtype`` size                          the config
``fp8``, ``fbgemm_fp8`` 1 byte per parameter (block scales and the few layers kept in 16      DeepSeek-V3, Qwen3-FP8
                       bits are not separated: within ~2 % for the bundled fp8 models)      configs
``mxfp4``              routed experts at 17/32 byte per parameter (4-bit elements and one   OCP Microscaling
                       8-bit shared scale per block of 32), everything else at the dtype    Formats (MX) v1.0;
                       (gpt-oss's ``modules_to_not_convert``: attention, router,            gpt-oss model card
                       embeddings, lm_head)
``modelopt`` NVFP4     every linear layer (attention, MLPs, experts) at 9/16 byte per       NVIDIA NVFP4
                       parameter (4-bit elements and one FP8 scale per block of 16),        (TensorRT Model
                       embeddings and norms at the dtype                                    Optimizer)
``modelopt`` FP8       1 byte per parameter, as ``fp8``                                     idem
=====================  ===================================================================  ======================

Any other ``quant_method`` (or a ``modelopt`` ``quant_algo`` other than FP8/NVFP4) is refused by name:
its weights cannot be sized without reading it.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Mapping

from dynlab.models.config import ModelConfigError

MXFP4_BYTES_PER_PARAM = Fraction(17, 32)
"""MXFP4: 32 FP4 (E2M1) elements share one 8-bit (E8M0) scale, 4.25 bits per element (OCP MX v1.0)."""
NVFP4_BYTES_PER_PARAM = Fraction(9, 16)
"""NVFP4: 16 FP4 (E2M1) elements share one FP8 (E4M3) scale, 4.5 bits per element (NVIDIA)."""


def quantization_of(config: Mapping, text: Mapping) -> Mapping:
    """The ``quantization_config`` of a config (its text part first); ``{}`` when there is none."""
    quant = text.get("quantization_config") or config.get("quantization_config") or {}
    return quant if isinstance(quant, Mapping) else {}


def quant_scheme(quant: Mapping, source: str) -> str:
    """``""`` (none), ``"fp8"``, ``"mxfp4"`` or ``"nvfp4"``. Raises :class:`ModelConfigError` naming the field."""
    if not quant:
        return ""
    method = str(quant.get("quant_method", "")).lower()
    if method in ("fp8", "float8", "fbgemm_fp8"):
        return "fp8"
    if method == "mxfp4":
        return "mxfp4"
    if method == "modelopt":
        algo = str(quant.get("quant_algo", "")).upper()
        if algo in ("FP8", "NVFP4"):
            return algo.lower()
        raise ModelConfigError(f"{source}: field 'quantization_config.quant_algo' {algo!r} is not read by dynlab "
                               "(it reads FP8 and NVFP4)")
    raise ModelConfigError(f"{source}: field 'quantization_config.quant_method' {method!r} is not read by dynlab "
                           "(it reads fp8, mxfp4 and modelopt FP8/NVFP4)")


def weight_bytes(parts: Mapping, scheme: str, dtype_bytes: int) -> int:
    """Bytes of all weights (every expert resident) under ``scheme``, from :func:`param_parts`'s ``parts``."""
    total = parts["embed"] + parts["mixers"] + parts["dense_mlp"] + parts["shared"] + parts["norms"] + parts["experts"]
    if scheme == "fp8":
        return total
    if scheme == "mxfp4":
        return math.ceil(parts["experts"] * MXFP4_BYTES_PER_PARAM) + (total - parts["experts"]) * dtype_bytes
    if scheme == "nvfp4":
        linear = parts["mixers"] + parts["dense_mlp"] + parts["shared"] + parts["experts"]
        return math.ceil(linear * NVFP4_BYTES_PER_PARAM) + (total - linear) * dtype_bytes
    return total * dtype_bytes


def expert_weight_bytes(parts: Mapping, scheme: str, dtype_bytes: int) -> int:
    """Bytes of the routed experts alone under ``scheme`` (what expert parallelism divides)."""
    experts = parts["experts"]
    if scheme == "fp8":
        return experts
    if scheme == "mxfp4":
        return math.ceil(experts * MXFP4_BYTES_PER_PARAM)
    if scheme == "nvfp4":
        return math.ceil(experts * NVFP4_BYTES_PER_PARAM)
    return experts * dtype_bytes
