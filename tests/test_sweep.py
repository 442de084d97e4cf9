"""dynlab sweep: grid expansion, results equal to `dynlab sim`, serial == process pool, resume, errors, CSV, plots.

The Ray executor's tests are in test_sweep_ray.py (marker ``ray``).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dynlab import sweep as lib
from helpers import HANG, dynlab_command, interruptible, invoke, lines_of, ok, wait_for
from dynlab.cli.routing import SIM_OPTIONS
from dynlab.engine.config import SimConfig
from dynlab.engine.option_rules import SGLANG_FIELDS
from dynlab.sim.runner import run
from dynlab.errors import DynlabError

TRACE = "mooncake-conversation"
SAMPLES = os.path.join(os.path.dirname(__file__), "data", "traces")  # written for the tests (its README.md)
SHAREGPT = os.path.join(SAMPLES, "sharegpt.json")


def records(path) -> list[dict]:
    return [json.loads(line) for line in lines_of(Path(path).read_text())]


def assert_usage_error(result, *words):
    """Exit 2, one line on stderr, no traceback, nothing on stdout."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    for w in words:
        assert w in err[0], (w, err[0])


# ---------------------------------------------------------------- grid expansion


def test_grid_cells_are_the_cross_product_in_order_with_the_fixed_options():
    grid = lib.Grid((lib.Axis("mode", ("rr", "kv")), lib.Axis("workers", (2, 4, 8))),
                    fixed={"capacity": 64, "opt.x": "1"})
    cells = grid.cells()
    assert [(c["mode"], c["workers"]) for c in cells] == [
        ("rr", 2), ("rr", 4), ("rr", 8), ("kv", 2), ("kv", 4), ("kv", 8)]
    assert all(list(c) == ["mode", "workers", "capacity", "opt.x"] and c["capacity"] == 64 for c in cells)
    assert [a.name for a in grid.varied()] == ["mode", "workers"]
    config = lib.Grid((lib.Axis("event-loss", (0.5,)),), {"opt.temperature": "0.2"},
                      base={"mode": "kv-cost", "opts": {}}).config({"event-loss": 0.5, "opt.temperature": "0.2"})
    assert config == SimConfig(mode="kv-cost", event_loss=0.5, opts={"temperature": "0.2"})


def test_cell_key_ignores_key_order_and_survives_a_json_round_trip():
    a = {"mode": "kv", "capacity": None, "event-loss": 0.1}
    b = json.loads(json.dumps({"event-loss": 0.1, "capacity": None, "mode": "kv"}))
    assert lib.cell_key(a) == lib.cell_key(b)
    assert lib.cell_key(a) != lib.cell_key(dict(a, capacity=0))


def test_dry_run_lists_every_cell_and_writes_nothing(tmp_path):
    out = tmp_path / "r.jsonl"
    result = ok(invoke("sweep", "--grid", "mode=rr,kv", "--grid", "capacity=64,unbounded", "--grid", "event-loss=0,0.5",
                       "--seed", "7", "--out", out, "--dry-run"))
    cells = [json.loads(line) for line in lines_of(result.stdout)]
    assert len(cells) == 8
    assert cells[0] == {"mode": "rr", "capacity": 64, "event-loss": 0.0, "seed": 7}
    assert cells[-1] == {"mode": "kv", "capacity": None, "event-loss": 0.5, "seed": 7}
    assert len({lib.cell_key(c) for c in cells}) == 8
    assert "8 cells" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("entry", SIM_OPTIONS, ids=lambda e: e[0][0])
