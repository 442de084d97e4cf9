"""KV-cache size per token and the cost of moving it between GPUs (disaggregated serving).

In disaggregated serving one GPU (or pool) runs the prefill and another runs the decode, so every
request's KV cache travels over a link between them. Whether that pays depends on how many bytes a
token's KV takes and on the link's bandwidth; this module computes both sides.

Units, everywhere in this module:

* sizes are **bytes**; ``kv_mib`` values are MiB = 2**20 bytes;
* bandwidth is **GB/s = 10**9 bytes per second** (not GiB/s);
* times are **milliseconds**.

The five functions of the seed lab (``kv_bytes_per_token``, ``transfer_ms``, ``ttft_disagg``,
``effective_gbps``, ``breakeven_gbps``) validate their arguments: a non-positive bandwidth, time or
saving, or a negative size, raises :class:`ValueError` whose message starts with the argument's
name; a non-number (``bool`` included) raises :class:`TypeError`.

KV size from a Hugging Face ``config.json`` (:func:`kv_shape_from_config`):

* **MHA / GQA / MQA** (Llama, Qwen, ...): every layer stores a key and a value vector for each KV head,
  ``2 * num_hidden_layers * num_key_value_heads * head_dim * dtype_bytes`` bytes per token.
* **MLA** (multi-head latent attention, DeepSeek-V2/V3): every layer stores one compressed latent of
  ``kv_lora_rank`` elements plus the shared rotary key of ``qk_rope_head_dim`` elements, once, not as
  separate K and V: ``num_hidden_layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes``.

Bundled configs (``dynlab/data/models/NAME.json``, the attention-relevant fields of each model's
public ``config.json`` on the Hugging Face Hub): ``qwen3-0.6b`` (Qwen/Qwen3-0.6B, the default),
``llama-3-8b`` (meta-llama/Meta-Llama-3-8B), ``qwen3-32b`` (Qwen/Qwen3-32B) and ``deepseek-v3``
(deepseek-ai/DeepSeek-V3).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from importlib import resources
from numbers import Real
from typing import Any, Mapping

from dynlab.errors import DynlabError, InputFileError

GB = 10**9
"""Bytes in one GB (decimal): the unit of every ``gbps`` argument."""
MIB = 2**20
"""Bytes in one MiB (binary): the unit of ``kv_mib``."""

DEFAULT_MODEL = "qwen3-0.6b"
"""The bundled model whose shape is the default of :func:`kv_bytes_per_token`."""

VLLM_FP8_MLA_BYTES_PER_LAYER = 656
"""vLLM's fp8 MLA cache entry for DeepSeek-V3, per layer and token: 512 fp8 latent bytes, four
float32 scales (16 bytes) and the 64-element rotary key kept in 16 bits (128 bytes). The uniform
formula of this module gives 576 for the same shape at ``dtype_bytes=1``."""


class ModelConfigError(DynlabError):
    """A model ``config.json`` lacks a needed field, holds a bad value, or cannot be read.

    ``str()`` is one line: ``SOURCE: what is wrong``, naming the field.
    """


class UnknownModelError(DynlabError, LookupError):
    """A model name with no bundled config; ``str()`` lists the bundled names."""

    def __str__(self) -> str:  # LookupError would quote the message
        return self.args[0]


# --------------------------------------------------------------------------------------------
# argument checks


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not isinstance(value, int) and not math.isfinite(value):  # an int is finite, however large
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def _bytes(n) -> str:
    """``n`` bytes for a message: ``1,146,880`` up to 10^18, ``about 10^N`` beyond (a huge int stays one short line)."""
    if isinstance(n, int) and n >= 10**18:
        return f"about 10^{len(str(n)) - 1}"
    return f"{n:,}"


def _nbytes(tokens, bytes_per_token):
    """``tokens * bytes_per_token`` after their checks; ``ValueError`` when the product overflows a float."""
    nbytes = _non_negative("tokens", tokens) * _non_negative("bytes_per_token", bytes_per_token)
    _finite(lambda: nbytes, f"tokens x bytes_per_token = {_bytes(nbytes)} bytes overflows a float")
    return nbytes


def _finite(compute, message: str) -> float:
    """``compute()`` as a float, or ``ValueError(message)`` when it is not a finite number (a huge size, a
    tiny bandwidth or time: the float overflows, or a divisor underflows to 0)."""
    try:
        value = float(compute())
    except (OverflowError, ZeroDivisionError):
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(message)
    return value


def _positive(name: str, value: Any) -> float:
    if _real(name, value) <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return value


def _non_negative(name: str, value: Any) -> float:
    if _real(name, value) < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return value


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return value


# --------------------------------------------------------------------------------------------
# the five functions


def kv_bytes_per_token(layers: int = 28, kv_heads: int = 8, head_dim: int = 128, dtype_bytes: int = 2) -> int:
    """Bytes of KV cache one token takes in a model with MHA/GQA attention.

    ``2 * layers * kv_heads * head_dim * dtype_bytes``: a key and a value vector of ``head_dim``
    elements per KV head and per layer, each element ``dtype_bytes`` bytes.

    The defaults are Qwen3-0.6B's ``config.json`` (28 layers, 8 KV heads, head size 128, bfloat16 = 2
    bytes), giving 114,688 bytes. For MLA models use :func:`mla_kv_bytes_per_token`.

    Raises ``TypeError`` for a non-integer and ``ValueError`` for a negative argument.
    """
    layers = _count("layers", layers)
    kv_heads = _count("kv_heads", kv_heads)
    head_dim = _count("head_dim", head_dim)
    dtype_bytes = _count("dtype_bytes", dtype_bytes)
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def mla_kv_bytes_per_token(layers: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype_bytes: int = 2) -> int:
    """Bytes of KV cache one token takes in a model with multi-head latent attention (MLA).

    ``layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes``: one compressed KV latent and one
    rotary key shared by all heads, stored once per layer (not as a separate K and V).
    DeepSeek-V3 (61 layers, rank 512, rotary 64) at bfloat16: 70,272 bytes.

    Layout assumed: every element ``dtype_bytes`` bytes, no scales. With ``dtype_bytes=1`` this gives
    576 bytes per layer for DeepSeek-V3, whereas vLLM's fp8 MLA cache stores 656 bytes per layer and
    token (:data:`VLLM_FP8_MLA_BYTES_PER_LAYER`: the rotary part stays in 16 bits and scales are
    added), so for that engine multiply ``layers`` by 656 instead.

    Raises ``TypeError`` for a non-integer and ``ValueError`` for a negative argument.
    """
    layers = _count("layers", layers)
    kv_lora_rank = _count("kv_lora_rank", kv_lora_rank)
    qk_rope_head_dim = _count("qk_rope_head_dim", qk_rope_head_dim)
    dtype_bytes = _count("dtype_bytes", dtype_bytes)
    return layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes


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
) -> dict:
    """The ``dynlab disagg`` record for one bandwidth.

    ``{"bytes_per_token", "kv_mib", "transfer_ms"}`` with ``kv_mib`` and ``transfer_ms`` rounded to one
    decimal; with ``prefill_ms`` also ``ttft_disagg_ms`` (one decimal, :func:`ttft_disagg` with
    ``overhead_ms``); with ``saved_ms`` also ``breakeven_gbps`` (four significant digits, so that
    small values do not round to 0). Raises ``ValueError`` as the functions it calls.
    """
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


# --------------------------------------------------------------------------------------------
# model configs

_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "float8": 1, "fp8": 1,
}


def dtype_bytes_of(name: str) -> int | None:
    """Bytes per element of a ``torch_dtype`` string (``"bfloat16"`` -> 2), or ``None`` if unknown.

    float32 4; bfloat16/float16 2; every float8 variant (``float8_e4m3fn``, ``float8_e5m2``, ...) 1.
    A ``torch.`` prefix is ignored.
    """
    key = name.strip().lower()
    if key.startswith("torch."):
        key = key[len("torch."):]
    if key.startswith("float8") or key.startswith("fp8"):
        return 1
    return _DTYPE_BYTES.get(key)


@dataclass(frozen=True)
class KvShape:
    """What decides a model's KV bytes per token.

    ``attention`` is ``"mha"`` (as many KV heads as attention heads), ``"gqa"``, ``"mqa"`` (one KV
    head) or ``"mla"``; MHA/GQA/MQA use ``kv_heads`` and ``head_dim``, MLA uses ``kv_lora_rank`` and
    ``qk_rope_head_dim``.
    """

    attention: str
    layers: int
    dtype_bytes: int
    kv_heads: int | None = None
    head_dim: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None

    @property
    def bytes_per_token(self) -> int:
        """Bytes per token by the formula of this shape's attention kind (see the module docstring)."""
        if self.attention == "mla":
            return mla_kv_bytes_per_token(self.layers, self.kv_lora_rank, self.qk_rope_head_dim, self.dtype_bytes)
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, self.dtype_bytes)

    def as_dict(self) -> dict:
        """The shape's fields that apply to its attention kind, plus ``bytes_per_token``."""
        out = {"attention": self.attention, "layers": self.layers}
        if self.attention == "mla":
            out.update(kv_lora_rank=self.kv_lora_rank, qk_rope_head_dim=self.qk_rope_head_dim)
        else:
            out.update(kv_heads=self.kv_heads, head_dim=self.head_dim)
        out.update(dtype_bytes=self.dtype_bytes, bytes_per_token=self.bytes_per_token)
        return out


