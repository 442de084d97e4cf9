"""The cost of moving a request's KV cache between GPUs (disaggregated serving).

In disaggregated serving one GPU (or pool) runs the prefill and another runs the decode, so every
request's KV cache travels over a link between them. Whether that pays depends on how many bytes a
token's KV takes (the model catalogue, :mod:`dynlab.models`) and on the link's bandwidth; this
module computes the transfer side.

Units, everywhere in this module:

* sizes are **bytes**; ``kv_mib`` values are MiB = 2**20 bytes;
* bandwidth is **GB/s = 10**9 bytes per second** (not GiB/s);
* times are **milliseconds**.

The five functions of the seed lab (``kv_bytes_per_token``, ``transfer_ms``, ``ttft_disagg``,
``effective_gbps``, ``breakeven_gbps``) validate their arguments: a non-positive bandwidth, time or
saving, or a negative size, raises :class:`ValueError` whose message starts with the argument's
name; a non-number (``bool`` included) raises :class:`TypeError`. ``kv_bytes_per_token`` and the
``config.json`` reading (``kv_shape_from_config``, ``load_model_config``, ``ModelConfigError``, ...)
live in :mod:`dynlab.models` and are re-exported here under their old names.
"""
from __future__ import annotations

from dynlab.models.checks import finite as _finite
from dynlab.models.checks import nbytes as _nbytes
from dynlab.models.checks import nbytes_text as _bytes
from dynlab.models.checks import non_negative as _non_negative
from dynlab.models.checks import positive as _positive
from dynlab.models.config import (  # noqa: F401  (re-exported: the old import names)
    ModelConfigError, UnknownModelError, bundled_models, config_file, config_int, dtype_bytes_of, head_dim_of,
    kv_heads_of, load_model_config, read_model_config, text_config_of)
from dynlab.models.kv import (  # noqa: F401  (re-exported)
    DEFAULT_MODEL, VLLM_FP8_MLA_BYTES_PER_LAYER, KvShape, kv_bytes_per_token, kv_bytes_per_token_from_config,
    kv_shape_from_config, mla_kv_bytes_per_token, model_table)

GB = 10**9
"""Bytes in one GB (decimal): the unit of every ``gbps`` argument."""
MIB = 2**20
"""Bytes in one MiB (binary): the unit of ``kv_mib``."""


def transfer_ms(tokens: float, bytes_per_token: float, gbps: float) -> float:
    """Milliseconds to move the KV of ``tokens`` tokens over a link of ``gbps`` GB/s.

    ``tokens * bytes_per_token / (gbps * 10**9) * 1000``; GB/s is 10**9 bytes per second.
    Example: 1,500 Qwen3-0.6B tokens (114,688 B each) at 0.112 GB/s take 1,536.0 ms.

    Raises ``ValueError`` if ``gbps`` is not positive or a size is negative, or if the time is not a
    finite float (``gbps`` too small for the bytes).
    """
    nbytes = _nbytes(tokens, bytes_per_token)
    _positive("gbps", gbps)
    return _finite(lambda: nbytes / (gbps * GB) * 1000.0,
                   f"gbps {gbps!r} is too small for {_bytes(nbytes)} bytes: the transfer time overflows a float")


def ttft_disagg(prefill_ms: float, tokens: float, bytes_per_token: float, gbps: float, overhead_ms: float = 0.0) -> float:
    """Time to first token (ms) when the KV is prefilled on one GPU and moved to another.

    ``prefill_ms + transfer_ms(tokens, bytes_per_token, gbps) + overhead_ms``; ``overhead_ms``
    covers everything else (scheduling, handshakes), 0 by default.

    Raises ``ValueError`` if ``prefill_ms`` or ``gbps`` is not positive, or ``overhead_ms`` or a
    size is negative.
    """
    prefill_ms = _positive("prefill_ms", prefill_ms)
    overhead_ms = _non_negative("overhead_ms", overhead_ms)
    move = transfer_ms(tokens, bytes_per_token, gbps)
    return _finite(lambda: prefill_ms + move + overhead_ms,
                   f"prefill_ms {prefill_ms!r} + transfer {move!r} + overhead_ms {overhead_ms!r} overflows a float")


def effective_gbps(nbytes: float, ms: float) -> float:
    """Throughput in GB/s (10**9 bytes/s) of moving ``nbytes`` bytes in ``ms`` milliseconds.

    ``nbytes / (ms / 1000) / 10**9``; the inverse of :func:`transfer_ms`.

    Raises ``ValueError`` if ``ms`` is not positive or ``nbytes`` is negative.
    """
    nbytes = _non_negative("nbytes", nbytes)
    return nbytes / (_positive("ms", ms) / 1000.0) / GB