def test_every_sim_option_can_be_a_grid_option(entry, tmp_path):
    """Names, types and validation come from sim's options: each one is accepted under its flag name."""
    flags, field, ptype, default, _ = entry
    name = flags[0].lstrip("-")
    profile = tmp_path / "profile.json"  # sweep reads a profile before any cell runs, --dry-run too
    profile.write_text(json.dumps({"dynlab_calibration": 1, "model": "llama-3.1-8b", "gpu": "h100", "tp": 1,
                                   "latency_model": "linear", "latency_opts": {"beta0": 5.0}, "fitted": ["beta0"],
                                   "folds": 0, "cv_error_pct": {}, "points": []}))
    value = {"capacity": "64", "trace": TRACE, "trace_format": "mooncake", "trace_block": "512",
             "slo_ttft_ms": "100.0", "slo_tpot_ms": "50.0", "cpu_capacity": "100", "cpu_memory_gb": "1.5",
             "prefill_workers": "3", "decode_workers": "3", "split": "6:2",
             "rate": "5.0", "rate_scale": "2.0", "duration": "60.0", "workload": "spec.json",
             "tokenizer": os.path.join(SAMPLES, "tokenizer.json"), "spec_method": "eagle", "spec_tokens": "2",
             "spec_acceptance": "0.5", "spec_draws": "expected", "spec_model": "qwen3-0.6b", "spec_hash_rule": "drop",
             "concurrency": "4", "num_requests": "2", "latency_profile": str(profile),
             "slo_classes": "chat:ttft_ms=100", "max_loras": "2", "max_cpu_loras": "2", "max_running_requests": "8",
             "chunked_prefill_size": "256", "mem_fraction_static": "0.5",
             "price": "table", "spot_discount": "0.5"}.get(field, default)  # (a discount of 0 alone is refused)
    lora = ("max_cpu_loras", "max_lora_rank", "lora_disk_gbps")  # (with --max-loras: issue 42 item 4)
    spec = {"spec_method": ["--spec-tokens", "2"], "spec_tokens": ["--spec-method", "eagle"],
            "spec_model": ["--spec-method", "draft", "--spec-tokens", "2"],
            **{f: ["--spec-method", "eagle", "--spec-tokens", "2"] for f in ("spec_acceptance", "spec_draws",
                                                                             "spec_hash_rule")},
            # SGLang's options (issue 40): with --engine sglang
            **{f: ["--engine", "sglang"] for f in SGLANG_FIELDS}}
    # --timing: the timed engine's options (count-based-only --policy and --event-delay go without it);
    # --capacity and --trace: where --policy and --trace-format have an effect; a P/D fleet for its options
    pd = {"decode_router", "link_gbps", "link_latency_ms"}
    context = {"policy": ["--capacity", "8"], "trace_format": ["--trace", TRACE],
               "router_assign": ["--routers", "2"], "pcie_gbps": ["--cpu-capacity", "8"],
               "cpu_write": ["--cpu-capacity", "8"],
               "prefill_workers": ["--decode-workers", "1"], "decode_workers": ["--prefill-workers", "1"],
               "rate_scale": ["--trace", TRACE], "duration": ["--trace", TRACE], "tokenizer": ["--trace", SHAREGPT],
               "trace_block": ["--trace", TRACE],  # a trace that names its own blocks (a workload has none)
               "think_time_ms": ["--concurrency", "2"],
               "duration_repeat": ["--trace", TRACE, "--duration", "60"],
               **{f: ["--split", "1:1"] for f in pd}, **{f: ["--max-loras", "1"] for f in lora},
               **spec}.get(field, [])
    timing = field not in ("policy", "event_delay")
    result = ok(invoke("sweep", "--grid", f"{name}={value}", *(["--timing"] if timing else []), *context,
                       "--dry-run"))
    (cell,) = [json.loads(line) for line in lines_of(result.stdout)]
    expected = ptype.convert(value, None, None) if value is not None else None
    extra = {"policy": {"capacity": 8}, "trace_format": {"trace": TRACE}, "router_assign": {"routers": 2},
             "pcie_gbps": {"cpu-capacity": 8}, "cpu_write": {"cpu-capacity": 8},
             "prefill_workers": {"decode-workers": 1},
             "decode_workers": {"prefill-workers": 1}, "rate_scale": {"trace": TRACE}, "duration": {"trace": TRACE},
             "tokenizer": {"trace": SHAREGPT}, "trace_block": {"trace": TRACE},
             "duration_repeat": {"trace": TRACE, "duration": 60.0}, "think_time_ms": {"concurrency": 2},
             **{f: {"split": "1:1"} for f in pd}, **{f: {"max-loras": 1} for f in lora},
             **{f: {a.lstrip("-"): (int(b) if b.isdigit() else b) for a, b in zip(v[::2], v[1::2])}
                for f, v in spec.items()}}.get(field, {})
    assert cell == {name: expected, **({"timing": True} if timing else {}), **extra}
    grid = lib.Grid((lib.Axis(name, (expected,)),), fields={name: field, "engine": "engine_kind"})
    assert getattr(grid.config(cell), field) == expected