def _present(config: Mapping, field: str) -> bool:
    return config.get(field) is not None


def config_int(config: Mapping, field: str, source: str, why: str = "", *, default: int | None = None,
               minimum: int = 1) -> int:
    """The integer ``field`` of a ``config.json`` mapping: the one rule for every integer field dynlab reads
    (the KV shape here, the parameter count in :mod:`dynlab.latency.hardware`).

    The value must be a JSON integer (a Python ``int``, not a ``bool``) of at least ``minimum``: 1 (a
    positive integer) or 0 (a non-negative integer). A float is refused even when whole (``32.0``):
    transformers and vLLM use these fields as Python ints (``range(num_hidden_layers)``, tensor
    shapes), so a file holding one is not a config they load. Absent or ``null``: ``default``, or,
    without one, ``missing field 'FIELD'`` followed by ``why``.

    Raises :class:`ModelConfigError` (``SOURCE: ...``, naming the field).
    """
    value = config.get(field)
    if value is None:
        if default is not None:
            return default
        raise ModelConfigError(f"{source}: missing field '{field}'{why}")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a non-negative integer" if minimum == 0 else "a positive integer"
        raise ModelConfigError(f"{source}: field '{field}' must be {kind}, got {value!r}")
    return value


def text_config_of(config: Mapping) -> Mapping:
    """The mapping a config's model fields are read from: ``config`` itself, or its ``text_config`` when
    ``config`` has no ``num_hidden_layers`` (multimodal configs nest the language model there)."""
    if not _present(config, "num_hidden_layers") and isinstance(config.get("text_config"), Mapping):
        return config["text_config"]
    return config


