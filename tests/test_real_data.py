"""The real-measurement CSVs under benchmarks/data/real/: one shape, sane numbers, a README section each."""
from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import pytest

REAL = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "real"

COLUMNS = [
    "experiment", "model", "gpu", "tp", "ep", "engine", "version",
    "max_num_seqs", "max_num_batched_tokens", "max_concurrency", "request_rate", "arrival",
    "num_prompts", "random_input_len", "random_output_len", "random_range_ratio",
    "input_len_p50", "output_len_p50",
    "median_ttft_ms", "mean_ttft_ms", "p99_ttft_ms",
    "median_tpot_ms", "mean_tpot_ms", "p99_tpot_ms", "median_itl_ms",
    "median_e2el_ms", "mean_e2el_ms", "p99_e2el_ms",
    "total_token_throughput", "output_throughput", "per_gpu",
]
TEXT = {"experiment", "model", "gpu", "engine", "version", "per_gpu", "arrival"}
NUMERIC = [c for c in COLUMNS if c not in TEXT]
INTEGER = {"tp", "ep", "max_num_seqs", "max_num_batched_tokens", "max_concurrency", "num_prompts"}

CSVS = sorted(REAL.glob("*.csv"))


def _rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        rows = [dict(zip(header, r)) for r in reader]
        fh.seek(0)
        lengths = [len(r) for r in csv.reader(fh)]
    assert set(lengths) == {len(header)}, f"{path.name}: ragged rows"
    return header, rows


def test_there_is_real_data():
    assert (REAL / "blis_h100.csv") in CSVS
    assert (REAL / "inferencemax_gptoss.csv") in CSVS
    assert (REAL / "inferencemax_gptoss_v0130.csv") in CSVS
    assert (REAL / "inferencemax_dsr1_sglang.csv") in CSVS


#: rows per file: BLIS's 21 stages; InferenceMAX's 43 H100 and 51 H200 points, in run 20218553330 (vLLM
#: v0.11.2) and in run 20667906037 (v0.13.0); run 20613446912's 15 SGLang H200 points of DeepSeek-R1-0528
ROW_COUNTS = {"blis_h100.csv": 21, "inferencemax_gptoss.csv": 94, "inferencemax_gptoss_v0130.csv": 94,
              "inferencemax_dsr1_sglang.csv": 15}


def test_every_csv_is_pinned_with_its_row_count():
    assert {p.name for p in CSVS} == set(ROW_COUNTS)
    for name, count in ROW_COUNTS.items():
        assert len(_rows(REAL / name)[1]) == count, name


@pytest.mark.parametrize("path", CSVS, ids=lambda p: p.name)
def test_header_is_the_column_list(path):
    header, rows = _rows(path)
    assert header == COLUMNS
    assert rows, f"{path.name} has no rows"


@pytest.mark.parametrize("path", CSVS, ids=lambda p: p.name)
def test_rows(path):
    _, rows = _rows(path)
    seen = set()
    for row in rows:
        where = f"{path.name}:{row['experiment']}"
        assert row["experiment"] and row["experiment"] not in seen, where
        seen.add(row["experiment"])
        for col in ("model", "gpu", "tp"):
            assert row[col].strip(), f"{where}: empty {col}"
        assert any(row[c] for c in ("median_ttft_ms", "median_tpot_ms", "median_e2el_ms")), where
        for col in NUMERIC:
            if row[col] == "":
                continue
            value = float(row[col])
            assert math.isfinite(value) and value > 0, f"{where}: {col}={row[col]!r}"
            if col in INTEGER:
                assert value == int(value), f"{where}: {col}={row[col]!r} is not an integer"
        if row["random_range_ratio"]:
            assert float(row["random_range_ratio"]) <= 1, where
        assert (row["max_concurrency"] != "") != (row["request_rate"] != ""), (
            f"{where}: exactly one of max_concurrency / request_rate"
        )
        assert row["per_gpu"] in ("false", "true"), where
        assert row["arrival"] in ("", "poisson", "constant"), where
        assert row["engine"] in ("vllm", "sglang", "trtllm"), where
        if row["median_ttft_ms"] and row["median_e2el_ms"]:
            assert float(row["median_ttft_ms"]) < float(row["median_e2el_ms"]), where


