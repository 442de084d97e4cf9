"""A GPU outside the catalogue as a JSON file (``--gpu my-gpu.json``, :func:`dynlab.models.gpus.gpu_from_file`)."""
import json

import pytest
from click.testing import CliRunner

from dynlab.cli import main
from dynlab.models.capacity import kv_blocks
from dynlab.models.gpus import GIB, gpu_spec

H20 = {"name": "h20", "memory_gb": 96, "bf16_tflops": 148, "fp8_tflops": 296, "hbm_gbps": 4000,
       "link": "nvlink", "link_gbps": 900, "source": "a test GPU"}


def _write(tmp_path, data, name="my-gpu.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_a_gpu_file_is_a_gpu_spec_and_sizes_the_pool(tmp_path):
    g = gpu_spec(_write(tmp_path, H20))
    assert (g.name, g.memory_gb, g.bf16_tflops, g.fp8_tflops, g.fp4_tflops, g.hbm_gbps, g.link, g.link_gbps) == \
        ("h20", 96.0, 148.0, 296.0, 0.0, 4000.0, "nvlink", 900.0)
    # llama-3.1-8b at 0.9 of 96 GiB: 96 x 0.9 x 2^30 = 92,771,293,593.6 B, less 16,060,522,496 B of weights
    # = 76,710,771,097.6 B; a 16-token block holds 131,072 B/token x 16 = 2,097,152 B -> 36,578.8 -> 36,578
    assert 96 * 0.9 * GIB - 16_060_522_496 == pytest.approx(76_710_771_097.6)
    assert kv_blocks("llama-3.1-8b", g, block=16, gpu_memory_utilization=0.9)[0] == 36578


def test_the_name_defaults_to_the_file_stem_and_the_optional_keys_to_the_catalogue_defaults(tmp_path):
    g = gpu_spec(_write(tmp_path, {"memory_gb": 48, "bf16_tflops": 100, "hbm_gbps": 1000, "source": "s"}, "rtx.json"))
    assert (g.name, g.fp8_tflops, g.fp4_tflops, g.link, g.link_gbps) == ("rtx", 0.0, 0.0, "pcie", 64.0)


@pytest.mark.parametrize("data, message", [
    ({**H20, "hbm": 3}, "unknown key 'hbm' (a GPU file's keys: name, memory_gb,"),
    ({k: v for k, v in H20.items() if k != "source"}, "missing key 'source'"),
    ({**H20, "memory_gb": -1}, "key 'memory_gb' must be a finite number > 0, got -1"),
    ({**H20, "fp8_tflops": -1}, "key 'fp8_tflops' must be a finite number >= 0, got -1"),
    ({**H20, "hbm_gbps": True}, "key 'hbm_gbps' must be a finite number > 0, got True"),
    ({**H20, "link": "infiniband"}, "key 'link' must be one of nvlink, pcie, infinity-fabric"),
    ({**H20, "source": ""}, "key 'source' must be a non-empty string"),
    ([1, 2], "a GPU file holds one JSON object"),
    ('{"memory_gb": 96,\n "bf16_tflops": }', ":2: not JSON"),
    ('{"memory_gb": 96, "memory_gb": 80, "bf16_tflops": 1, "hbm_gbps": 1, "source": "s"}',
     "key 'memory_gb' is given twice"),
])
def test_a_bad_gpu_file_is_refused_in_one_line_naming_the_file(tmp_path, data, message):
    path = _write(tmp_path, data)
    with pytest.raises(ValueError, match="^" + __import__("re").escape(path)) as exc:
        gpu_spec(path)
    assert message in str(exc.value)
    r = CliRunner().invoke(main, ["sim", "--trace", "mooncake-conversation", "--timing", "--gpu", path,
                                  "--duration", "5", "--quiet"])
    assert r.exit_code != 0 and r.exception is None or isinstance(r.exception, SystemExit)
    assert message in r.output and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_a_missing_gpu_file_is_a_usage_error(tmp_path):
    r = CliRunner().invoke(main, ["latency", "--gpu", str(tmp_path / "nope.json")])
    assert r.exit_code == 2 and "nope.json: No such file or directory" in r.output


def test_a_run_on_a_gpu_file_says_it_is_outside_the_rooflines_fit(tmp_path):
    r = CliRunner().invoke(main, ["latency", "--gpu", _write(tmp_path, H20)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    assert out["gpu"] == "h20" and "GPU h20" in out["latency_domain"]["roofline"]