def test_sim_flags_and_aliases_and_underscores_are_grid_names_too():
    result = ok(invoke("sweep", "--grid", "timing=yes,no", "--grid", "modes=rr", "--grid", "event_loss=0.5",
                       "--dry-run"))
    cells = [json.loads(line) for line in lines_of(result.stdout)]
    assert cells == [{"timing": True, "mode": "rr", "event-loss": 0.5},
                     {"timing": False, "mode": "rr", "event-loss": 0.5}]


def test_grid_file_holds_the_same_grid(tmp_path):
    gf = tmp_path / "sweep.toml"
    gf.write_text('mode = ["kv-cost"]\nworkers = [2, 4]\ncapacity = [1024, "unbounded"]\nseed = 3\n'
                  '[opt]\ntemperature = [0, 0.5]\n')
    from_file = ok(invoke("sweep", "--grid-file", gf, "--dry-run")).stdout
    from_flags = ok(invoke("sweep", "--grid", "mode=kv-cost", "--grid", "workers=2,4",
                           "--grid", "capacity=1024,unbounded",
                           "--grid", "seed=3", "--grid", "opt.temperature=0,0.5", "--dry-run")).stdout
    assert from_file == from_flags
    assert len(lines_of(from_file)) == 8


# ---------------------------------------------------------------- results: exactly dynlab sim's