@pytest.mark.parametrize("path", CSVS, ids=lambda p: p.name)
def test_every_csv_has_a_readme_section(path):
    readme = (REAL / "README.md").read_text()
    headings = [line for line in readme.splitlines() if line.startswith("#")]
    assert any(path.name in h for h in headings), f"README.md has no section heading naming {path.name}"


@pytest.mark.parametrize("path", CSVS, ids=lambda p: p.name)
def test_length_percentiles_belong_to_rows_and_grow(path):
    side = path.with_name(path.stem + "_lengths.json")
    if not side.exists():
        return

    _, rows = _rows(path)
    tables = json.loads(side.read_text())
    assert set(tables) == {r["experiment"] for r in rows}
    for name, table in tables.items():
        assert set(table) == {"prompt_len", "output_len"}, name
        for dist in table.values():
            ps = sorted((float(p), v) for p, v in dist.items())
            assert ps[0][0] == 0 and ps[-1][0] == 100, name
            assert [v for _, v in ps] == sorted(v for _, v in ps), name


MODELS = sorted((REAL / "models").glob("*/config.json"))


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.parent.name)
def test_each_model_config_loads_as_dynlab_reads_it(path):
    from dynlab.models.spec import model_spec

    spec = model_spec(str(path))
    # Llama-2's parameter counts (7B, 70B; CodeLlama 34B) within 3 % from the architecture alone
    billions = {"llama-2-7b": 6.74, "llama-2-70b": 68.98, "codellama-34b": 33.74}[path.parent.name]
    assert spec.params / 1e9 == pytest.approx(billions, rel=0.03)
    assert spec.kv_bytes_per_token == 2 * spec.num_layers * spec.kv_heads * spec.head_dim * 2


def _inferencemax() -> dict[str, dict[str, str]]:
    return {r["experiment"]: r for name in ("inferencemax_gptoss.csv", "inferencemax_gptoss_v0130.csv")
            for r in _rows(REAL / name)[1]}


def test_inferencemax_v0130_is_the_same_sweep_on_another_vllm():
    # the same 94 (GPU, tp, isl, osl, concurrency) points, vLLM 0.13.0's; one row by hand: run 20667906037's
    # H100 tp2 1k/1k conc4 median TTFT 0.051322 s -> 51.322 ms
    rows = _inferencemax()
    old = {k.split("/", 1)[1] for k, r in rows.items() if r["version"] == "0.11.2"}
    new = {k.split("/", 1)[1] for k, r in rows.items() if r["version"] == "0.13.0"}
    assert old == new and len(new) == 94
    row = rows["run_20667906037/h100-tp2-isl1024-osl1024-conc4"]
    assert float(row["median_ttft_ms"]) == pytest.approx(51.322, abs=0.001)
    assert (row["max_num_seqs"], row["max_num_batched_tokens"], row["num_prompts"]) == ("4", "8192", "40")


