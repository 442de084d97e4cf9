"""Admission policies at the gateway (issue 39 item 2, issue 42 item 3): ``--admission-policy``.

Hand cases on the linear step model 10 ms + 1 ms per prefill token + 2 ms per decode request, every overhead
term off, 16-token prompts of fresh tokens (no hit); figures derived in the comments.
"""
from __future__ import annotations

import json

import pytest

from dynlab import plugins
from dynlab.engine.config import SimConfig
from dynlab.engine.gateway import AdmissionPolicy, parse_policy
from dynlab.sim.topology import build_policy
from dynlab.routing.strategy import request_class, request_tenant
from dynlab.sim import run
from dynlab.sim.records import RequestRecorder
from helpers import invoke, terms_off

LINEAR = {"latency_model": "linear", **terms_off("linear", {"beta0": 10, "beta1": 1, "beta2": 2})}


def _row(i, t, out=4, **attrs):
    return {"timestamp": t, "tokens": list(range(100 * i + 1, 100 * i + 17)), "output_length": out, **attrs}


def _serve(tmp_path, rows, policy, **kw):
    """``(summary, records)`` of ``rows`` on one worker behind ``policy``."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = RequestRecorder()
    config = SimConfig(trace=str(path), trace_format="tokens", timing=True, mode="rr",
                       admission_policy=policy, **{"capacity": 64, "workers": 1, **LINEAR, **kw})
    out = run(config, recorders=[records])
    return out, list(records.records())


# R0 (chat) at 0 prefills 0-26: queued (admitted, no first token) until 26. R1 (chat) at 1 finds chat's queue
# full (1 of limit 1): shed. R2 (batch) at 2: batch's queue is empty: admitted, prefilled with R0's decode
# 26-54 (10 + 16 + 2). R3 (chat) at 30: R0 has its first token, chat's queue is empty again: admitted.
QUEUE = [_row(0, 0, **{"class": "chat"}), _row(1, 1, **{"class": "chat"}), _row(2, 2, **{"class": "batch"}),
         _row(3, 30, **{"class": "chat"})]


def test_queue_bound_sheds_over_the_class_limit_and_goodput_counts_it(tmp_path):
    out, recs = _serve(tmp_path, QUEUE, "queue-bound:limit=1", slo_ttft_ms=1000)
    assert (out["admission_policy"], out["shed"], out["rejected"]) == ("queue-bound:limit=1", 1, 0)
    assert [r.get("shed", False) for r in recs] == [False, True, False, False]
    assert recs[1]["worker"] is None and recs[1]["first_token_ms"] is None and recs[1]["arrival_ms"] == 1.0
    assert recs[0]["first_token_ms"] == 26.0 and recs[2]["first_token_ms"] == 54.0
    assert out["goodput"] == 0.75  # three of four meet 1,000 ms: the shed one fails, as a rejected one does
    assert out["requests"] == 3  # routed


def test_queue_bound_takes_a_limit_per_class(tmp_path):
    """limit.chat=2: R1 joins R0 in chat's queue; batch keeps the default limit 1 (its one request enters)."""
    out, _ = _serve(tmp_path, QUEUE, "queue-bound:limit=1,limit.chat=2")
    assert out["shed"] == 0
    out, _ = _serve(tmp_path, QUEUE, "queue-bound:limit.batch=1")  # chat has no limit at all
    assert out["shed"] == 0


# Tenant a: 10 requests/s, bursts of 2 (the bucket starts full). At 0: 2 -> 1, admitted; at 1 ms: 1 + 0.01 =
# 1.01 -> 0.01, admitted; at 2 ms: 0.02 < 1, shed; at 150 ms: 0.02 + 1.48 = 1.5 -> 0.5, admitted; at 160 ms:
# 0.5 + 0.1 = 0.6, shed. Tenant b (no rate of its own, no default rate): never limited.
BUCKET = [_row(0, 0, tenant="a"), _row(1, 1, tenant="a"), _row(2, 2, tenant="a"), _row(3, 3, tenant="b"),
          _row(4, 150, tenant="a"), _row(5, 160, tenant="a")]


def test_token_bucket_sheds_a_tenant_over_its_rate(tmp_path):
    out, recs = _serve(tmp_path, BUCKET, "token-bucket:rate.a=10,burst=2")
    assert out["shed"] == 2
    assert [r.get("shed", False) for r in recs] == [False, False, True, False, False, True]


