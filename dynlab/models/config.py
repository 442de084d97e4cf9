"""Reading a Hugging Face ``config.json``: the field rules every part of the model catalogue shares.

One rule per kind of field (:func:`config_int` for integers, :func:`dtype_bytes_of` for dtypes), the
nested ``text_config`` of multimodal configs, the files (:func:`read_model_config`, a path or a
model directory) and the bundled configs (``dynlab/data/models/NAME.json``, see its ``NOTICE.md``).
Errors are one line, ``SOURCE: what is wrong``, naming the field.
"""
from __future__ import annotations

import json
import os
from importlib import resources
from typing import Mapping

from dynlab.errors import DynlabError, InputFileError
from dynlab.models.checks import count


class ModelConfigError(DynlabError):
    """A model ``config.json`` lacks a needed field, holds a bad value, or cannot be read.

    ``str()`` is one line: ``SOURCE: what is wrong``, naming the field.
    """


class UnknownModelError(DynlabError, LookupError):
    """A model name with no bundled config; ``str()`` lists the bundled names."""

    def __str__(self) -> str:  # LookupError would quote the message
        return self.args[0]


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



def present(config: Mapping, field: str) -> bool:
    return config.get(field) is not None


def config_int(config: Mapping, field: str, source: str, why: str = "", *, default: int | None = None,
               minimum: int = 1) -> int:
    """The integer ``field`` of a ``config.json`` mapping: the one rule for every integer field dynlab reads
    (the KV shape in :mod:`dynlab.models.kv`, the parameter count in :mod:`dynlab.models.params`).

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


FAMILY_DEFAULTS = {
    "gemma3_text": {"sliding_window_pattern": 6, "vocab_size": 262_208, "tie_word_embeddings": True},
}
"""Fields a published ``config.json`` may omit because transformers' config class supplies them
(``Gemma3TextConfig``: ``sliding_window_pattern=6``, ``vocab_size=262_208``,
``tie_word_embeddings=True``; google/gemma-3-27b-it's config lists neither of the first two)."""


def text_config_of(config: Mapping) -> Mapping:
    """The mapping a config's model fields are read from: ``config`` itself, or its ``text_config`` when
    ``config`` has no ``num_hidden_layers`` (multimodal configs nest the language model there), with the
    :data:`FAMILY_DEFAULTS` of its ``model_type`` under the fields it gives."""
    if not present(config, "num_hidden_layers") and isinstance(config.get("text_config"), Mapping):
        config = config["text_config"]
    defaults = FAMILY_DEFAULTS.get(config.get("model_type")) if isinstance(config, Mapping) else None
    if defaults and not present(config, "layer_types"):
        return {**defaults, **config}
    return config


def kv_heads_of(config: Mapping, source: str) -> int:
    """``num_key_value_heads``, falling back to ``num_attention_heads`` (MHA); :func:`config_int`'s rule."""
    if present(config, "num_key_value_heads"):
        return config_int(config, "num_key_value_heads", source)
    if present(config, "num_attention_heads"):
        return config_int(config, "num_attention_heads", source)
    raise ModelConfigError(f"{source}: missing field 'num_key_value_heads' (or 'num_attention_heads')")


def head_dim_of(config: Mapping, source: str) -> int:
    """``head_dim``, falling back to ``hidden_size / num_attention_heads`` (which must divide);
    :func:`config_int`'s rule. Raises :class:`ModelConfigError`."""
    if present(config, "head_dim"):
        return config_int(config, "head_dim", source)
    why = " (needed for the head size when 'head_dim' is absent)"
    hidden = config_int(config, "hidden_size", source, why)
    heads = config_int(config, "num_attention_heads", source, why)
    if hidden % heads:
        raise ModelConfigError(
            f"{source}: field 'hidden_size' ({hidden}) is not a multiple of 'num_attention_heads' ({heads}); "
            "the config needs 'head_dim'")
    return hidden // heads


GPT_OSS_DTYPE_BYTES = 2
"""gpt-oss's ``config.json`` names no ``torch_dtype``: its unquantised weights (attention, router,
embeddings) and activations are bfloat16 (OpenAI's gpt-oss model card: "MXFP4 for the MoE weights, BF16
for the rest")."""


def dtype_from_config(config: Mapping, outer: Mapping, dtype_bytes: int | None, source: str) -> int:
    """Bytes per element: ``dtype_bytes`` if given, else the ``torch_dtype`` (or ``dtype``) of ``config`` or
    ``outer`` (:func:`dtype_bytes_of`). Raises :class:`ModelConfigError` for an unknown or missing one."""
    if dtype_bytes is not None:
        dtype = count("dtype_bytes", dtype_bytes)
        if dtype == 0:
            raise ValueError("dtype_bytes must be positive, got 0")
        return dtype
    for where in (config, outer):
        field = next((f for f in ("torch_dtype", "dtype") if present(where, f)), None)
        if field is not None:
            raw = where[field]
            dtype = dtype_bytes_of(raw) if isinstance(raw, str) else None
            if dtype is None:
                raise ModelConfigError(f"{source}: field '{field}' has an unknown dtype {raw!r}")
            return dtype
    if config.get("model_type") == "gpt_oss":
        return GPT_OSS_DTYPE_BYTES
    raise ModelConfigError(f"{source}: missing field 'torch_dtype' (or 'dtype')")

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
