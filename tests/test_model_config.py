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
from hypothesis import given
from hypothesis import strategies as st

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
    path.write_text(json.dumps(_qwen3_8b(model_type="granitemoe", num_local_experts=32)))
    line = _one_line(_invoke(template, path), 1)
    assert line.startswith(f"{path}: mixture-of-experts layout of model_type 'granitemoe' is not supported"), line


# ---------------------------------------------------------------- one rule for integer fields

# Qwen3-8B's integer fields, each read by the parameter count and some by the KV shape too
QWEN3_8B_INTS = ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
                 "intermediate_size", "vocab_size"]


@pytest.mark.parametrize("template", READS_A_CONFIG, ids=_IDS)
def test_a_whole_float_is_refused_in_every_command(tmp_path, template):
    # "num_hidden_layers": 32.0 passed disagg --model-config and failed sim --timing --model; transformers
    # and vLLM use it as a Python int (range(num_hidden_layers)), so no command accepts it
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_qwen3_8b(num_hidden_layers=36.0)))
    line = _one_line(_invoke(template, path), 1)
    assert line == f"{path}: field 'num_hidden_layers' must be a positive integer, got 36.0", line


@pytest.mark.parametrize("field", QWEN3_8B_INTS)
@pytest.mark.parametrize("bad", [36.0, 0, -1, True, "36", [36]], ids=repr)
def test_both_readers_refuse_a_bad_integer_with_the_same_line(field, bad):
    cfg = _qwen3_8b(**{field: bad})
    message = f"x.json: field '{field}' must be a positive integer, got {bad!r}"
    with pytest.raises(cost.ModelConfigError) as by_spec:
        hw.model_spec_from_config(cfg, "x", source="x.json")
    assert str(by_spec.value) == message
    with pytest.raises(cost.ModelConfigError) as by_count:
        hw.param_count(cfg, "x.json")
    assert str(by_count.value) == message
    if field != "hidden_size" and field != "intermediate_size" and field != "vocab_size":
        # the KV shape reads the other four (num_attention_heads for the attention kind)
        with pytest.raises(cost.ModelConfigError) as by_kv:
            cost.kv_shape_from_config(cfg, source="x.json")
        assert str(by_kv.value) == message


def test_an_absent_field_is_named_missing_by_both_readers():
    cfg = _qwen3_8b(num_hidden_layers=None)
    for read in (lambda: hw.param_count(cfg, "x.json"), lambda: cost.kv_shape_from_config(cfg, source="x.json"),
                 lambda: hw.model_spec_from_config(cfg, "x", source="x.json")):
        with pytest.raises(cost.ModelConfigError, match=r"^x\.json: missing field 'num_hidden_layers'$"):
            read()


@pytest.mark.parametrize("field, bad", [("n_shared_experts", 1.0), ("first_k_dense_replace", "3"),
                                        ("moe_layer_freq", 0), ("q_lora_rank", 1536.0), ("kv_lora_rank", 0)])
def test_deepseek_counts_follow_the_same_rule(field, bad):
    # the optional MoE/MLA counts: a JSON integer too (first_k_dense_replace "3" was int("3")-ed, a float
    # q_lora_rank made a float parameter count, n_shared_experts 1.0 a float one)
    cfg = dict(cost.load_model_config("deepseek-v3"), **{field: bad})
    with pytest.raises(cost.ModelConfigError, match=rf"^x\.json: field '{field}' must be a (positive|non-negative) "
                                                    rf"integer, got {bad!r}$"):
        hw.model_spec_from_config(cfg, "x", source="x.json")


def test_whole_configs_still_read_as_before():
    # the bundled figures are pinned in tests/latency and tests/test_disagg.py; null optional counts stay
    # absent (DeepSeek-V2-Lite writes "q_lora_rank": null)
    ds = cost.load_model_config("deepseek-v3")
    assert hw.param_count(dict(ds, q_lora_rank=None)) == hw.param_count({k: v for k, v in ds.items()
                                                                         if k != "q_lora_rank"})
    assert hw.model_spec("qwen3-8b").params == hw.param_count(cost.load_model_config("qwen3-8b"))[0]


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats(allow_nan=False)
                           | st.text(max_size=4), lambda inner: st.lists(inner, max_size=2), max_leaves=3)
DEEPSEEK_INTS = ["num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                 "q_lora_rank", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
                 "moe_intermediate_size", "first_k_dense_replace", "moe_layer_freq"]


@given(name=st.sampled_from(["qwen3-8b", "deepseek-v3"]), data=st.data(), value=JSON_VALUES)
def test_whatever_a_field_holds_the_readers_agree_and_counts_stay_integers(name, data, value):
    # invariant: a config the served-model reader accepts, the KV reader accepts with the same bytes per
    # token, and every count it gives is an int (a float field never leaks into a figure); else one
    # ModelConfigError naming the file
    field = data.draw(st.sampled_from(QWEN3_8B_INTS if name == "qwen3-8b" else DEEPSEEK_INTS))
    cfg = dict(cost.load_model_config(name), **{field: value})
    try:
        spec = hw.model_spec_from_config(cfg, "x", source="x.json")
    except cost.ModelConfigError as exc:
        assert str(exc).startswith("x.json: ") and "\n" not in str(exc)
        return
    assert spec.kv_bytes_per_token == cost.kv_bytes_per_token_from_config(cfg, source="x.json")
    for figure in (spec.params, spec.active_params, spec.layers, spec.hidden_size, spec.heads, spec.kv_heads,
                   spec.head_dim, spec.v_head_dim, spec.kv_bytes_per_token):
        assert type(figure) is int and figure > 0