def test_token_bucket_default_rate_covers_every_tenant_and_user(tmp_path):
    """rate=1000/s, bursts of 1: one token per ms. Arrivals 0, 1, 2, 3 ms (a, a, a, b): each finds its
    tenant's bucket refilled (a: 1 ms later, 1 token); 150, 160: refilled. Nothing shed."""
    out, _ = _serve(tmp_path, BUCKET, "token-bucket:rate=1000")
    assert out["shed"] == 0


def test_closed_loop_users_move_on_after_a_shed_request(tmp_path):
    """Two users, six requests, one queued request at most: every request is either served or shed, and the
    run ends (a shed request's user sends its next one at once, as after a rejection)."""
    rows = [_row(i, 0) for i in range(6)]
    out, recs = _serve(tmp_path, rows, "queue-bound:limit=1", concurrency=2)
    served = [r for r in recs if r["finish_ms"] is not None]
    assert out["shed"] >= 1 and len(served) + out["shed"] == 6


def test_always_is_no_gateway_and_the_output_is_unchanged(tmp_path):
    plain, recs = _serve(tmp_path, QUEUE, "always")
    assert "shed" not in plain and "admission_policy" not in plain
    assert build_policy("always") is None
    assert not any("shed" in r for r in recs)


def test_a_pd_fleet_sheds_at_its_gateway_too(tmp_path):
    out, recs = _serve(tmp_path, QUEUE, "queue-bound:limit=1", split="1:1", workers=2)
    assert out["shed"] == 1 and recs[1].get("shed") is True


@pytest.mark.parametrize("spec, words", [
    ("queue-bound", "give limit=N (every class) or limit.CLASS=N"),
    ("queue-bound:lim=2", "unknown option 'lim'"),
    ("queue-bound:limit=0", "limit=0 must be an integer >= 1"),
    ("token-bucket:rate=x", "rate=x must be a finite number >= 0"),
    ("token-bucket:burst=2", "give rate=R requests/s"),
    ("nope", "unknown admission policy 'nope'; available: always, queue-bound, token-bucket"),
    ("always:x=1", "always takes no options"),
    (":x=1", "give NAME or NAME:KEY=VALUE"),
    ("queue-bound:limit", "'limit' is not KEY=VALUE"),
    ("queue-bound:limit=1,limit=2", "limit is given twice"),
    ("queue-bound:limit=1,,", "'' is not KEY=VALUE"),
    ("queue-bound:limit=1.5", "limit=1.5 must be an integer >= 1"),
    ("queue-bound:limit.chat=0", "limit.chat=0 must be an integer >= 1"),
])
def test_a_bad_policy_is_one_line_exit_2(spec, words):
    res = invoke("sim", "--timing", "--admission-policy", spec)
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert words in line
    with pytest.raises(ValueError, match="admission policy"):
        build_policy(spec)  # what the run builds (the CLI checks it as it parses)


def test_the_policy_without_timing_is_refused():
    res = invoke("sim", "--admission-policy", "queue-bound:limit=1")
    assert res.exit_code == 2
    assert "--admission-policy has no effect without --timing" in res.stderr


def test_parse_and_attributes():
    assert parse_policy("token-bucket: rate=2 , burst=3") == ("token-bucket", {"rate": "2", "burst": "3"})
    assert request_class({}) == "default" and request_class({"class": "chat"}) == "chat"
    assert request_tenant({"user": "u"}) == "u" and request_tenant({"tenant": "t", "user": "u"}) == "t"


@pytest.mark.parametrize("name", plugins.admission_policies().names())
def test_every_policy_is_an_admission_policy(name):
    cls = plugins.admission_policies().get(name)
    assert issubclass(cls, AdmissionPolicy) and cls.name == name


def test_a_sweep_grid_of_policies_with_commas_points_to_a_grid_file():
    res = invoke("sweep", "--grid", "admission-policy=always,token-bucket:rate=10,burst=2", "--dry-run")
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    assert "values hold commas: give this axis in a --grid-file" in res.stderr


def test_compare_tables_show_the_shed_requests(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in QUEUE))
    res = invoke("compare", "--timing", "--workers", "1", "--trace", str(path), "--trace-format", "tokens",
                 "--admission-policy", "queue-bound:limit=1", "--modes", "rr,kv", "--format", "table", "--quiet")
    assert res.exit_code == 0, res.stderr
    head, *rows = [line.split() for line in res.stdout.splitlines()]
    assert [row[head.index("shed")] for row in rows] == ["1", "1"]