def kv_heads_of(config: Mapping, source: str) -> int:
    """``num_key_value_heads``, falling back to ``num_attention_heads`` (MHA); :func:`config_int`'s rule."""
    if _present(config, "num_key_value_heads"):
        return config_int(config, "num_key_value_heads", source)
    if _present(config, "num_attention_heads"):
        return config_int(config, "num_attention_heads", source)
    raise ModelConfigError(f"{source}: missing field 'num_key_value_heads' (or 'num_attention_heads')")


def head_dim_of(config: Mapping, source: str) -> int:
    """``head_dim``, falling back to ``hidden_size / num_attention_heads`` (which must divide);
    :func:`config_int`'s rule. Raises :class:`ModelConfigError`."""
    if _present(config, "head_dim"):
        return config_int(config, "head_dim", source)
    why = " (needed for the head size when 'head_dim' is absent)"
    hidden = config_int(config, "hidden_size", source, why)
    heads = config_int(config, "num_attention_heads", source, why)
    if hidden % heads:
        raise ModelConfigError(
            f"{source}: field 'hidden_size' ({hidden}) is not a multiple of 'num_attention_heads' ({heads}); "
            "the config needs 'head_dim'")
    return hidden // heads


def _dtype_from_config(config: Mapping, outer: Mapping, dtype_bytes: int | None, source: str) -> int:
    if dtype_bytes is not None:
        dtype = _count("dtype_bytes", dtype_bytes)
        if dtype == 0:
            raise ValueError("dtype_bytes must be positive, got 0")
        return dtype
    for where in (config, outer):
        field = next((f for f in ("torch_dtype", "dtype") if _present(where, f)), None)
        if field is not None:
            raw = where[field]
            dtype = dtype_bytes_of(raw) if isinstance(raw, str) else None
            if dtype is None:
                raise ModelConfigError(f"{source}: field '{field}' has an unknown dtype {raw!r}")
            return dtype
    raise ModelConfigError(f"{source}: missing field 'torch_dtype' (or 'dtype')")