# ---------------------------------------------------------------- a model directory (a Hugging Face download)


def _download(tmp_path, name="Qwen3-8B") -> str:
    folder = tmp_path / name  # laid out as `huggingface-cli download Qwen/Qwen3-8B --local-dir Qwen3-8B` leaves it
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cost.load_model_config("qwen3-8b")))
    (folder / "tokenizer.json").write_text("{}")
    return str(folder)


@pytest.mark.parametrize("slash", ["", "/"])
def test_a_model_directory_reads_its_config_json(tmp_path, monkeypatch, slash):
    monkeypatch.chdir(tmp_path)
    _download(tmp_path)
    for given in ("Qwen3-8B" + slash, str(tmp_path / "Qwen3-8B") + slash):
        spec = hw.model_spec(given)
        # named after the folder, as Qwen3-8B/config.json is; the figures are the bundled qwen3-8b's
        assert spec.name == "Qwen3-8B" and spec.as_dict() == hw.model_spec("qwen3-8b").as_dict()


@pytest.mark.parametrize("slash", ["", "/"])
def test_every_command_takes_a_model_directory(tmp_path, monkeypatch, slash):
    monkeypatch.chdir(tmp_path)
    _download(tmp_path)
    by_file = CliRunner().invoke(main, ["disagg", "--tokens", "10", "--gbps", "1", "--model-config",
                                        "Qwen3-8B/config.json"])
    by_dir = CliRunner().invoke(main, ["disagg", "--tokens", "10", "--gbps", "1", "--model-config", "Qwen3-8B" + slash])
    assert by_dir.exit_code == 0 and by_dir.stdout == by_file.stdout, by_dir.output
    # 2 x 36 layers x 8 KV heads x 128 x 2 bytes (Qwen3-8B's config)
    assert json.loads(by_dir.stdout)["bytes_per_token"] == 2 * 36 * 8 * 128 * 2
    r = CliRunner().invoke(main, ["latency", "--model", "Qwen3-8B" + slash, "--format", "json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["model"] == "Qwen3-8B", r.output
    r = CliRunner().invoke(main, ["sim", "--timing", "--model", "Qwen3-8B" + slash,
                                  "--prefixes", "2", "--reps", "2"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("slash", ["", "/"])
@pytest.mark.parametrize("template", READS_A_CONFIG, ids=_IDS)
def test_a_directory_without_config_json_is_one_usage_error(tmp_path, monkeypatch, template, slash):
    # "hfmodel" and "hfmodel/" once said "unknown model" and "Is a directory": now one line naming what is missing
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hfmodel").mkdir()
    (tmp_path / "hfmodel" / "model.safetensors").write_text("")
    line = _one_line(_invoke(template, "hfmodel" + slash), 2)
    assert line == f"hfmodel{slash}: a directory with no config.json in it", line


def test_a_bad_config_in_a_directory_names_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(_qwen3_8b(torch_dtype=None)))
    for template in READS_A_CONFIG:
        line = _one_line(_invoke(template, "m"), 1)
        assert line == "m/config.json: missing field 'torch_dtype' (or 'dtype')", line


def test_a_bundled_name_wins_over_a_folder_of_that_name(tmp_path, monkeypatch):
    # --model qwen3-8b means the bundled figures wherever it runs; ./qwen3-8b reads the folder
    monkeypatch.chdir(tmp_path)
    (tmp_path / "qwen3-8b").mkdir()
    (tmp_path / "qwen3-8b" / "config.json").write_text(json.dumps(cost.load_model_config("qwen3-0.6b")))
    assert hw.model_spec("qwen3-8b").params == hw.param_count(cost.load_model_config("qwen3-8b"))[0]
    assert hw.model_spec("./qwen3-8b").params == hw.param_count(cost.load_model_config("qwen3-0.6b"))[0]


def test_a_missing_config_file_is_one_line_alike_in_every_command(tmp_path):
    # disagg's --model-config was checked by click ("Invalid value for '--model-config': Path ... does not
    # exist."), the other commands by dynlab's reader: now one reader says it for all, exit 2
    missing = str(tmp_path / "nosuch" / "config.json")
    lines = set()
    for args in (["sim", "--timing", "--model", missing], ["latency", "--model", missing],
                 ["disagg", "--tokens", "1", "--gbps", "1", "--model-config", missing]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2, (args, r.stderr)
        lines.add(r.stderr)
    assert lines == {f"Error: {missing}: No such file or directory\n"}
