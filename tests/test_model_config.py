"""One reader of a Hugging Face ``config.json``: the same file gives the same answer, message and exit
code in every command that takes one (``sim``/``compare``/``sweep`` ``--timing --model``, ``latency
--model``, ``disagg --model-config``).

The rule (docs/commands.md's exit table): a config that cannot be opened is a usage error (exit 2,
tests/test_input_files.py); one that opens but holds a bad or missing field, or is not JSON, is a bad
input file (exit 1), one line ``Error: FILE: what is wrong``.
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dynlab.cli import main
from dynlab.disagg import cost
from dynlab.latency import hardware as hw

# every command and option that reads a config.json; {f} is the path
READS_A_CONFIG = [
    ["sim", "--timing", "--model", "{f}"],
    ["compare", "--modes", "kv,rr", "--timing", "--model", "{f}"],
    ["sweep", "--grid", "mode=kv,rr", "--timing", "--model", "{f}"],
    ["latency", "--model", "{f}"],
    ["disagg", "--tokens", "10", "--gbps", "1", "--model-config", "{f}"],
]
_IDS = lambda t: " ".join(t).replace("{f}", "F")  # noqa: E731


def _qwen3_8b(**change) -> dict:
    cfg = dict(cost.load_model_config("qwen3-8b"), **change)
    return {k: v for k, v in cfg.items() if v is not None}


def _invoke(template, path):
    return CliRunner().invoke(main, [a.replace("{f}", str(path)) for a in template])


def _one_line(r, code: int) -> str:
    assert r.exit_code == code, (r.exit_code, r.output)
    assert r.stdout == "" and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.output
    assert r.stderr.startswith("Error: "), r.stderr
    return r.stderr[len("Error: "):-1]


# (what is wrong, the file's text, the one line every command prints after "Error: FILE: ")
BAD_CONTENT = [
    ("no torch_dtype", json.dumps(_qwen3_8b(torch_dtype=None)), "missing field 'torch_dtype' (or 'dtype')"),
    ("not JSON", "{nope", "not a JSON file"),
    ("layers a string", json.dumps(_qwen3_8b(num_hidden_layers="36")), "field 'num_hidden_layers' must be"),
]


@pytest.mark.parametrize("what, text, message", BAD_CONTENT, ids=[b[0] for b in BAD_CONTENT])
@pytest.mark.parametrize("template", READS_A_CONFIG, ids=_IDS)
def test_a_bad_config_is_exit_1_naming_the_file_in_every_command(tmp_path, template, what, text, message):
    path = tmp_path / "config.json"
    path.write_text(text)
    line = _one_line(_invoke(template, path), 1)
    assert line.startswith(f"{path}: {message}"), line


def test_every_command_prints_the_same_line_for_the_same_bad_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_qwen3_8b(torch_dtype=None)))
    lines = {_IDS(t): _one_line(_invoke(t, path), 1) for t in READS_A_CONFIG}
    assert set(lines.values()) == {f"{path}: missing field 'torch_dtype' (or 'dtype')"}, lines


def test_the_library_raises_the_same_error_for_both_readers(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_qwen3_8b(torch_dtype=None)))
    with pytest.raises(cost.ModelConfigError) as by_spec:
        hw.model_spec(str(path))
    with pytest.raises(cost.ModelConfigError) as by_kv:
        cost.kv_bytes_per_token_from_config(cost.read_model_config(str(path)), source=str(path))
    assert str(by_spec.value) == str(by_kv.value)


@pytest.mark.parametrize("template", READS_A_CONFIG[:4], ids=_IDS)
def test_an_unsupported_layout_is_a_bad_config_too(tmp_path, template):
    # a mixture of experts dynlab cannot count parameters for: the file opened, its content is refused
    # (disagg reads only the KV shape, which this config gives, so it is not in the list)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_qwen3_8b(model_type="qwen3_moe", num_experts=128)))
    line = _one_line(_invoke(template, path), 1)
    assert line.startswith(f"{path}: mixture-of-experts layout of model_type 'qwen3_moe' is not supported"), line