def test_inferencemax_one_row_checked_by_hand():
    # run 20218553330's object {"hw": "h100", "conc": 4, "tp": 2, "isl": 1024, "osl": 1024, "median_ttft":
    # 0.0532..., "tput_per_gpu": 744.66...}: seconds there, ms here; the server's max-num-seqs is the concurrency
    row = _inferencemax()["run_20218553330/h100-tp2-isl1024-osl1024-conc4"]
    assert (row["gpu"], row["tp"], row["ep"], row["engine"], row["version"]) == ("h100", "2", "1", "vllm", "0.11.2")
    assert (row["max_num_seqs"], row["max_concurrency"], row["request_rate"]) == ("4", "4", "")
    assert row["max_num_batched_tokens"] == "8192"
    assert row["num_prompts"] == "40"  # --num-prompts $(( CONC * 10 ))
    assert float(row["median_ttft_ms"]) == pytest.approx(53.21, abs=0.01)
    assert float(row["total_token_throughput"]) == pytest.approx(744.66, abs=0.01)
    # lengths uniform on [int(0.8 x 1024), 1024]: mean 921.6, half-width 102.4 = 921.6 / 9
    mean, r = float(row["random_input_len"]), float(row["random_range_ratio"])
    assert mean == pytest.approx(921.6) and mean * (1 - r) == pytest.approx(819.2, abs=0.01)
    assert mean * (1 + r) == pytest.approx(1024.0, abs=0.01)
    # the median request: TTFT + TPOT x (921.6 - 1) = 53.2 + 5.222 x 920.6 = 4,860 ms against 4,826 measured
    predicted = float(row["median_ttft_ms"]) + float(row["median_tpot_ms"]) * (mean - 1)
    assert predicted == pytest.approx(float(row["median_e2el_ms"]), rel=0.01)
    # 4 users, each 921.6 + 921.6 tokens per 4.826 s, over 2 GPUs: 4 x 1843.2 / 4.826 / 2 = 764 tok/s/GPU,
    # against 744.66 measured (the run's ramp and tail: the last requests run with fewer than 4 beside them)
    users = 4 * 2 * mean / (float(row["median_e2el_ms"]) / 1000.0) / 2
    assert users == pytest.approx(float(row["total_token_throughput"]), rel=0.04)


@pytest.mark.parametrize("name", sorted(_inferencemax()))
def test_inferencemax_rows_hold_together(name):
    # every point: a closed loop at the server's own max_num_seqs, 10 requests per user, the median request's
    # E2E within 6 % of TTFT + TPOT x (0.9 osl - 1), and p50 <= p99 for TTFT, TPOT and E2E
    row = _inferencemax()[name]
    conc = int(row["max_concurrency"])
    assert int(row["max_num_seqs"]) == conc and int(row["num_prompts"]) == 10 * conc
    osl = float(row["random_output_len"])
    e2e = float(row["median_ttft_ms"]) + float(row["median_tpot_ms"]) * (osl - 1)
    assert e2e == pytest.approx(float(row["median_e2el_ms"]), rel=0.06)
    for metric in ("ttft", "tpot", "e2el"):
        assert float(row[f"median_{metric}_ms"]) <= float(row[f"p99_{metric}_ms"]), metric
    assert row["per_gpu"] == "true" and float(row["output_throughput"]) < float(row["total_token_throughput"])


def _fidelity_real():
    import sys

    sys.path.insert(0, str(REAL.parent.parent))
    import fidelity_real

    return fidelity_real


def test_inferencemax_replays_as_its_client_drove_it():
    # read as fidelity_real reads it: a closed loop of 4 users (vllm bench's --max-concurrency at rate inf),
    # the server's max_num_seqs 4 and max_num_batched_tokens 8192, 40 requests whose lengths fall on
    # InferenceMAX's [int(0.8 x 1024), 1024] = [819, 1024] (dynlab draws [int(922 x 8/9), int(922 x 10/9)])
    from dynlab.calibrate.replay import arrival, lengths
    from dynlab.engine.config import SimConfig

    fr = _fidelity_real()
    points = {p.source: p for p in fr.read_rows(str(REAL / "inferencemax_gptoss.csv"))}
    point = points["run_20218553330/h100-tp2-isl1024-osl1024-conc4"]
    assert fr.SERVER[point.source] == {"max_num_seqs": 4, "max_num_batched_tokens": 8192}
    assert fr.model_for(point.model) == "gpt-oss-120b" and point.per_gpu
    config = arrival(point, SimConfig(timing=True), 40)
    assert (config.concurrency, config.rate) == (4, None)
    pairs = lengths(point)
    assert len(pairs) == 40
    assert all(819 <= n_in <= 1024 and 819 <= n_out <= 1024 for n_in, n_out in pairs)
    long_out = lengths(points["run_20218553330/h200-tp8-isl1024-osl8192-conc4"])
    assert all(6553 <= n_out <= 8192 for _, n_out in long_out)  # int(0.8 x 8192) = 6553


