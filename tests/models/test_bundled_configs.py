"""The bundled model configs (dynlab/data/models) hold their sources' values unchanged (NOTICE.md).

Files copied from aiconfigurator-core 0.12.0 are re-checked against the package's own copy when it is
installed (the ``aiconfigurator`` extra); the Gemma 3 files, which the package does not ship, are pinned
to the published values by hand (NOTICE.md names the fixtures they were checked against)."""
import importlib.util
import json
import re
from importlib import resources

import pytest

from dynlab.models import config as cfg

NOTICE = resources.files("dynlab").joinpath("data", "models", "NOTICE.md").read_text(encoding="utf-8")
AIC_ROWS = re.findall(r"^\| `([\w.-]+)\.json` \|[^|]*\| aiconfigurator-core 0\.12\.0[^|]*`model_configs/([^`]+)`", NOTICE, re.M)


def _subset(bundled, source, where=""):
    """Paths where ``bundled`` differs from ``source`` (every bundled field must be in the source, equal)."""
    if isinstance(bundled, dict) and isinstance(source, dict):
        return [d for k, v in bundled.items() for d in _subset(v, source.get(k, KeyError), f"{where}.{k}")]
    return [] if bundled == source else [where]


def test_the_notice_lists_the_aiconfigurator_files():
    names = {name for name, _ in AIC_ROWS}
    assert {"gpt-oss-20b", "gpt-oss-120b", "nemotron-h-56b", "qwen3-30b-a3b", "mixtral-8x7b"} <= names
    assert len(names) == 10


@pytest.mark.skipif(importlib.util.find_spec("aiconfigurator_core") is None, reason="aiconfigurator not installed")
@pytest.mark.parametrize("name, source", AIC_ROWS)
def test_bundled_fields_equal_aiconfigurator_copy(name, source):
    src = json.loads(resources.files("aiconfigurator_core").joinpath("model_configs", source).read_text())
    bundled = cfg.load_model_config(name)
    if "text_config" in src and "text_config" not in bundled:  # NOTICE: "(its text_config)"
        src = src["text_config"]
    assert _subset(bundled, src) == []


def test_gemma_3_published_values():
    # google/gemma-3-1b-it and gemma-3-27b-it config.json (NOTICE.md): the fields dynlab sizes from
    small = cfg.load_model_config("gemma-3-1b")
    assert {k: small[k] for k in ("model_type", "head_dim", "hidden_size", "intermediate_size", "num_attention_heads",
                                   "num_hidden_layers", "num_key_value_heads", "sliding_window",
                                   "sliding_window_pattern", "vocab_size", "max_position_embeddings")} == {
        "model_type": "gemma3_text", "head_dim": 256, "hidden_size": 1152, "intermediate_size": 6912,
        "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1, "sliding_window": 512,
        "sliding_window_pattern": 6, "vocab_size": 262_144, "max_position_embeddings": 32_768}
    large = cfg.load_model_config("gemma-3-27b")
    assert large["text_config"] == {
        "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
        "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16, "sliding_window": 1024}
    # what the Hub file leaves to transformers' Gemma3TextConfig
    text = cfg.text_config_of(large)
    assert (text["sliding_window_pattern"], text["vocab_size"], text["tie_word_embeddings"]) == (6, 262_208, True)
