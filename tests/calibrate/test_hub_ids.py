"""Hugging Face ids as benchmark files name their model, mapped to dynlab's bundled configs: only the ids whose
config.json is the bundled one's architecture (the id the config was copied from, and its instruct/chat variants),
in any case; anything else still asks for --model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dynlab.calibrate.files import point_configs
from dynlab.calibrate.formats import MeasuredPoint
from dynlab.calibrate.fit import CalibrationError
from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.models.config import bundled_models
from dynlab.models.hub_ids import HUB_IDS, bundled_name

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "bench" / "vllm_bench_serve_detailed.json"


@pytest.mark.parametrize("hub_id, name", [
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("META-LLAMA/LLAMA-3.1-8B-INSTRUCT", "llama-3.1-8b"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
    ("/models/Llama-3.1-8B-Instruct", "llama-3.1-8b"),  # vllm's model_id is the --model it served: a local path
    ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
    ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b"),
    ("Qwen/Qwen3-8B", "qwen3-8b"),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
    ("google/gemma-3-27b-it", "gemma-3-27b"),
    ("llama-3.1-8b", "llama-3.1-8b"),  # a bundled name stays itself
])
def test_a_hub_id_of_a_bundled_architecture_maps_to_it(hub_id, name):
    assert bundled_name(hub_id) == name


@pytest.mark.parametrize("hub_id", [
    "meta-llama/Llama-3.2-3B-Instruct",  # another architecture
    "meta-llama/Llama-3.1-8B-Instruct-FP8",  # quantised: another config
    "Qwen/Qwen3-30B-A3B-Instruct-2507",  # a later release with another context length
    "neuralmagic/Meta-Llama-3.1-8B-Instruct-quantized.w4a16",
    "",
])
def test_other_ids_map_to_nothing(hub_id):
    assert bundled_name(hub_id) is None


def test_every_hub_id_maps_to_a_bundled_config_once():
    assert set(HUB_IDS.values()) <= set(bundled_models())
    assert all(key == key.lower() and "/" not in key for key in HUB_IDS)
    assert set(bundled_models()) <= set(HUB_IDS.values())  # each bundled config names its own Hub id


def test_calibrate_takes_a_files_hub_id_as_the_bundled_model():
    point = MeasuredPoint(source="f.json", model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100", max_concurrency=2)
    [config] = point_configs([point], SimConfig(timing=True))
    assert (config.model, config.gpu) == ("llama-3.1-8b", "h100")
    other = MeasuredPoint(source="g.json", model="meta-llama/Llama-3.2-3B-Instruct", gpu="H100", max_concurrency=2)
    with pytest.raises(CalibrationError, match="g.json: model 'meta-llama/Llama-3.2-3B-Instruct' is not one dynlab "
                                               "bundles: give --model"):
        point_configs([other], SimConfig(timing=True))


def test_the_shipped_vllm_sample_calibrates_without_model(tmp_path):
    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["calibrate", str(SAMPLE), "--output-format", "json", "--out", str(out)])
    assert r.exit_code == 0, r.output
    profile = json.loads(out.read_text())
    assert (profile["model"], profile["gpu"], profile["tp"]) == ("llama-3.1-8b", "h100", 2)