def test_fidelity_real_files_choose_csvs_and_refuse_unknown_names():
    fr = _fidelity_real()
    assert fr.chosen("blis_h100.csv") == ["blis_h100.csv"]
    assert fr.chosen("all") == [p.name for p in CSVS]
    assert fr.chosen("inferencemax_gptoss.csv,blis_h100.csv") == ["blis_h100.csv", "inferencemax_gptoss.csv"]
    with pytest.raises(SystemExit) as exc:
        fr.chosen("blis_h100.csv,nope.csv")
    assert "no nope.csv" in str(exc.value) and "inferencemax_gptoss.csv" in str(exc.value)


def test_a_fit_applies_run_settings_as_fields_and_the_rest_as_latency_options():
    # calibrate's opts {"mfu": 0.7, "request_overhead_ms": 3.0}: the front end is a SimConfig field
    # (dynlab.calibrate.fit.RUN_PARAMS), mfu a roofline option; the options already set stay
    from dynlab.engine.config import SimConfig

    fr = _fidelity_real()
    base = SimConfig(timing=True, latency_model="roofline", latency_opts={"mfu": "0.5", "mbu": "0.8"})
    fitted = fr.fitted_config(base, {"mfu": 0.7, "request_overhead_ms": 3.0})
    assert fitted.request_overhead_ms == 3.0
    assert fitted.latency_opts == {"mfu": "0.7", "mbu": "0.8"}
    assert base.latency_opts == {"mfu": "0.5", "mbu": "0.8"}


def _saved_run(tmp_path, name, rows):
    """A ``--json`` file as fidelity_real.main writes it: latency model -> rows, each with its file."""
    path = tmp_path / name
    path.write_text(json.dumps({"roofline": [dict(r, file="x.csv") for r in rows]}))
    return str(path)


def _row(source, group, ttft_default, ttft_cv):
    return {"source": source, "group": group, "uncalibrated": {"median_ttft_ms": ttft_default},
            "cv": {"median_ttft_ms": ttft_cv}, "fitted": {}}


def test_from_json_merges_groups_run_apart_into_one_table(tmp_path, monkeypatch, capsys):
    # two groups scored by two processes (--only), merged: the medians are over all four rows.
    # defaults |-30|, |10|, |20|, |-50| -> sorted 10, 20, 30, 50: median (20 + 30) / 2 = 25.0;
    # held out |4|, |-2|, |8|, |-6| -> 2, 4, 6, 8: median (4 + 6) / 2 = 5.0 (neither file alone gives these:
    # the first alone 20.0 and 3.0, the second 35.0 and 7.0)
    fr = _fidelity_real()
    a = _saved_run(tmp_path, "a.json", [_row("g1-c4", "g1", -30.0, 4.0), _row("g1-c8", "g1", 10.0, -2.0)])
    b = _saved_run(tmp_path, "b.json", [_row("g2-c4", "g2", 20.0, 8.0), _row("g2-c8", "g2", -50.0, -6.0)])
    merged = fr.merged([a, b])
    assert [r["source"] for r in merged["x.csv"]["roofline"]] == ["g1-c4", "g1-c8", "g2-c4", "g2-c8"]
    monkeypatch.setattr(sys, "argv", ["fidelity_real.py", "--from-json", f"{a},{b}"])
    fr.main()
    out = capsys.readouterr().out
    assert "| roofline | defaults | 25.0 % (4) |" in out
    assert "| roofline | calibrated, held out | 5.0 % (4) |" in out
    assert "roofline g2-c8: TTFT p50 -50 -> -6" in out