def _sim_line(*args) -> str:
    proc = subprocess.run(dynlab_command() + ["sim", "--quiet", *args], capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_sweep_records_match_dynlab_sim_output_byte_for_byte(tmp_path):
    """A few cells both ways: each line's `result` is byte for byte the line `dynlab sim` prints."""
    out = tmp_path / "r.jsonl"
    result = ok(invoke("sweep", "--trace", TRACE, "--workers", "3", "--timing", "--grid", "mode=kv-cost,power-of-two",
                       "--grid", "capacity=512,2048", "--grid", "time-scale=0.5", "--event-loss", "0.2",
                       "--seed", "5", "--executor", "local", "--out", out, "--quiet"))
    assert result.stdout == ""
    raw = lines_of(out.read_text())
    assert len(raw) == 4
    for line in raw:
        cell = json.loads(line)["cell"]
        args = []
        for name, value in cell.items():
            if value is True:
                args.append(f"--{name}")
            else:
                args += [f"--{name}", "unbounded" if value is None else str(value)]
        expected = _sim_line(*args)
        assert expected.endswith("\n") and expected.count("\n") == 1
        assert line == '{"cell": ' + json.dumps(cell) + ', "result": ' + expected[:-1] + "}"


def test_local_executor_equals_serial_byte_for_byte(tmp_path):
    common = ["--trace", TRACE, "--grid", "mode=rr,random,kv,power-of-two", "--grid", "workers=2,4",
              "--grid", "capacity=256,2048", "--event-loss", "0.1", "--quiet"]
    serial = ok(invoke("sweep", *common, "--executor", "serial")).stdout
    local = tmp_path / "local.jsonl"
    ok(invoke("sweep", *common, "--executor", "local", "--jobs", "2", "--out", local))
    assert sorted(lines_of(serial)) == sorted(lines_of(local.read_text()))
    assert len(lines_of(serial)) == 16
    # and each is run(config) with the trace streamed, as `dynlab sim` runs it
    first = json.loads(lines_of(serial)[0])
    cell = first["cell"]
    assert first["result"] == run(SimConfig(mode=cell["mode"], workers=cell["workers"], capacity=cell["capacity"],
                                            trace=TRACE, event_loss=0.1))


def test_seed_comes_from_the_options_not_the_order(tmp_path):
    """Random choices depend on the cell's seed only: reversing the grid's value order changes nothing."""
    a = ok(invoke("sweep", "--grid", "mode=random,power-of-two", "--grid", "seed=1,2,3", "--all-metrics", "--quiet",
                  "--executor", "serial")).stdout
    b = ok(invoke("sweep", "--grid", "seed=3,2,1", "--grid", "mode=power-of-two,random", "--all-metrics", "--quiet",
                  "--executor", "local", "--jobs", "2")).stdout
    norm = lambda text: sorted(lib.cell_key(json.loads(x)["cell"]) + json.dumps(json.loads(x)["result"])  # noqa: E731
                               for x in lines_of(text))
    assert norm(a) == norm(b)
    per_worker = {json.dumps(json.loads(x)["result"]["requests_per_worker"]) for x in lines_of(a)}
    assert len(per_worker) > 1  # the seeds do matter


# ---------------------------------------------------------------- resume


GRID = ["--trace", TRACE, "--grid", "mode=rr,random,kv,kv-events", "--grid", "capacity=256,1024,4096",
        "--grid", "workers=2,4", "--quiet"]


def test_resume_after_a_kill_finishes_the_rest_without_duplicates(tmp_path):
    out = tmp_path / "r.jsonl"
    total = 24
    cmd = dynlab_command() + ["sweep", *GRID, "--executor", "local", "--jobs", "2", "--out", str(out)]
    proc = subprocess.Popen(cmd,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: out.exists() and out.read_bytes().count(b"\n") >= 3, proc, "3 finished cells")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its pool: the group this test started
        proc.wait(timeout=HANG)
    before = out.read_bytes().count(b"\n")
    assert 3 <= before < total, f"the sweep was not interrupted ({before} of {total} cells)"
    result = ok(invoke("sweep", *GRID, "--executor", "local", "--jobs", "2", "--out", out, "--resume"))
    assert result.stdout == ""
    recs = records(out)
    keys = [lib.cell_key(r["cell"]) for r in recs]
    assert len(keys) == total and len(set(keys)) == total
    reference = ok(invoke("sweep", *GRID, "--executor", "serial")).stdout
    assert sorted(lines_of(out.read_text())) == sorted(lines_of(reference))
    # resuming a finished sweep runs nothing and writes nothing
    before_bytes = out.read_bytes()
    again = ok(invoke("sweep", *GRID, "--out", out, "--resume", "--dry-run"))
    assert again.stdout == "" and "0 to run" in again.stderr
    ok(invoke("sweep", *GRID, "--out", out, "--resume"))
    assert out.read_bytes() == before_bytes


def test_resume_drops_an_incomplete_last_line_and_keeps_foreign_records(tmp_path):
    out = tmp_path / "r.jsonl"
    grid = ["--grid", "mode=rr,kv", "--grid", "workers=2,3", "--all-metrics"]
    ok(invoke("sweep", *grid, "--executor", "serial", "--out", out, "--quiet"))
    full = lines_of(out.read_text())
    foreign = json.dumps({"cell": {"mode": "random", "workers": 9}, "result": {"hits": 1}})
    out.write_text("\n".join([foreign, full[0], full[1]]) + "\n" + full[2][:40])
    result = ok(invoke("sweep", *grid, "--executor", "serial", "--out", out, "--resume", "--dry-run"))
    assert len(lines_of(result.stdout)) == 2  # the cut line's cell is still to run
    result = ok(invoke("sweep", *grid, "--executor", "serial", "--out", out, "--resume"))
    assert "incomplete last line" in result.stderr and "1 record(s) are not cells of this grid" in result.stderr
    now = lines_of(out.read_text())
    assert now[0] == foreign
    assert sorted(now[1:]) == sorted(full)


def test_results_file_appends_each_cell_once(tmp_path):
    path = tmp_path / "r.jsonl"
    with lib.ResultsFile(str(path)) as rf:
        rf.append({"a": 1}, {"x": 1})
        rf.append({"a": 1}, {"x": 2})
        assert path.read_text() == '{"cell": {"a": 1}, "result": {"x": 1}}\n'  # flushed at once
        with pytest.raises(DynlabError, match="in use by another sweep"):
            lib.ResultsFile(str(path)).open()
    with lib.ResultsFile(str(path)) as rf:
        assert rf.done() == {lib.cell_key({"a": 1})}
    path.write_text('{"cell": {"a": 1}, "result": {"x": 1}}\nnot json\n')
    with pytest.raises(DynlabError, match=r"r.jsonl:2: not a sweep record"):
        lib.ResultsFile(str(path)).open()


def test_an_unreachable_ray_address_fails_at_once_in_one_line():
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(DynlabError, match=f"cannot reach the Ray cluster at 127.0.0.1:{port}"):
        lib.check_ray_address(f"127.0.0.1:{port}")
    with pytest.raises(DynlabError, match="expected HOST:PORT"):
        lib.check_ray_address("nonsense")


def test_an_existing_results_file_needs_resume(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('{"cell": {"mode": "rr"}, "result": {}}\n')
    assert_usage_error(invoke("sweep", "--grid", "mode=rr,kv", "--out", out), "--resume")
    assert out.read_text() == '{"cell": {"mode": "rr"}, "result": {}}\n'


# ---------------------------------------------------------------- errors: usage error, one line, nothing written


@pytest.mark.parametrize("args, words", [
    (["--grid", "nosuch=1,2"], ["unknown option 'nosuch'", "event-loss", "opt.NAME"]),
    (["--grid", "workers="], ["empty value list"]),
    (["--grid", "workers=2,,4"], ["empty value"]),
    (["--grid", "workers"], ["NAME=V1,V2"]),
    (["--grid", "workers=2,0"], ["--grid workers", "0"]),
    (["--grid", "capacity=64,-1"], ["--grid capacity"]),
    (["--grid", "event-loss=0.5,1.5"], ["--grid event-loss"]),
    (["--grid", "mode=kv,nosuch"], ["unknown strategy 'nosuch'"]),
    # a registry name in the grid is checked though the option's own default is not looked up at parse time
    (["--grid", "policy=lru,nope"], ["unknown eviction policy 'nope'"]),
    (["--grid", "latency-model=roofline,nope", "--timing"], ["unknown latency model 'nope'"]),
    (["--grid", "publish=yes,maybe"], ["--grid publish"]),
    (["--grid", "mode=kv-cost,rr", "--grid", "opt.temperature=0.5"], ["strategy 'rr' has no option 'temperature'"]),
    (["--grid", "mode=kv-cost", "--grid", "opt.temperature=0.5,warm"], ["temperature", "float"]),
    (["--grid", "workers=2,2"], ["repeats"]),
    (["--grid", "time-scale=0.5,1"], ["--time-scale has no effect without --timing"]),
    (["--grid", "timing=yes,no", "--rate", "8"], ['"timing": false', "--rate has no effect without --timing"]),
    (["--grid", "capacity=unbounded,none"], ["repeats"]),
    (["--grid", "workers=2", "--grid", "workers=4"], ["given twice"]),
    (["--grid", "workers=2,4", "--workers", "3"], ["both in the grid"]),
    (["--grid", "opt.temperature=1", "--opt", "temperature=2", "--mode", "kv-cost"], ["both in the grid"]),
    ([], ["--grid"]),
    (["--grid", "workers=2", "--metric", "hits"], ["--metric needs --plot"]),
    (["--grid", "workers=2", "--ray-address", "127.0.0.1:1"], ["--executor ray"]),
    (["--grid", "workers=2,4", "--grid", "capacity=8,16", "--grid", "event-delay=0,1", "--plot", "{tmp}/p.png"],
     ["one or two varied numeric options"]),
])
def test_grid_errors_are_one_line_usage_errors_and_nothing_is_written(tmp_path, args, words):
    out, csv_path = tmp_path / "r.jsonl", tmp_path / "r.csv"
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = invoke("sweep", *args, "--out", out, "--csv", csv_path)
    assert_usage_error(result, *words)
    assert list(tmp_path.iterdir()) == []


def test_resume_needs_out():
    assert_usage_error(invoke("sweep", "--grid", "workers=2", "--resume"), "--resume needs --out")


@pytest.mark.parametrize("content, words", [
    (None, ["cannot read grid file"]),
    ("workers = [2,", ["not valid TOML"]),
    ("workers = []", ["empty value list"]),
    ("workers = [[2]]", ["nested"]),
    ("[workers]\nx = 1", ["is a table"]),
    ("workers = [2, 0]", ["g.toml: workers: 0 is not in the range"]),  # the file named, not --grid
    ("bogus = [1]", ["unknown option 'bogus'"]),
])
def test_grid_file_errors_are_one_line_usage_errors(tmp_path, content, words):
    gf = tmp_path / "g.toml"
    if content is not None:
        gf.write_text(content)
    out = tmp_path / "out" / "r.jsonl"
    out.parent.mkdir()
    assert_usage_error(invoke("sweep", "--grid-file", gf, "--out", out), *words)
    assert list(out.parent.iterdir()) == []


def test_a_directory_as_grid_file_is_a_usage_error(tmp_path):
    assert_usage_error(invoke("sweep", "--grid-file", tmp_path), "is a directory")


def test_a_missing_trace_fails_before_anything_is_written(tmp_path):
    out = tmp_path / "r.jsonl"
    result = invoke("sweep", "--grid", "trace=mooncake-conversation,nosuch.jsonl", "--out", out)
    assert result.exit_code == 2 and "nosuch.jsonl" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_missing_ray_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    out = tmp_path / "r.jsonl"
    result = invoke("sweep", "--grid", "workers=2,3", "--executor", "ray", "--out", out)
    assert result.exit_code == 1, (result.stderr, result.exception)
    assert result.stderr.strip() == "Error: " + lib.RAY_EXTRA_MESSAGE
    assert "dynlab[ray]" in result.stderr
    assert not out.exists()


# ---------------------------------------------------------------- CSV and plots


def test_csv_flattens_the_main_metrics(tmp_path):
    import csv

    path = tmp_path / "r.csv"
    result = ok(invoke("sweep", "--trace", TRACE, "--timing", "--grid", "mode=rr,kv-cost",
                       "--grid", "capacity=512,2048",
                       "--csv", path, "--quiet", "--executor", "serial"))
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 4
    header = list(rows[0])
    assert header[:4] == ["mode", "capacity", "trace", "timing"]
    assert header.count("mode") == 1
    for col in ("block_hit_rate", "ttft_ms.p99", "queue_wait_ms.p50", "load_imbalance", "requests_per_worker"):
        assert col in header
    stdout = [json.loads(x) for x in lines_of(result.stdout)]
    by_cell = {(r["cell"]["mode"], r["cell"]["capacity"]): r["result"] for r in stdout}
    for row in rows:
        res = by_cell[(row["mode"], None if row["capacity"] == "" else int(row["capacity"]))]
        assert float(row["ttft_ms.p99"]) == res["ttft_ms"]["p99"]
        assert float(row["block_hit_rate"]) == res["block_hit_rate"]
        assert json.loads(row["requests_per_worker"]) == res["requests_per_worker"]
        assert row["timing"] == "true"
    assert lib.flatten({"a": {"b": 1, "c": {"d": None}}, "e": [1]}) == {"a.b": 1, "a.c.d": None, "e": [1]}


def test_plot_a_line_per_strategy_and_a_heatmap_per_strategy(tmp_path):
    line, heat = tmp_path / "line.png", tmp_path / "heat.png"
    ok(invoke("sweep", "--trace", TRACE, "--grid", "mode=rr,kv", "--grid", "capacity=256,1024,unbounded",
              "--plot", line, "--metric", "load_imbalance", "--quiet"))
    ok(invoke("sweep", "--trace", TRACE, "--timing", "--grid", "mode=rr,kv,least-loaded",
              "--grid", "capacity=256,2048",
              "--grid", "workers=2,4", "--plot", heat, "--metric", "ttft_ms.p99", "--quiet"))
    for png in (line, heat):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    grid = lib.Grid((lib.Axis("mode", ("rr", "kv")), lib.Axis("capacity", (256, None)),
                     lib.Axis("policy", ("lru", "fifo"))))
    numeric, series = lib.plot_layout(grid)
    assert [a.name for a in numeric] == ["capacity"] and [a.name for a in series] == ["mode", "policy"]


def test_plot_of_an_absent_metric_lists_the_ones_there(tmp_path):
    png = tmp_path / "p.png"
    # refused before any cell runs (a two-request probe of each cell says what it reports): nothing written
    result = invoke("sweep", "--grid", "mode=rr,kv", "--grid", "workers=2,3", "--plot", png, "--metric", "nosuch",
                    "--out", tmp_path / "r.jsonl", "--quiet")
    assert result.exit_code == 2 and "hit_rate" in result.stderr and "Traceback" not in result.stderr
    assert not png.exists() and not (tmp_path / "r.jsonl").exists()
    # a timed metric without --timing is refused before any cell runs
    result = invoke("sweep", "--grid", "mode=rr,kv", "--grid", "workers=2,3", "--plot", png, "--metric", "ttft_ms.p99",
                    "--out", tmp_path / "r.jsonl", "--quiet")
    assert result.exit_code == 2 and "needs --timing" in result.stderr
    assert not png.exists() and not (tmp_path / "r.jsonl").exists()
    assert lib.metric_value({"a": {"b": 2}}, "a.b") == 2.0 and lib.metric_value({"a": True}, "a") is None


def test_grid_file_values_are_checked_as_written(tmp_path):
    toml = tmp_path / "g.toml"
    toml.write_text("workers = [1.5]\n")
    r = invoke("sweep", "--grid-file", toml, "--dry-run")
    assert r.exit_code == 2 and "1.5" in r.stderr  # no silent truncation to 1
    toml.write_bytes(b"\xff\xfe")
    r = invoke("sweep", "--grid-file", toml, "--dry-run")
    assert r.exit_code == 2 and "not valid TOML" in r.stderr and "Traceback" not in r.stderr


def test_strategy_option_values_are_one_cell_whatever_the_spelling():
    r = invoke("sweep", "--grid", "mode=kv-cost", "--grid", "opt.temperature=0,0.0", "--dry-run")
    assert r.exit_code == 2 and "repeats" in r.stderr
    r = ok(invoke("sweep", "--grid", "mode=kv-cost", "--grid", "opt.temperature=0.50,1", "--dry-run"))
    assert [json.loads(x)["opt.temperature"] for x in lines_of(r.stdout)] == ["0.5", "1.0"]


def test_out_csv_and_plot_must_differ(tmp_path):
    out = tmp_path / "r.jsonl"
    r = invoke("sweep", "--grid", "mode=rr,kv", "--out", out, "--csv", out)
    assert r.exit_code == 2 and "give each output its own file" in r.stderr and not out.exists()


def test_a_failing_cell_is_named(tmp_path):
    from dynlab import hookimpl, plugins
    from dynlab.routing.strategy import Strategy

    class Fails(Strategy):
        """Fails on more than two workers."""

        name = "test-fails-wide"

        def route(self, request, fleet):
            if fleet.workers > 2:
                raise RuntimeError("too wide")
            return 0

    class Plugin:
        @hookimpl
        def dynlab_register_strategies(self, register):
            register(Fails)

    pm = plugins.get_plugin_manager()
    pm.register(Plugin(), name="test-fails-plugin")
    try:
        r = invoke("sweep", "--grid", "mode=test-fails-wide", "--grid", "workers=2,3", "--executor", "serial",
                   "--quiet")
    finally:
        pm.unregister(name="test-fails-plugin")
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    assert '"workers": 3' in r.stderr and "too wide" in r.stderr and r.stderr.count("\n") == 1


def test_ctrl_c_stops_a_pool_sweep_promptly(tmp_path):
    """SIGINT to the whole process group (what Ctrl-C does) while the pool runs cells: exit 130, no hang.

    The signal is sent once the first cell's line is in --out (the pool is running), not after a fixed
    time: on a loaded machine a fixed sleep can end while the command is still starting.
    """
    out = tmp_path / "r.jsonl"
    # 64 cells: far more than can finish between the first line and the signal
    cmd = dynlab_command() + ["sweep", "--trace", TRACE, "--grid", "mode=rr,kv,kv-events,random",
                              "--grid", "workers=2,3,4,5", "--grid", "capacity=256,512,1024,2048",
                              "--executor", "local", "--jobs", "2", "--out", str(out), "--quiet"]
    for _ in range(3):
        proc = interruptible(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_for(lambda: out.exists() and b"\n" in out.read_bytes(), proc, "the first finished cell")
        os.killpg(proc.pid, signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=HANG)  # a hang, not a speed
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail("the sweep hung after Ctrl-C")
        finished = out.read_bytes().count(b"\n")
        assert proc.returncode == (0 if finished == 64 else 130), (proc.returncode, finished, err)
        assert b"Traceback" not in err
        if out.exists():
            out.unlink()


def _unwritable_dirs(tmp_path):
    """Directories this process cannot create files in: a read-only one (not for root, whom
    permissions do not stop) and /proc (no regular files can be made there, even by root)."""
    out = []
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o500)
        out.append(str(d))
    if os.path.isdir("/proc"):
        out.append("/proc")
    if not out:
        pytest.skip("no unwritable directory on this machine")
    return out


@pytest.mark.parametrize("flag, name", [("--csv", "r.csv"), ("--plot", "r.png"), ("--out", "r.jsonl")])
def test_an_unwritable_output_fails_before_the_first_cell(tmp_path, flag, name, monkeypatch):
    import dynlab.cli.sweep_cells as cmd  # where the cells run (execute)

    def no_cells(*args, **kwargs):
        raise AssertionError("a cell ran")

    monkeypatch.setattr(cmd, "execute", no_cells)
    for directory in _unwritable_dirs(tmp_path):
        path = os.path.join(directory, name)
        r = invoke("sweep", "--grid", "workers=1,2", "--executor", "serial", flag, path)
        assert r.exit_code == 2, r.output
        (line,) = r.stderr.splitlines()
        assert line.startswith("Error: ") and flag in line and "cannot write" in line
