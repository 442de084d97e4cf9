"""GPU prices and a run's cost (issue 41 item 4): the bundled table, ``cost`` of a ``{gpu: gpu_hours}`` mapping, and
``--price`` / ``--spot-discount`` on timed runs (a fixed fleet and an elastic one), figures derived by hand."""
from __future__ import annotations

import json
import math
import re

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from dynlab import SimConfig
from dynlab.cli import main
from dynlab.models.gpus import GPUS
from dynlab.models.prices import GIVEN, PRICES, cost, parse_prices, price_of
from dynlab.sim import run

from helpers import terms_off


# --------------------------------------------------------------------------- the table
def test_every_row_is_a_catalogue_gpu_with_its_date_and_source():
    for gpu, row in PRICES.items():
        assert gpu in GPUS
        assert row.usd_per_gpu_hour > 0 and re.fullmatch(r"\d{4}-\d{2}-\d{2}", row.read)
        assert row.url.startswith("https://") and row.provider in ("AWS", "Azure", "GCP")
        assert row.source().startswith(f"table: {row.provider} ") and row.url in row.source()


def test_per_gpu_prices_are_the_instance_price_over_its_gpus():
    # AWS p5.48xlarge: $55.04/h for 8 H100s = $6.88; p4de.24xlarge $27.44705/h / 8 = $3.4309 (4 decimals)
    assert PRICES["h100"].usd_per_gpu_hour == 55.04 / 8
    assert PRICES["a100-80gb"].usd_per_gpu_hour == round(27.44705 / 8, 4)
    assert PRICES["a100-40gb"].usd_per_gpu_hour == round(21.957642 / 8, 4)


# --------------------------------------------------------------------------- cost of a mapping
def test_cost_of_a_mixed_fleet_by_hand():
    # 2 h100 GPU-hours at the table's $6.88 + 3 l4 GPU-hours at --price's $0.5 = 13.76 + 1.5 = 15.26;
    # a 25 % discount: 15.26 x 0.75 = 11.445
    out = cost({"h100": 2.0, "l4": 3.0}, {"l4": 0.5})
    assert out == {"cost_usd": 15.26, "price_source": {"h100": PRICES["h100"].source(), "l4": GIVEN}}
    off = cost({"h100": 2.0, "l4": 3.0}, {"l4": 0.5}, 0.25)
    assert off["cost_usd"] == pytest.approx(11.445) and off["spot_discount"] == 0.25


def test_a_given_price_overrides_the_table():
    assert price_of("h100", {"h100": 2.0}) == (2.0, GIVEN)
    assert price_of("h100") == (6.88, PRICES["h100"].source())


def test_a_gpu_without_a_price_says_how_to_give_one():
    with pytest.raises(ValueError, match=r"^no price for GPU l4: give --price l4=USD"):
        cost({"l4": 1.0})


@pytest.mark.parametrize("text, words", [
    ("h100", "give GPU=USD"), ("h100=x", "not a number"), ("h100=-1", ">= 0"), ("h100=inf", "finite"),
    ("h100=1,h100=2", "priced twice"), ("a100=1,a100-80gb=2", "priced twice"),  # an alias is its GPU
])
def test_bad_prices_are_one_line(text, words):
    with pytest.raises(ValueError, match=words):
        parse_prices(text)


def test_parse_prices():
    assert parse_prices("table") == parse_prices(None) == {}
    assert parse_prices("h100=2.5, a100=1") == {"h100": 2.5, "a100-80gb": 1.0}


@given(st.dictionaries(st.sampled_from(sorted(PRICES)), st.floats(0, 1e4)), st.floats(0, 0.99))
def test_cost_is_linear_in_hours_and_in_the_discount(hours, discount):
    full = sum(h * PRICES[g].usd_per_gpu_hour for g, h in hours.items())
    assert cost(hours)["cost_usd"] == pytest.approx(full, abs=1e-6)
    assert cost(hours, discount=discount)["cost_usd"] == pytest.approx(full * (1 - discount), abs=1e-6)
    assert set(cost(hours)["price_source"]) == set(hours)


# --------------------------------------------------------------------------- timed runs
@pytest.fixture
def queue_trace(tmp_path):
    """12 requests of 1,000 prompt tokens and 1 output token, all at 0 (two 512-token blocks each)."""
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 0, "input_length": 1000, "output_length": 1,
                                        "hash_ids": [2 * i + 1, 2 * i + 2]}) + "\n" for i in range(12)))
    return str(path)


