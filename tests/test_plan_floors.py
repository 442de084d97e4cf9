"""``dynlab plan``'s floors said per SLO (issue 43 item 5) and its shapes outside the latency model's
validated domain (issue 43 item 6), in the table, the JSON and the HTML report.

Item 5's hand model is the linear one: 10 ms per step + 1 ms per prefill token + 2 ms per decoding
request, every overhead term off. Four 100-token prompts, 10 output tokens each, all at t = 0, each with
blocks of its own (no prefix to hit).
"""
from __future__ import annotations

import json
from html import escape

import pytest
from click.testing import CliRunner

from dynlab.cli import main
from dynlab.plan.analysis import Floors

from helpers import terms_off_args

LINEAR = ["--latency-model", "linear", "--latency-opt", "beta0=10", "--latency-opt", "beta1=1",
          "--latency-opt", "beta2=2", *terms_off_args("linear"), "--modes", "rr", "--executor", "serial", "--quiet"]


def _trace(path, n: int = 4, n_in: int = 100, n_out: int = 10) -> str:
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"timestamp": 0, "input_length": n_in, "output_length": n_out,
                                 "hash_ids": [i + 1]}) + "\n")
    return str(path)


def _plan(*args):
    return CliRunner().invoke(main, ["plan", *map(str, args)])


# --------------------------------------------------------------------------- item 5: the floor per SLO
def test_tpot_floor_is_named_as_the_decode_floor(tmp_path):
    # TTFT floor: one prompt alone is one step of 100 tokens: 10 + 100 = 110 ms <= 150: no request misses TTFT.
    # TPOT floor: one decode step alone: 10 + 2 = 12 ms > 11 ms: every request (4 of 4) misses TPOT, more
    # than the 1% p99 allows: compute-bound, and it is the decode floor, not the prefill, that binds.
    # The lowest target p99 can meet: the floors' p99 (nearest rank of 4 equal values): 110 ms and 12 ms.
    trace = _trace(tmp_path / "t.jsonl")
    out = _plan("--trace", trace, "--slo-ttft-ms", 150, "--slo-tpot-ms", 11, *LINEAR, "--format", "json")
    assert out.exit_code == 3, out.stderr
    (shape,) = json.loads(out.stdout)["shapes"]
    assert (shape["binding"], shape["never_share"]) == ("compute", 1.0)
    assert shape["slo_floors"] == {"ttft": {"never_share": 0.0, "lowest_ms": 110.0, "worst_ms": 110.0},
                                   "tpot": {"never_share": 1.0, "lowest_ms": 12.0, "worst_ms": 12.0}}
    why = shape["why"]
    assert "TTFT does not bind: no request misses 150 ms alone (a prompt's own prefill takes up to 110 ms)." in why
    assert ("TPOT binds: 100.00% (4 of 4) miss 11 ms alone: one decode step alone takes up to 12 ms (the decode "
            "floor); the lowest TPOT target p99 can meet here is about 12 ms.") in why
    assert "lowest TTFT target" not in why  # the TTFT already meets its target: no floor to report for it
    assert "does not shorten a decode step alone" in why and "own prefill." not in why
    # the one replay (1 worker, nothing left to serve in time): all four prefill in one step, 10 + 400 = 410 ms,
    # then four decode together, 10 + 4 x 2 = 18 ms a step
    assert (shape["shown_workers"], shape["ttft_ms"], shape["tpot_ms"]) == (1, 410.0, 18.0)


def test_floor_per_slo_in_the_table_and_the_report(tmp_path):
    trace, html = _trace(tmp_path / "t.jsonl"), tmp_path / "plan.html"
    out = _plan("--trace", trace, "--slo-ttft-ms", 150, "--slo-tpot-ms", 11, *LINEAR, "--format", "table",
                "--report", html)
    assert out.exit_code == 3, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("- h100x1 rr: compute:"))
    assert "one decode step alone takes up to 12 ms (the decode floor)" in line
    page = html.read_text()
    assert escape("TPOT binds: 100.00% (4 of 4) miss 11 ms alone: one decode step alone takes up to 12 ms (the "
                  "decode floor)", quote=False) in page


def test_prefill_floor_still_named_when_ttft_binds(tmp_path):
    # a 100 ms TTFT target: every prompt's floor is 110 ms > 100 (4 of 4 miss TTFT alone); TPOT 20 ms: the
    # 12 ms decode step meets it, so TPOT does not bind
    trace = _trace(tmp_path / "t.jsonl")
    out = _plan("--trace", trace, "--slo-ttft-ms", 100, "--slo-tpot-ms", 20, *LINEAR, "--format", "json")
    (shape,) = json.loads(out.stdout)["shapes"]
    assert shape["slo_floors"]["ttft"]["never_share"] == 1.0 and shape["slo_floors"]["tpot"]["never_share"] == 0.0
    assert ("TTFT binds: 100.00% (4 of 4) miss 100 ms alone: a prompt's own prefill takes up to 110 ms (the prefill "
            "floor); the lowest TTFT target p99 can meet here is about 110 ms.") in shape["why"]
    assert "TPOT does not bind: no request misses 20 ms alone (one decode step alone takes up to 12 ms)." in shape["why"]
    assert "does not shorten a prompt's own prefill." in shape["why"]


