"""Hugging Face model ids mapped to dynlab's bundled configs (``dynlab/data/models/NAME.json``), for files that name
their model as the benchmark tools do (``vllm bench serve``'s ``model_id``: ``meta-llama/Llama-3.1-8B-Instruct``).

:data:`HUB_IDS` lists, per bundled config, the Hub repository it was copied from (``dynlab/data/models/NOTICE.md``)
and only those instruction-tuned (``-Instruct``, ``-it``) releases of the same base model whose published
``config.json`` has the same architecture fields (layers, heads, KV heads, hidden and expert sizes, vocabulary,
context length, dtype; they differ in token ids only): a fine-tune of the same weights' shape. Quantised
repositories (``-FP8``, ``-AWQ``...), other sizes, and later releases with another context length
(``Qwen3-30B-A3B-Instruct-2507``) are not listed: their configs differ, so a file naming one needs ``--model``.
"""
from __future__ import annotations

from typing import Optional

#: a Hub repository's name (the id's last part), lower case -> the bundled config of its architecture
HUB_IDS = {
    "llama-3.1-8b": "llama-3.1-8b", "llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama-3.1-8b": "llama-3.1-8b", "meta-llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama-3-8b": "llama-3-8b", "meta-llama-3-8b-instruct": "llama-3-8b",
    "llama-3.1-70b": "llama-3.1-70b", "llama-3.1-70b-instruct": "llama-3.1-70b",
    "meta-llama-3.1-70b": "llama-3.1-70b", "meta-llama-3.1-70b-instruct": "llama-3.1-70b",
    "llama-4-scout-17b-16e-instruct": "llama-4-scout", "llama-4-maverick-17b-128e-instruct": "llama-4-maverick",
    "mixtral-8x7b-v0.1": "mixtral-8x7b", "mixtral-8x7b-instruct-v0.1": "mixtral-8x7b",
    "qwen3-0.6b": "qwen3-0.6b", "qwen3-8b": "qwen3-8b", "qwen3-32b": "qwen3-32b",
    "qwen3-30b-a3b": "qwen3-30b-a3b", "qwen3-235b-a22b": "qwen3-235b-a22b",
    "deepseek-v3": "deepseek-v3", "kimi-k2-instruct": "kimi-k2",
    "gpt-oss-20b": "gpt-oss-20b", "gpt-oss-120b": "gpt-oss-120b",
    "nemotron-h-56b-base-8k": "nemotron-h-56b",
    "gemma-3-1b-it": "gemma-3-1b", "gemma-3-27b-it": "gemma-3-27b",
}


def bundled_name(model_id: str) -> Optional[str]:
    """The bundled config's name for ``model_id`` (a Hub id ``OWNER/NAME``, a local path ending in the repository's
    name, or a bundled name), compared in lower case by its last part; ``None`` when no bundled config has its
    architecture (:data:`HUB_IDS`)."""
    from dynlab.models.config import bundled_models

    key = model_id.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lower()
    if key in bundled_models():
        return key
    return HUB_IDS.get(key)


__all__ = ["HUB_IDS", "bundled_name"]