def _run(trace, **kw) -> dict:
    # the linear step model alone: a step of one 1,000-token prefill takes 1 + 0.01 x 1000 = 11 ms
    if "pools" not in kw:
        kw.setdefault("workers", 1)
    return run(SimConfig(trace=trace, timing=True, mode="rr", latency_model="linear",
                         max_num_batched_tokens=1000, **terms_off("linear", {"beta0": 1.0, "beta1": 0.01, "beta2": 0.0}),
                         **kw))


def test_a_fixed_fleet_is_billed_its_gpus_times_the_makespan(queue_trace):
    # one worker runs the 12 prefills one step each: 12 x 11 ms = 132 ms of makespan.
    # 1 GPU: 0.132 s / 3600 = 3.67e-5 -> 0.000037 GPU-hours (6 decimals); x $36,000 = $1.332.
    # --tp 2: 2 x 0.132 / 3600 = 7.33e-5 -> 0.000073; x $36,000 = $2.628
    plain = _run(queue_trace)
    priced = _run(queue_trace, price="h100=36000")
    assert plain["makespan_s"] == 0.132 and "gpu_hours" not in plain and "cost_usd" not in plain
    assert {k: priced[k] for k in ("gpu_hours", "cost_usd", "price_source")} == {
        "gpu_hours": 0.000037, "cost_usd": 1.332, "price_source": {"h100": "--price"}}
    assert list(priced)[-3:] == ["gpu_hours", "cost_usd", "price_source"]
    assert {k: v for k, v in priced.items() if k not in ("gpu_hours", "cost_usd", "price_source")} == plain
    tp2 = _run(queue_trace, price="h100=36000", tp=2)
    assert (tp2["gpu_hours"], tp2["cost_usd"]) == (0.000073, 2.628)


def test_a_discount_alone_prices_at_the_table(queue_trace):
    # the table's h100 at $6.88, 75 % off: 0.000037 x 6.88 x 0.25 = 0.00006364 -> 0.000064 (6 decimals)
    out = _run(queue_trace, spot_discount=0.75)
    assert (out["cost_usd"], out["spot_discount"]) == (0.000064, 0.75)
    assert out["price_source"] == {"h100": PRICES["h100"].source()}


def test_an_elastic_fleet_is_billed_its_own_gpu_hours(queue_trace):
    # --controller static keeps the one worker from 0 to the last finish (132 ms): gpu_hours 0.000037, priced as
    # shown: x $36,000 x (1 - 0.5) = $0.666; the cost keys follow gpu_hours, before the scaling keys
    out = _run(queue_trace, controller="static", price="h100=36000", spot_discount=0.5)
    keys = list(out)
    at = keys.index("gpu_hours")
    assert keys[at:at + 4] == ["gpu_hours", "cost_usd", "price_source", "spot_discount"]
    assert (out["gpu_hours"], out["cost_usd"]) == (0.000037, 0.666)
    assert "scale_events" in keys[at + 4:]


def test_an_alias_and_a_gpu_file_are_priced_by_their_names(queue_trace, tmp_path):
    gpu = tmp_path / "mine.json"
    gpu.write_text(json.dumps({"memory_gb": 80, "bf16_tflops": 989, "hbm_gbps": 3350, "source": "a test GPU"}))
    out = _run(queue_trace, gpu=str(gpu), price="mine=36000")  # a file's GPU: its stem
    assert (out["cost_usd"], out["price_source"]) == (1.332, {"mine": "--price"})
    out = _run(queue_trace, gpu="a100", price="a100=36000")  # a100 is the a100-80gb
    assert out["price_source"] == {"a100-80gb": "--price"}
    with pytest.raises(ValueError, match="no price for GPU mine: give --price mine=USD"):
        _run(queue_trace, gpu=str(gpu), price="table")


@pytest.mark.parametrize("args, words", [
    (["--gpu", "l4", "--price", "table"], "no price for GPU l4: give --price l4=USD"),
    (["--price", "nope=2"], "unknown GPU 'nope' in --price"),
    (["--price", "h200=2"], "--price has no effect for h200: the run's GPUs are h100"),
    (["--spot-discount", "1"], "--spot-discount"),
])
def test_bad_cost_options_are_one_line(queue_trace, args, words):
    out = CliRunner().invoke(main, ["sim", "--trace", queue_trace, "--timing", "--quiet", *args])
    assert out.exit_code == 2 and out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith("Error: ") and words in line, line