def test_from_json_refuses_a_row_twice_and_what_is_not_a_saved_run(tmp_path):
    fr = _fidelity_real()
    a = _saved_run(tmp_path, "a.json", [_row("g1-c4", "g1", -30.0, 4.0)])
    again = _saved_run(tmp_path, "again.json", [_row("g1-c4", "g1", -30.0, 4.0)])
    with pytest.raises(SystemExit) as exc:
        fr.merged([a, again])
    assert "rows already in an earlier file: g1-c4" in str(exc.value)
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit) as exc:
        fr.merged([str(bad)])
    assert "not a --json file of fidelity_real.py" in str(exc.value) and "\n" not in str(exc.value)


def test_folds_reach_the_calibration_and_hold_every_row_out(monkeypatch):
    # three tiny closed-loop points of one group, --folds 2: calibrate is asked for 2 folds (dealt i mod 2:
    # rows 0 and 2 predicted by a fit on row 1, row 1 by a fit on rows 0 and 2), and each row gets a
    # held-out error; one least_squares evaluation per start keeps the fits short
    from dynlab.calibrate.formats import MeasuredPoint

    fr = _fidelity_real()
    asked = []
    real = fr.calibrate
    monkeypatch.setattr(fr, "calibrate", lambda *a, **k: asked.append(k["folds"]) or real(*a, **k))
    points = [MeasuredPoint(source=f"p{c}", model="llama-3.1-8b", gpu="h100", tp=1, max_concurrency=c,
                            num_prompts=4 * c, random_input_len=64, random_output_len=8, median_ttft_ms=30.0 * c,
                            median_tpot_ms=5.0 + c, total_token_throughput=300.0 * c, per_gpu=True)
              for c in (1, 2, 4)]
    rows = fr.score(points, "linear", folds=2, max_nfev=1)
    assert asked == [2]
    assert [r["source"] for r in rows] == ["p1", "p2", "p4"]
    assert all(set(r["cv"]) == {"median_ttft_ms", "median_tpot_ms", "total_token_throughput_per_gpu"}
               for r in rows)
    assert set(rows[0]["fitted"]) == {"beta0", "beta1", "beta2", "request_overhead_ms"}
    # --cv-only: the same held-out rows from cross_validate, without calibrate's fit on all three rows
    alone = fr.score(points, "linear", folds=2, max_nfev=1, cv_only=True)
    assert asked == [2]  # calibrate was not called again
    assert [r["cv"] for r in alone] == [r["cv"] for r in rows] and all(r["fitted"] == {} for r in alone)


@pytest.mark.parametrize("args, message", [
    (["--folds", "1"], "--folds 1: k-fold needs at least 2 folds"),
    (["--cv-only", "--uncalibrated"], "--cv-only has no effect with --uncalibrated"),
    (["--folds", "3", "--fit-on", "conc4$"], "--folds has no effect with --fit-on"),
    (["--cv-only", "--from-json", "x.json"], "--cv-only has no effect with --from-json"),
])
def test_k_fold_options_that_would_do_nothing_are_refused(monkeypatch, args, message):
    fr = _fidelity_real()
    monkeypatch.setattr(sys, "argv", ["fidelity_real.py", *args])
    with pytest.raises(SystemExit) as exc:
        fr.main()  # refused before any file is read or replayed
    assert message in str(exc.value) and "\n" not in str(exc.value)
SGLANG_CSV = REAL / "inferencemax_dsr1_sglang.csv"
SGLANG_ROW = "run_20613446912/h200-tp8-isl1024-osl1024-conc4"