def breakeven_gbps(tokens: float, bytes_per_token: float, saved_ms: float) -> float:
    """Least bandwidth (GB/s) at which the KV transfer fits in the ``saved_ms`` disaggregation saves.

    If running prefill and decode apart saves ``saved_ms`` per request, the move of
    ``tokens * bytes_per_token`` bytes must take at most that long:
    ``tokens * bytes_per_token / (saved_ms / 1000) / 10**9``, so that
    ``transfer_ms(tokens, bytes_per_token, breakeven_gbps(...)) == saved_ms``.

    Raises ``ValueError`` if ``saved_ms`` is not positive or a size is negative, or if the bandwidth
    is not a finite float (``saved_ms`` too small for the bytes).
    """
    nbytes = _nbytes(tokens, bytes_per_token)
    _positive("saved_ms", saved_ms)
    return _finite(lambda: nbytes / (saved_ms / 1000.0) / GB,
                   f"saved_ms {saved_ms!r} is too small for {_bytes(nbytes)} bytes: the bandwidth overflows a float")


def kv_mib(tokens: float, bytes_per_token: float) -> float:
    """Size in MiB (2**20 bytes) of the KV of ``tokens`` tokens. Raises ``ValueError`` on a negative size,
    or when the size overflows a float."""
    nbytes = _nbytes(tokens, bytes_per_token)
    return nbytes / MIB


def cost_report(
    tokens: float,
    bytes_per_token: float,
    gbps: float,
    *,
    prefill_ms: float | None = None,
    overhead_ms: float = 0.0,
    saved_ms: float | None = None,
    shape: KvShape | None = None,
) -> dict:
    """The ``dynlab disagg`` record for one bandwidth.

    ``{"bytes_per_token", "kv_mib", "transfer_ms"}`` with ``kv_mib`` and ``transfer_ms`` rounded to one
    decimal; with ``prefill_ms`` also ``ttft_disagg_ms`` (one decimal, :func:`ttft_disagg` with
    ``overhead_ms``); with ``saved_ms`` also ``breakeven_gbps`` (four significant digits, so that
    small values do not round to 0). Raises ``ValueError`` as the functions it calls.

    With the ``shape`` of a model whose layers do not all keep every token (sliding-window,
    chunked-local or state layers: :attr:`KvShape.uniform` false), the KV moved is what the request
    keeps resident, :meth:`KvShape.resident_bytes` (the global layers' ``tokens``, a window layer's
    last ``window`` tokens, a state layer's state), not ``tokens * bytes_per_token``; the record then
    also holds ``kv_bytes`` and ``layer_groups`` (per kind: ``layers``, the ``tokens`` kept or
    ``state_bytes``, and ``kv_bytes``).
    """
    if shape is not None and not shape.uniform:
        return _resident_report(tokens, shape, gbps, prefill_ms, overhead_ms, saved_ms)
    report = {
        "bytes_per_token": bytes_per_token,
        "kv_mib": round(kv_mib(tokens, bytes_per_token), 1),
        "transfer_ms": round(transfer_ms(tokens, bytes_per_token, gbps), 1),
    }
    if prefill_ms is not None:
        report["ttft_disagg_ms"] = round(ttft_disagg(prefill_ms, tokens, bytes_per_token, gbps, overhead_ms), 1)
    elif overhead_ms:
        raise ValueError("overhead_ms is only used with prefill_ms")
    if saved_ms is not None:
        report["breakeven_gbps"] = float(f"{breakeven_gbps(tokens, bytes_per_token, saved_ms):.4g}")
    return report


def _resident_report(tokens, shape: KvShape, gbps, prefill_ms, overhead_ms, saved_ms) -> dict:
    """:func:`cost_report` for a non-uniform ``shape``: the resident bytes move, counted as one "token" of
    that many bytes so that the same checks and roundings apply."""
    tokens = _nonneg_tokens(tokens)
    nbytes = shape.resident_bytes(tokens)
    report = cost_report(1, nbytes, gbps, prefill_ms=prefill_ms, overhead_ms=overhead_ms, saved_ms=saved_ms)
    report["bytes_per_token"] = shape.bytes_per_token
    report["kv_bytes"] = nbytes
    groups = {}
    for g in shape.groups:
        entry = {"layers": g.layers}
        if g.state_bytes:
            entry["state_bytes"] = g.state_bytes
        else:
            entry["tokens"] = g.resident_tokens(tokens)
        entry["kv_bytes"] = g.resident_bytes(tokens)
        groups[g.kind] = entry
    report["layer_groups"] = groups
    return report


def _nonneg_tokens(tokens) -> int:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be a non-negative integer for a model with window or state layers, got {tokens!r}")
    return tokens