def test_goodput_target_names_its_share(tmp_path):
    # --goodput 0.5: up to half may miss; every request misses the 11 ms TPOT alone (12 ms), so it binds;
    # the lowest TPOT target half the requests can meet is the floors' median, 12 ms
    trace = _trace(tmp_path / "t.jsonl")
    out = _plan("--trace", trace, "--slo-tpot-ms", 11, "--goodput", 0.5, *LINEAR, "--format", "json")
    (shape,) = json.loads(out.stdout)["shapes"]
    assert shape["slo_floors"]["ttft"] == {"never_share": None, "lowest_ms": 110.0, "worst_ms": 110.0}
    assert "the lowest TPOT target a goodput of 0.5 can meet here is about 12 ms." in shape["why"]
    assert "TTFT" not in shape["why"].split("allows")[1]  # no TTFT SLO, no sentence about it


def test_per_slo_floors_by_hand():
    # TTFT floors 10, 20, 30, 40 ms; TPOT floors 1, none (a one-token request), 5, 1 ms
    fl = Floors((10.0, 20.0, 30.0, 40.0), (1.0, None, 5.0, 1.0))
    # TTFT 25 ms: 30 and 40 miss, 2 of 4; p50 by nearest rank: the 2nd of 4, 20 ms
    assert fl.per_slo("ttft", 25.0, 0.5) == {"never_share": 0.5, "lowest_ms": 20.0, "worst_ms": 40.0}
    # TPOT 2 ms: 5 misses, 1 of all 4 requests; p99 over the 3 that have a TPOT: the 3rd of 1, 1, 5
    assert fl.per_slo("tpot", 2.0, 0.99) == {"never_share": 0.25, "lowest_ms": 5.0, "worst_ms": 5.0}
    assert fl.per_slo("tpot", None, 0.5)["never_share"] is None
    assert Floors((10.0,), (None,)).per_slo("tpot", 2.0, 0.99) is None  # no request has a TPOT


def test_floor_text_within_the_allowed_share():
    from dynlab.plan.binding import floor_text
    from dynlab.plan.target import Target

    # 0.5% of 1,000 requests (5) miss alone, within the 1% p99 allows: said, but not as binding
    text = floor_text("ttft", 2000, {"never_share": 0.005, "lowest_ms": 1500.0, "worst_ms": 2500.0},
                      Target(2000, 50), 1000)
    assert text == ("TTFT: 0.50% (5 of 1,000) miss 2000 ms alone (a prompt's own prefill takes up to 2,500 ms), "
                    "within the 1.00% allowed.")


# --------------------------------------------------------------------------- item 6: extrapolated shapes
@pytest.fixture
def small_trace(tmp_path):
    return _trace(tmp_path / "s.jsonl")


def test_extrapolated_shapes_are_marked(small_trace, tmp_path):
    # the roofline's defaults were fitted on h100/h200 at tp 1-2 (docs/latency.md): of h100 and b200 at tp 1
    # and 4, only h100x1 is inside; b200 (another GPU) and tp 4 are outside. Four 100-token prompts with a
    # 1,000 ms TTFT target: one worker of any shape serves them (one step of 400 tokens takes a few ms), so
    # the ranking is by GPUs: the two 1-GPU shapes first, one of them the extrapolated b200x1.
    html = tmp_path / "p.html"
    args = ["--trace", small_trace, "--slo-ttft-ms", 1000, "--gpu", "h100,b200", "--tp", "1,4",
            "--executor", "serial", "--quiet"]
    plan = json.loads(_plan(*args, "--format", "json").stdout)
    marked = {s["shape"]: s["extrapolated"] for s in plan["shapes"]}
    assert marked == {"h100x1 kv-cost": False, "b200x1 kv-cost": True, "h100x4 kv-cost": True,
                      "b200x4 kv-cost": True}
    assert [s["workers"] for s in plan["shapes"]] == [1, 1, 1, 1]
    assert {s["shape"] for s in plan["shapes"][:2]} == {"h100x1 kv-cost", "b200x1 kv-cost"}
    by = {s["shape"]: s for s in plan["shapes"]}
    assert by["h100x1 kv-cost"]["latency_domain"] is None
    assert "GPU b200" in by["b200x1 kv-cost"]["latency_domain"]
    assert "tp 4" in by["h100x4 kv-cost"]["latency_domain"]
    out = _plan(*args, "--format", "table", "--report", html)
    assert out.exit_code == 0, out.stderr
    rows = {line.split()[1] + " " + line.split()[2]: line for line in out.stdout.splitlines()[1:5]}
    assert rows["b200x1 kv-cost"].split()[3] == "*" and rows["h100x1 kv-cost"].split()[3] == "1"
    lines = out.stdout.splitlines()
    note = next(i for i, line in enumerate(lines) if line.startswith("*: extrapolated"))
    assert lines[note + 1:note + 4] == [f"  {s['shape']}: {s['latency_domain']}" for s in plan["shapes"]
                                        if s["extrapolated"]]
    # the same words on stderr, once per shape, and in the report (its table and each run's domain)
    for shape in ("b200x1 kv-cost", "h100x4 kv-cost", "b200x4 kv-cost"):
        assert f"Warning: {shape}: latency model outside its validated domain: {by[shape]['latency_domain']}" \
            in out.stderr
        assert escape(by[shape]["latency_domain"], quote=False) in html.read_text()
    assert "h100x1 kv-cost:" not in out.stderr
    assert escape("*: extrapolated", quote=False) in html.read_text()


def test_no_note_when_every_shape_is_inside(small_trace):
    out = _plan("--trace", small_trace, "--slo-ttft-ms", 1000, "--gpu", "h100,h200", "--executor", "serial",
                "--quiet", "--format", "table")
    assert out.exit_code == 0, out.stderr
    assert "extrapolated" not in out.stdout and "*" not in out.stdout and "Warning" not in out.stderr