def test_compare_shows_cost_next_to_gpu_hours(queue_trace):
    out = CliRunner().invoke(main, ["compare", "--trace", queue_trace, "--timing", "--workers", "1", "--mode", "rr",
                                    "--latency-model", "linear", "--price", "h100=36000", "--spot-discount", "0,0.5",
                                    "--quiet", "--format", "table"])
    assert out.exit_code == 0, out.stderr
    head, *rows = out.stdout.splitlines()
    cols = head.split()
    assert cols[cols.index("gpu_hours") + 1] == "cost_usd"
    hours = [float(r.split()[cols.index("gpu_hours")]) for r in rows]
    costs = [float(r.split()[cols.index("cost_usd")]) for r in rows]
    assert hours[0] == hours[1] and costs[1] == pytest.approx(costs[0] / 2, abs=1e-6)  # 50 % off
    assert math.isclose(costs[0], hours[0] * 36000, abs_tol=1e-4)


def test_a_pd_fleet_is_billed_both_pools(queue_trace):
    # one prefill and one decode worker of 2 GPUs each (--tp 2): 4 GPUs x the makespan; at $3,600 a GPU-hour a GPU
    # costs $1 a second, so cost_usd is 4 x makespan_s (to the 6 decimals of gpu_hours)
    out = _run(queue_trace, workers=2, prefill_workers=1, decode_workers=1, tp=2, price="h100=3600")
    assert out["gpu_hours"] == round(4 * out["makespan_s"] / 3600, 6) and out["gpu_hours"] > 0
    assert out["cost_usd"] == pytest.approx(out["gpu_hours"] * 3600, abs=1e-6)


def test_mixed_pools_are_billed_per_gpu(queue_trace):
    # --pool h100:tp1:1 --pool h200:tp1:1, round robin: 6 prefills of 11 ms each per worker (the linear model is the
    # same on both GPUs), last finish at 66 ms; each pool holds 1 GPU from 0 to 66 ms: 0.066 / 3600 = 1.83e-5 ->
    # 0.000018 GPU-hours each. Priced per GPU: 0.000018 x 36,000 + 0.000018 x 72,000 = 0.648 + 1.296 = $1.944; gpu_hours
    # is their sum, 0.000036
    out = _run(queue_trace, pools=("h100:tp1:1", "h200:tp1:1"), price="h100=36000,h200=72000")
    assert out["gpu_hours_by_gpu"] == {"h100": 0.000018, "h200": 0.000018}
    assert (out["gpu_hours"], out["cost_usd"]) == (0.000036, 1.944)
    assert out["price_source"] == {"h100": "--price", "h200": "--price"}


def test_a_price_names_a_gpu_of_some_pool(queue_trace):
    with pytest.raises(ValueError, match="a100-40gb: the run's GPUs are h100, h200"):
        _run(queue_trace, pools=("h100:tp1:1", "h200:tp1:1"), price="a100-40gb=3")
    with pytest.raises(ValueError, match="no price for GPU l4"):
        _run(queue_trace, pools=("h100:tp1:1", "l4:tp1:1"), price="table")


@pytest.mark.parametrize("text", ["", ",", " "])
def test_an_empty_price_is_refused_not_read_as_the_table(text):
    with pytest.raises(ValueError, match="give table or GPU=USD"):
        parse_prices(text)
    assert parse_prices("TABLE") == parse_prices("table") == {}  # --help writes TABLE


def test_a_gpu_file_is_priced_by_its_name_or_as_written(queue_trace, tmp_path):
    # --gpu h20.json: --price h20=36000 and --price h20.json=36000 price the same GPU (plan reads both too);
    # one worker, 132 ms: 0.000037 GPU-hours x $36,000 = $1.332
    gpu = tmp_path / "h20.json"
    gpu.write_text(json.dumps({"name": "h20", "memory_gb": 96, "bf16_tflops": 148, "hbm_gbps": 4000, "source": "s"}))
    for priced in ("h20=36000", f"{gpu}=36000"):
        out = _run(queue_trace, gpu=str(gpu), price=priced)
        assert (out["gpu_hours"], out["cost_usd"], out["price_source"]) == (0.000037, 1.332, {"h20": "--price"})
