"""A distribution with no sample is ``null`` (issue 24): every display of a run shows it as ``-`` and
none crashes (compare's table and plot, sim --report, plan's binding words)."""
from __future__ import annotations

import json

from click.testing import CliRunner

from dynlab.cli import main
from dynlab.plan.binding import _ms

#: a 100-token request (7 blocks with its token) and a 40-token one (3 blocks): capacity 2 rejects both,
#: capacity 4 rejects the first only
ROWS = [{"timestamp": 0, "tokens": list(range(1, 101)), "output_length": 1},
        {"timestamp": 10, "tokens": list(range(1, 41)), "output_length": 3}]


def _trace(tmp_path) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


def test_compare_table_shows_a_dash_for_a_run_with_no_sample(tmp_path):
    args = ["compare", "--trace", _trace(tmp_path), "--timing", "--workers", "1", "--capacity", "2,4",
            "--quiet", "--plot", str(tmp_path / "c.png"), "--report", str(tmp_path / "c.html")]
    res = CliRunner().invoke(main, args + ["--format", "table"])
    assert res.exit_code == 0, res.output
    header, every, one = res.stdout.strip().splitlines()
    cols = header.split()
    row2, row4 = dict(zip(cols, every.split())), dict(zip(cols, one.split()))
    # capacity 2: both rejected, no TTFT at all; capacity 4: the 40-token request served
    assert row2["ttft_p50_ms"] == row2["ttft_p99_ms"] == row2["tpot_p50_ms"] == "-"
    assert row2["prefix_hit_rate"] == "-"  # no request admitted: no denominator, not 0.0
    assert row4["ttft_p50_ms"] != "-" and row4["prefix_hit_rate"] == "0.0"
    assert (tmp_path / "c.png").stat().st_size > 0 and (tmp_path / "c.html").stat().st_size > 0
    out = json.loads(CliRunner().invoke(main, args[:-4] + ["--format", "json"]).stdout)
    assert out["2"]["ttft_ms"] == {"p50": None, "p90": None, "p99": None, "mean": None}
    assert out["2"]["prefix_hit_rate"] is None and out["4"]["prefix_hit_rate"] == 0.0


def test_sim_report_of_an_all_rejected_run(tmp_path):
    res = CliRunner().invoke(main, ["sim", "--trace", _trace(tmp_path), "--timing", "--workers", "1",
                                    "--capacity", "2", "--quiet", "--report", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["e2e_ms"]["mean"] is None and out["rejected"] == 2
    assert out["prefix_hit_rate"] is None  # every request rejected: nothing admitted to hit over
    assert (tmp_path / "r.html").stat().st_size > 0


def test_plan_words_for_no_queue_wait():
    assert _ms(None) == "-" and _ms(1234.56) == "1,234.6 ms"
