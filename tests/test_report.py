"""The HTML report (dynlab.report, `dynlab report`, --report): inputs, figures' numbers, the page's
self-containment and accessibility, and the command's errors. Expected values are derived by hand."""
from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from hypothesis import given, strategies as st

from dynlab.cli import main
from dynlab.errors import DynlabError, InputFileError
from dynlab.report import Run, build_report, read_records, read_runs, runs_from_json
from dynlab.report.html import HEADLINE, headline_rows, unique_labels
from dynlab.report.record_figures import in_flight, quantile, tpot_values, ttft_values

TIMED = {"mode": "kv-cost", "workers": 2, "requests": 3, "hit_rate": 0.5, "block_hit_rate": 0.25,
         "ideal_block_hit_rate": 0.4, "prefix_hit_rate": 0.2, "prompt_blocks": 100, "gpu_hit_blocks": 15,
         "cpu_hit_blocks": 5, "model": "llama-3.1-8b", "gpu": "h100", "tp": 1, "latency_model": "roofline",
         "kv_blocks": 29205, "kv_blocks_source": "floor(...) = 29205 blocks", "requests_per_worker": [2, 1],
         "load_imbalance": 1.3333, "mean_kv_usage": [0.1, 0.05], "ttft_ms": {"p50": 10.0, "p90": 20.0, "p99": 30.0},
         "tpot_ms": {"p50": 5.0, "p90": 6.0, "p99": 7.0}, "preemptions": 0, "rejected": 0}
COUNTED = {"mode": "rr", "workers": 2, "requests": 3, "hit_rate": 0.0, "block_hit_rate": 0.0,
           "ideal_block_hit_rate": 0.4, "requests_per_worker": [2, 1], "load_imbalance": 1.3333}


def rec(i, worker, arrival, sched, first, finish, out=3, **extra):
    r = {"id": i, "worker": worker, "arrival_ms": arrival, "first_scheduled_ms": sched, "first_token_ms": first,
         "finish_ms": finish, "input_length": 100, "output_length": out, "hit_tokens": 0, "preemptions": 0,
         "rejected": False}
    r.update(extra)
    return r


RECORDS = [rec(0, 0, 0.0, 1.0, 11.0, 31.0), rec(1, 1, 5.0, 5.0, 25.0, 35.0), rec(2, 0, 8.0, 12.0, 20.0, 20.0, out=1)]


# ------------------------------------------------------------------ inputs
def test_the_three_outputs_are_recognised():
    (one,) = runs_from_json(TIMED, "s.json")
    assert (one.label, one.cell) == ("kv-cost", None)
    two = runs_from_json({"rr": COUNTED, "kv": TIMED}, "c.json")
    assert [r.label for r in two] == ["rr", "kv"]  # compare: labelled by the compared value, not the mode
    (cell,) = runs_from_json({"cell": {"mode": "rr", "workers": 2}, "result": COUNTED})
    assert cell.label == "mode=rr workers=2" and cell.cell == {"mode": "rr", "workers": 2}


def test_a_sweep_line_whose_cell_has_a_requests_option_is_one_cell():
    # a closed-loop sweep's --requests N is a cell option: {"cell": {"requests": 16, ...}, "result": {...}}
    # has two objects with an integer "requests", and must not read as a compare of "cell" and "result"
    line = {"cell": {"concurrency": 4, "requests": 16}, "result": dict(COUNTED, requests=16)}
    (cell,) = runs_from_json(line)
    assert cell.label == "concurrency=4 requests=16" and cell.cell == {"concurrency": 4, "requests": 16}
    assert cell.result["requests"] == 16


def test_a_sweep_file_is_read_line_by_line_and_a_bad_line_is_named(tmp_path):
    p = tmp_path / "r.jsonl"
    good = json.dumps({"cell": {"workers": 2}, "result": COUNTED})
    p.write_text(good + "\n" + good.replace('"workers": 2}', '"workers": 3}', 1) + "\n")
    assert [r.label for r in read_runs(str(p))] == ["workers=2", "workers=3"]
    p.write_text(good + "\n{oops\n")
    with pytest.raises(DynlabError, match=rf"^{re.escape(str(p))}:2: not JSON"):
        read_runs(str(p))
    p.write_text(good + '\n{"a": 1}\n')
    with pytest.raises(DynlabError, match=rf"^{re.escape(str(p))}:2: not a sim, compare or sweep output"):
        read_runs(str(p))
    p.write_text('{\n  "requests": 3,\n  "mode" "rr"\n}\n')  # one indented document, broken on line 3
    with pytest.raises(DynlabError, match=rf"^{re.escape(str(p))}:3: not JSON"):
        read_runs(str(p))
    with pytest.raises(InputFileError):
        read_runs(str(tmp_path / "missing.json"))