def test_inferencemax_sglang_one_row_checked_by_hand():
    # run 20613446912's object {"framework": "sglang", "hw": "h200", "tp": 8, "ep": 1, "isl": 1024, "osl": 1024,
    # "conc": 4, "median_ttft": 0.124352..., "median_tpot": 0.012091..., "tput_per_gpu": 79.075...,
    # "image": "lmsysorg/sglang:v0.5.6-cu129-amd64"}: seconds there, ms here
    rows = {r["experiment"]: r for r in _rows(SGLANG_CSV)[1]}
    row = rows[SGLANG_ROW]
    assert (row["model"], row["gpu"], row["tp"], row["ep"]) == ("deepseek-ai/DeepSeek-R1-0528", "h200", "8", "1")
    assert (row["engine"], row["version"]) == ("sglang", "0.5.6")
    assert float(row["median_ttft_ms"]) == pytest.approx(124.353, abs=0.001)
    assert float(row["median_tpot_ms"]) == pytest.approx(12.091, abs=0.001)
    assert float(row["total_token_throughput"]) == pytest.approx(79.08, abs=0.01)
    # dsr1_fp8_h200_slurm.sh: --max-running-requests 512 at 1024/1024, 256 at the other two length pairs,
    # --chunked-prefill-size 32768 everywhere (in the CSV's vLLM-named columns)
    assert {(r["max_num_seqs"], r["max_num_batched_tokens"]) for k, r in rows.items() if "isl1024-osl1024" in k} == {
        ("512", "32768")}
    assert {(r["max_num_seqs"], r["max_num_batched_tokens"]) for k, r in rows.items() if "isl1024-osl1024" not in k} == {
        ("256", "32768")}
    # the same client as the vLLM files: 10 requests per user, uniform on [0.8 L, L] (mean 921.6 for 1024)
    assert row["num_prompts"] == "40" and float(row["random_input_len"]) == pytest.approx(921.6)
    # the median request: TTFT + TPOT x (921.6 - 1) = 124.4 + 12.091 x 920.6 = 11,255 ms against 11,324 measured
    e2e = float(row["median_ttft_ms"]) + float(row["median_tpot_ms"]) * (float(row["random_output_len"]) - 1)
    assert e2e == pytest.approx(float(row["median_e2el_ms"]), rel=0.01)
    # --stream-interval 10: the client's gaps are 10-token chunks, ITL p50 117.6 ms ~ 10 x TPOT (120.9 ms)
    assert float(row["median_itl_ms"]) == pytest.approx(10 * float(row["median_tpot_ms"]), rel=0.05)


def test_sglang_server_json_holds_simconfig_fields_only():
    import json

    from dynlab.engine.config import SimConfig

    flags = json.loads((REAL / "inferencemax_dsr1_sglang_server.json").read_text())
    assert flags == {"mem_fraction_static": 0.82, "disable_radix_cache": True, "max_prefill_tokens": 32768}
    SimConfig(engine_kind="sglang", **flags)  # each a SimConfig field, in range


def test_sglang_rows_replay_on_dynlab_sglang_engine_with_the_scripts_flags(tmp_path):
    # an SGLang row runs with --engine sglang, its columns under SGLang's names and the server JSON's flags;
    # a CSV without a server JSON gets the columns only
    fr = _fidelity_real()
    points = {p.source: p for p in fr.read_rows(str(SGLANG_CSV))}
    assert fr.model_for(points[SGLANG_ROW].model) == "deepseek-v3"
    assert fr.SERVER[SGLANG_ROW] == {"engine_kind": "sglang", "ep": 1, "max_running_requests": 512,
                                     "chunked_prefill_size": 32768, "mem_fraction_static": 0.82,
                                     "disable_radix_cache": True, "max_prefill_tokens": 32768}
    bare = fr.sglang_server({"max_num_seqs": 8, "max_num_batched_tokens": 4096}, str(tmp_path / "x.csv"))
    assert bare == {"engine_kind": "sglang", "ep": 1, "max_running_requests": 8, "chunked_prefill_size": 4096}
    # the vLLM files keep vLLM's names and engine
    fr.read_rows(str(REAL / "inferencemax_gptoss.csv"))
    assert fr.SERVER["run_20218553330/h100-tp2-isl1024-osl1024-conc4"] == {"max_num_seqs": 4,
                                                                           "max_num_batched_tokens": 8192}