def kv_shape_from_config(config: Mapping, dtype_bytes: int | None = None, source: str = "config") -> KvShape:
    """Read the KV shape from a Hugging Face ``config.json`` (already parsed).

    Fields read: ``num_hidden_layers``; for MLA (``kv_lora_rank`` present) ``kv_lora_rank`` and
    ``qk_rope_head_dim``; otherwise ``num_key_value_heads`` (falling back to ``num_attention_heads``)
    and ``head_dim`` (falling back to ``hidden_size / num_attention_heads``); the element size from
    ``torch_dtype`` or ``dtype`` (see :func:`dtype_bytes_of`) unless ``dtype_bytes`` overrides it
    (for an fp8 KV cache on a bfloat16 model). Multimodal configs that nest these under
    ``text_config`` are read from there. Every layer is assumed to keep full-length KV (sliding
    windows, DeepSeek's extra multi-token-prediction layer and DSA indexer caches are not counted).

    Every integer field follows :func:`config_int` (a JSON integer, ``32.0`` refused), the rule
    :func:`dynlab.latency.hardware.param_count` reads its fields by too.

    Raises :class:`ModelConfigError` (one line, ``source: ...``, naming the field) when a needed field
    is missing or not a positive integer, or the dtype is unknown; ``ValueError``/``TypeError``
    for a bad ``dtype_bytes``.
    """
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"{source}: expected a JSON object, got {type(config).__name__}")
    outer = config
    config = text_config_of(config)

    layers = config_int(config, "num_hidden_layers", source)
    if _present(config, "kv_lora_rank"):
        rank = config_int(config, "kv_lora_rank", source)
        rope = config_int(config, "qk_rope_head_dim", source, " (needed with 'kv_lora_rank')")
        dtype = _dtype_from_config(config, outer, dtype_bytes, source)
        return KvShape(attention="mla", layers=layers, dtype_bytes=dtype, kv_lora_rank=rank, qk_rope_head_dim=rope)
    kv_heads = kv_heads_of(config, source)
    head_dim = head_dim_of(config, source)
    dtype = _dtype_from_config(config, outer, dtype_bytes, source)
    heads = config_int(config, "num_attention_heads", source, default=0)  # 0: absent
    if kv_heads == 1:
        attention = "mqa"
    elif heads == kv_heads:
        attention = "mha"
    else:
        attention = "gqa"
    return KvShape(attention=attention, layers=layers, dtype_bytes=dtype, kv_heads=kv_heads, head_dim=head_dim)


def kv_bytes_per_token_from_config(config: Mapping, dtype_bytes: int | None = None, source: str = "config") -> int:
    """KV bytes per token of the model a ``config.json`` describes: ``kv_shape_from_config(...).bytes_per_token``.

    MHA/GQA: ``2 * num_hidden_layers * num_key_value_heads * head_dim * dtype_bytes``; MLA:
    ``num_hidden_layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes`` (uniform element size;
    vLLM's fp8 MLA layout is 656 bytes per layer for DeepSeek-V3, not the 576 this gives at
    ``dtype_bytes=1``). Raises :class:`ModelConfigError` naming a missing or bad field.
    """
    return kv_shape_from_config(config, dtype_bytes, source).bytes_per_token


def config_file(path: str) -> str:
    """The file a model path names: ``path`` itself, or ``path/config.json`` when ``path`` is a directory
    (a Hugging Face download: ``huggingface-cli download Qwen/Qwen3-8B --local-dir Qwen3-8B`` leaves the
    config at ``Qwen3-8B/config.json``). Errors in that file name it.

    Raises :class:`~dynlab.errors.InputFileError` (a usage error in the CLI, exit 2) for a directory
    with no ``config.json`` in it.
    """
    if os.path.isdir(path):
        inner = os.path.join(path, "config.json")
        if not os.path.lexists(inner):
            raise InputFileError(path, "a directory with no config.json in it")
        return inner
    return path


def read_model_config(path: str) -> dict:
    """Parse the ``config.json`` at ``path``, or in the directory ``path`` (:func:`config_file`).

    Raises :class:`~dynlab.errors.InputFileError` (``PATH: why``) for a file that cannot be opened
    (missing, a directory without a ``config.json``, not readable) and :class:`ModelConfigError` for
    one that is not JSON.
    """
    path = config_file(path)
    try:
        fh = open(path, encoding="utf-8")
    except OSError as exc:
        raise InputFileError(path, exc.strerror or str(exc)) from None
    with fh:
        try:
            return json.load(fh)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelConfigError(f"{path}: not a JSON file ({exc})") from None
        except RecursionError:
            raise ModelConfigError(f"{path}: not a model config: JSON nested too deeply") from None


def _models_dir():
    return resources.files("dynlab").joinpath("data", "models")


def bundled_models() -> list[str]:
    """Names of the bundled model configs (``dynlab/data/models/NAME.json``), sorted."""
    return sorted(p.name[: -len(".json")] for p in _models_dir().iterdir() if p.name.endswith(".json"))


def load_model_config(name: str) -> dict:
    """The bundled ``config.json`` fields of model ``name``. Raises :class:`UnknownModelError` listing the names."""
    names = bundled_models()
    if name not in names:
        raise UnknownModelError(f"unknown model {name!r}; bundled models: {', '.join(names)}")
    return json.loads(_models_dir().joinpath(f"{name}.json").read_text(encoding="utf-8"))


def model_table() -> dict:
    """``{name: KvShape.as_dict()}`` for every bundled model, in name order (``dynlab models``)."""
    return {name: kv_shape_from_config(load_model_config(name), source=name).as_dict() for name in bundled_models()}