def test_a_bad_record_is_named_with_its_line(tmp_path):
    p = tmp_path / "r.jsonl"
    bad = dict(RECORDS[0])
    del bad["finish_ms"]
    p.write_text(json.dumps(RECORDS[0]) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DynlabError, match=rf"^{re.escape(str(p))}:2: missing key\(s\) finish_ms$"):
        read_records(str(p))
    p.write_text(json.dumps(dict(RECORDS[0], preemptions=-1)) + "\n")
    with pytest.raises(DynlabError, match=":1: preemptions must be an integer >= 0"):
        read_records(str(p))
    p.write_text("\n")
    with pytest.raises(DynlabError, match="no records"):
        read_records(str(p))


# ------------------------------------------------------------------ the figures' numbers, by hand
def test_ttft_and_tpot_of_records():
    # TTFT = first token - arrival: 11, 20, 12; TPOT = (finish - first token) / (output - 1): 10, 5 (one token: none)
    assert ttft_values(RECORDS) == [11.0, 12.0, 20.0]
    assert tpot_values(RECORDS) == [5.0, 10.0]
    rejected = [rec(3, 0, 1.0, None, None, None, rejected=True)]
    assert ttft_values(rejected) == [] and tpot_values(rejected) == []


def test_quantile_interpolates_like_numpy():
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5  # position 1.5
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.99) == pytest.approx(3.97)  # position 2.97
    assert quantile([7.0], 0.9) == 7.0


def test_in_flight_counts_half_open_spans():
    # spans [0, 10) and [5, 20): at 0 one, at 5 two, at 10 one (the first ended), at 20 none
    assert in_flight([0, 5], [10, 20], [0, 5, 10, 20]) == [1, 2, 1, 0]


@given(st.lists(st.tuples(st.floats(0, 1e6), st.floats(0, 1e6)), max_size=30), st.lists(st.floats(0, 2e6), max_size=20))
def test_in_flight_is_a_count_of_spans(spans, times):
    spans = [(min(a, b), max(a, b)) for a, b in spans]
    got = in_flight([a for a, _ in spans], [b for _, b in spans], times)
    assert got == [sum(1 for a, b in spans if a <= t < b) for t in times]


@given(st.lists(st.floats(-1e9, 1e9), min_size=1, max_size=50), st.floats(0, 1), st.floats(0, 1))
def test_quantile_is_monotone_and_bounded(values, q1, q2):
    values.sort()
    lo, hi = sorted((q1, q2))
    assert values[0] <= quantile(values, lo) <= quantile(values, hi) <= values[-1] or \
        quantile(values, lo) == pytest.approx(quantile(values, hi))


# ------------------------------------------------------------------ the page
def _page(runs, records=None, **kw):
    return build_report(runs, records, **kw)


def test_the_headline_columns_and_their_order_are_fixed():
    assert [c for c, _ in HEADLINE] == [
        "requests", "hit_rate", "block_hit_rate", "prefix_hit_rate", "ideal", "pred_error", "evicted", "imbalance",
        "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "goodput", "tok_s_gpu", "xfer_p50_ms",
        "xfer_p99_ms", "preempted", "rejected"]
    header, rows = headline_rows([Run("rr", COUNTED)])
    assert header == ["run", "requests", "hit_rate", "block_hit_rate", "ideal", "imbalance"]
    assert rows == [["rr", 3, 0.0, 0.0, 0.4, 1.3333]]


def test_repeated_labels_are_told_apart_by_their_file():
    runs = unique_labels([Run("kv", COUNTED, source="a/x.json"), Run("kv", COUNTED, source="b/y.json"),
                          Run("rr", COUNTED)])
    assert [r.label for r in runs] == ["kv (x.json)", "kv (y.json)", "rr"]