def test_sglang_row_replay_by_hand_at_a_linear_step():
    # SGLang (no --enable-mixed-chunk) runs prefill and decode as separate passes. At linear's
    # beta0 10 ms + beta1 0.01 ms/prefill token + beta2 0.5 ms/decode request, server and client terms off:
    # - a decode pass of the 4 users: 10 + 4 x 0.5 = 12 ms; with 3 (one user between answers) 11.5 ms;
    # - a new prompt's prefill pass, 819-1,024 tokens: 10 + 8.19 = 18.19 to 10 + 10.24 = 20.24 ms; it
    #   waits for the running decode pass (<= 12 ms): TTFT in [18.19, 32.24] ms, the first 4 prompts
    #   (at once, one pass of <= 4 x 1,024 tokens <= 32,768) 10 + 0.01 x their sum <= 50.96 ms;
    # - TPOT: the decode passes (11.5-12 ms) plus, per token, the other users' prefill passes in between:
    #   each other user restarts at most twice in a reply of >= 819 tokens (its replies are >= 819 too), so
    #   <= 3 x 2 x 20.24 / 818 = 0.15 ms: TPOT in [11.5, 12.15] ms
    from dataclasses import replace

    from dynlab.calibrate.replay import replay
    from dynlab.engine.config import SimConfig

    fr = _fidelity_real()
    point = {p.source: p for p in fr.read_rows(str(SGLANG_CSV))}[SGLANG_ROW]
    base = SimConfig(timing=True, latency_model="linear", model="deepseek-v3", gpu="h200", tp=8,
                     latency_opts={"beta0": "10", "beta1": "0.01", "beta2": "0.5", "cpu_step_us": "0",
                                   "cpu_us_per_request": "0"}, request_overhead_ms=0.0, detok_us_per_token=0.0)
    got = replay(point, replace(base, **fr.SERVER[SGLANG_ROW]))
    assert 18.19 <= got["median_ttft_ms"] <= 32.24
    assert got["p99_ttft_ms"] <= 50.96
    assert 11.5 <= got["median_tpot_ms"] <= 12.15


def test_fidelity_real_passes_the_options_to_fit_to_calibrate(monkeypatch):
    # --fit NAMES reaches dynlab.calibrate.fit.calibrate's ``fit`` (None without it: its defaults), once per
    # group with --fit-on, on the group's matching rows only (here the 2 concurrency-4 points of 1024 outputs)
    import re
    from types import SimpleNamespace

    fr = _fidelity_real()
    points = fr.read_rows(str(SGLANG_CSV))
    calls = []

    def fake_calibrate(members, configs, fit=None, folds=5, max_nfev=60):
        calls.append(([p.source for p in members], fit, {c.engine_kind for c in configs}))
        return SimpleNamespace(opts={"mla_layer_us": 2.0}, cv_points=[])

    monkeypatch.setattr(fr, "calibrate", fake_calibrate)
    monkeypatch.setattr(fr, "_errors", lambda point, config: {"median_ttft_ms": 1.0})
    rows = fr.score(points, "roofline", fit_on=re.compile("osl1024-conc4$"), fit_names=["mla_layer_us"])
    assert len(calls) == 1
    sources, fit, engines = calls[0]
    assert sorted(s.split("/")[1] for s in sources) == ["h200-tp8-isl1024-osl1024-conc4", "h200-tp8-isl8192-osl1024-conc4"]
    assert fit == ["mla_layer_us"] and engines == {"sglang"}
    assert sum(1 for r in rows if r["cv"]) == 13 and rows[0]["fitted"] == {"mla_layer_us": 2.0}
    calls.clear()
    fr.score(points, "roofline", fit_on=re.compile("osl1024-conc4$"))
    assert calls[0][1] is None