def test_the_page_is_self_contained():
    page = _page([Run("rr", COUNTED), Run("kv-cost", TIMED)], {"kv-cost": RECORDS})
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search(r"<(script|link|iframe|img|object|embed)\b", page)
    assert not re.search(r"\bsrc\s*=", page)
    # the only URLs are XML namespaces; every link is to an anchor of the page
    urls = set(re.findall(r"https?://[^\s\"'<>]+", page))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls
    for href in re.findall(r'<a href="([^"]*)"', page):
        assert href.startswith("#") and f'id="{href[1:]}"' in page


def test_every_figure_has_a_caption_and_its_numbers():
    page = _page([Run("rr", COUNTED), Run("kv-cost", TIMED)], {"kv-cost": RECORDS})
    figures = re.findall(r"<figure id=\"([^\"]+)\">(.*?)</figure>", page, re.S)
    assert {key for key, _ in figures} >= {"cdf", "load", "latency", "hits", "workers"}
    for key, body in figures:
        assert f'<svg role="img" aria-labelledby="{key}-cap"' in body
        assert f'<figcaption id="{key}-cap">' in body and "<table>" in body


def test_the_configuration_shows_the_pool_and_its_derivation():
    page = _page([Run("kv-cost", TIMED)], context={"command": "dynlab sim --timing", "trace": "t.jsonl"})
    for text in ("llama-3.1-8b", "h100", "roofline", "29205", "floor(...) = 29205 blocks", "t.jsonl",
                 "dynlab sim --timing"):
        assert text in page


def test_timed_results_and_the_configuration_say_the_scheduler_rules():
    # the result JSON records admission and async scheduling; the report's configuration table shows them
    from dynlab.engine.config import SimConfig
    from dynlab.report.html import config_rows
    from dynlab.sim.runner import run

    plain = run(SimConfig(timing=True, workers=1, prefixes=2, reps=2))
    chunk = run(SimConfig(timing=True, workers=1, prefixes=2, reps=2, admission="chunk", async_scheduling=True))
    assert (plain["admission"], plain["async_scheduling"]) == ("full", False)
    assert (chunk["admission"], chunk["async_scheduling"]) == ("chunk", True)
    keys = list(plain)
    assert keys.index("latency_model") + 1 == keys.index("admission") == keys.index("async_scheduling") - 1
    assert "admission" not in run(SimConfig(workers=1, prefixes=2, reps=2))  # count-based: no scheduler
    rows = config_rows([Run("a", plain), Run("b", chunk)], {})
    assert ["admission", "a: full; b: chunk"] in rows and ["async scheduling", "a: off; b: on"] in rows


def test_records_give_the_cdf_table_and_the_arrival_rate():
    page = _page([Run("kv-cost", TIMED)], {"kv-cost": RECORDS})
    # TTFT 11, 12, 20: p50 12.0, p90 18.4 (position 1.8), p99 19.8 (1.98), p99.9 20.0 (rounded to 0.1)
    assert re.search(r"<td>TTFT</td><td>3</td><td>12.0</td><td>18.4</td><td>19.8</td><td>20.0</td>", page)
    # arrivals 0, 5, 8 ms: 2 gaps in 8 ms = 250 requests/s
    assert "(requests/s, from its records)</th><td class=l>250.0</td>" in page


def test_a_pd_run_gets_the_transfer_timeline():
    pd = [rec(0, 0, 0.0, 0.0, 10.0, 40.0, prefill_worker=0, decode_worker=1, transfer_start_ms=10.0,
              transfer_end_ms=14.0),
          rec(1, 0, 2.0, 10.0, 20.0, 50.0, prefill_worker=0, decode_worker=2, transfer_start_ms=20.0,
              transfer_end_ms=30.0)]
    page = _page([Run("pd", TIMED)], {"pd": pd})
    assert 'id="transfers"' in page
    # durations 4 and 10 ms: p50 7.0; both in flight never at once: peak 1
    assert re.search(r"<th scope=\"row\" class=l>pd</th><td>2</td><td>1</td><td>7.0</td>", page)


def test_sweep_cells_are_labelled_by_what_varies():
    runs = [Run("x", COUNTED, cell={"mode": m, "workers": 2, "trace": "t"}) for m in ("rr", "kv")]
    page = _page(runs)
    assert '<th scope="row" class=l>mode=rr</th>' in page and '<th scope="row" class=l>mode=kv</th>' in page
    assert "<th scope=\"row\" class=l>options of every cell</th><td class=l>workers=2 trace=t</td>" in page


def test_a_sweep_gets_a_heatmap():
    runs = [Run(f"w={w} c={c}", dict(COUNTED, block_hit_rate=w * c / 1000), cell={"workers": w, "capacity": c})
            for w in (2, 4) for c in (10, 100)]
    page = _page(runs)
    assert 'id="sweep-block-hit-rate"' in page and "a heatmap of workers by capacity" in page
    assert "Best cell: workers=4 capacity=100 (0.4)" in page


SPEC = {"seed": 1, "requests": 64, "arrival": {"process": "poisson", "rate": 5},
        "input": {"dist": "uniform", "min": 100, "max": 300}, "output": {"dist": "uniform", "min": 10, "max": 30}}


def _small_sweep(tmp_path, *args):
    """A real timed sweep of a small workload (a second or so) into r.jsonl; returns its lines."""
    (tmp_path / "w.json").write_text(json.dumps(SPEC))
    res = _invoke(["sweep", "--timing", "--workload", str(tmp_path / "w.json"), "--executor", "serial", "--quiet",
                   "--grid", "mode=rr,kv", "--out", str(tmp_path / "r.jsonl"), *args])
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]


def _figure_ids(page):
    return re.findall(r'<figure id="([^"]+)">', page)


def test_a_closed_loop_sweep_report_has_the_frontier(tmp_path):
    # concurrency written out of order: the report joins each mode's points in the order of their concurrency
    lines = _small_sweep(tmp_path, "--grid", "concurrency=4,1,2", "--requests", "16",
                         "--report", str(tmp_path / "s.html"))
    assert len(lines) == 6 and all(line["cell"]["requests"] == 16 for line in lines)
    res = _invoke(["report", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    assert "report: 6 runs, 6 figures" in res.stderr  # one run per line (a cell's requests option is not a run)
    for page in ((tmp_path / "r.html").read_text(), (tmp_path / "s.html").read_text()):
        assert _figure_ids(page) == ["latency", "hits", "workers", "sweep-frontier", "sweep-block-hit-rate",
                                     "sweep-ttft-ms-p99"]
        (body,) = re.findall(r'<figure id="sweep-frontier">(.*?)</figure>', page, re.S)
        assert "interactivity p50 (tokens/s per user, 1000 / TPOT)" in body  # the axis, as text in the SVG
        assert "a line per mode through its cells in the order of their concurrency" in body
        # the numbers: a row per mode and concurrency, in that order, as the results lines have them
        want = {(line["cell"]["mode"], line["cell"]["concurrency"]):
                (line["result"]["interactivity"]["p50"], line["result"]["tokens_per_s_per_gpu"]) for line in lines}
        rows = re.findall(r'<tr><th scope="row" class=l>([^<]*)</th><td>(\d+)</td><td>([^<]*)</td><td>([^<]*)</td></tr>',
                          body)
        assert [(m, int(c)) for m, c, _, _ in rows] == [(m, c) for m in ("rr", "kv") for c in (1, 2, 4)]
        assert all((float(x), float(y)) == want[(m, int(c))] for m, c, x, y in rows)


def test_an_open_loop_sweep_report_has_no_frontier(tmp_path):
    _small_sweep(tmp_path, "--grid", "workers=1,2", "--report", str(tmp_path / "s.html"))
    res = _invoke(["report", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    for page in ((tmp_path / "r.html").read_text(), (tmp_path / "s.html").read_text()):
        assert _figure_ids(page) == ["latency", "hits", "workers", "sweep-block-hit-rate", "sweep-ttft-ms-p99"]
        assert "interactivity" not in page


def test_no_runs_is_an_error():
    with pytest.raises(ValueError):
        build_report([])


# ------------------------------------------------------------------ the command
def _invoke(args):
    return CliRunner().invoke(main, args)


def test_report_command_writes_one_file(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"rr": COUNTED, "kv-cost": TIMED}))
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    out = tmp_path / "rep.html"
    res = _invoke(["report", str(tmp_path / "c.json"), "--requests", f"kv-cost={tmp_path / 'r.jsonl'}",
                   "--out", str(out), "--title", "My fleet"])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert "<title>My fleet</title>" in page and 'id="cdf"' in page
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "r.jsonl", "rep.html"]  # no temporary left


def test_report_to_stdout(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps(COUNTED))
    res = _invoke(["report", str(tmp_path / "s.json"), "--out", "-"])
    assert res.exit_code == 0 and res.stdout.startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("args, code, message", [
    (["report", "{d}/missing.json", "--out", "{d}/r.html"], 2, "missing.json: No such file or directory"),
    (["report", "{d}/bad.json", "--out", "{d}/r.html"], 1, "bad.json:2: not JSON"),
    (["report", "{d}/s.json", "--out", "{d}/r.png"], 2, "a report is HTML; name a .html file"),
    (["report", "{d}/s.json", "--out", "{d}/nodir/r.html"], 2, "does not exist"),
    (["report", "{d}/s.json", "--requests", "{d}/bad.json", "--out", "{d}/r.html"], 1, "bad.json:1: missing key"),
    (["sim", "--report", "-"], 2, "standard output carries the run's JSON"),
    (["compare", "--modes", "rr,kv", "--report", "{d}/r.txt"], 2, "a report is HTML"),
    (["sweep", "--grid", "workers=1,2", "--dry-run", "--report", "{d}/r.html"], 2, "--report has no effect"),
])
def test_bad_input_is_one_line_and_leaves_the_old_file(tmp_path, args, code, message):
    (tmp_path / "s.json").write_text(json.dumps(COUNTED))
    (tmp_path / "bad.json").write_text('{"requests": 1}\n{no\n')
    (tmp_path / "r.html").write_text("old")
    res = _invoke([a.format(d=tmp_path) for a in args])
    assert res.exit_code == code, res.output
    (line,) = res.stderr.splitlines()
    assert line.startswith("Error: ") and message in line, line
    assert (tmp_path / "r.html").read_text() == "old"


def test_sim_compare_and_sweep_write_a_report_and_print_what_they_printed(tmp_path):
    rep = tmp_path / "r.html"
    plain = _invoke(["compare", "--modes", "rr,kv", "--format", "json"])
    res = _invoke(["compare", "--modes", "rr,kv", "--format", "json", "--report", str(rep)])
    assert res.exit_code == 0 and res.stdout == plain.stdout  # the JSON is unchanged
    page = rep.read_text()
    # the question: the options given, each under its first flag, in the command's order of options
    assert re.search(r"dynlab compare --mode rr,kv .*--format json", page) and "<th scope=\"row\" class=l>kv</th>" in page
    res = _invoke(["sim", "--timing", "--mode", "kv-cost", "--report", str(rep)])
    assert res.exit_code == 0 and json.loads(res.stdout)["mode"] == "kv-cost"
    page = rep.read_text()
    assert "Poisson" in page and 'id="latency"' in page and "kv_blocks" not in page
    res = _invoke(["sweep", "--executor", "serial", "--quiet", "--grid", "workers=2,3", "--grid", "capacity=4,8",
                   "--all-metrics", "--report", str(rep)])
    assert res.exit_code == 0, res.output
    page = rep.read_text()
    assert "dynlab sweep: 4 cells" in page and 'id="sweep-block-hit-rate"' in page
    assert "<th scope=\"row\" class=l>workers=3 capacity=8</th>" in page  # labelled by what varies


# ------------------------------------------------------------------ any subset of a result's keys
from hypothesis import settings  # noqa: E402

OPTIONAL = sorted(set(TIMED) - {"mode", "requests"})


@settings(max_examples=20)  # each example draws every figure (about 0.3 s)
@given(st.lists(st.sets(st.sampled_from(OPTIONAL)), min_size=1, max_size=3),
       st.lists(st.sampled_from([0.0, 0.5, 1.0, 250.0]), min_size=1, max_size=3))
def test_any_subset_of_keys_gives_a_page_with_a_row_per_run(key_sets, scales):
    runs = []
    for i, keys in enumerate(key_sets):
        result = {"mode": f"m{i}", "requests": 3, **{k: TIMED[k] for k in keys}}
        if "ttft_ms" in result:  # zeros and spreads a log axis must survive
            s = scales[i % len(scales)]
            result["ttft_ms"] = {p: v * s for p, v in TIMED["ttft_ms"].items()}
        runs.append(Run(f"m{i}", result))
    page = build_report(runs)
    body = page.split('id="headline"', 1)[1].split("</table>", 1)[0]
    assert body.count("<tr>") == len(runs) + 1  # the header and a row per run
    assert page.count("<figure ") == page.count("<figcaption ") == page.count('<svg role="img"')
