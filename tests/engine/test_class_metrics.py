"""Per-class and per-tenant figures (issue 42 item 2): ``by_class``, ``by_tenant``, ``--slo CLASS:...``.

Linear step model 10 ms + 1 ms per prefill token + 2 ms per decode request, every overhead term off, one
worker, 16-token prompts of fresh tokens. Figures derived in the comments.
"""
from __future__ import annotations

import json

import pytest

from dynlab.engine.class_metrics import parse_class_slos
from dynlab.engine.config import SimConfig
from dynlab.sim import run
from helpers import invoke, terms_off

LINEAR = {"latency_model": "linear", **terms_off("linear", {"beta0": 10, "beta1": 1, "beta2": 2})}


def _row(i, t, out, **attrs):
    return {"timestamp": t, "tokens": list(range(100 * i + 1, 100 * i + 17)), "output_length": out, **attrs}


# chat1 (tenant a) and batch (tenant b) at 0: one 32-token prefill step, 10 + 32 = 42 ms (TTFT 42 each), then
# three steps of two decodes, 10 + 4 = 14 ms each: finish at 84, TPOT (84 - 42) / 3 = 14. chat2 (tenant a) at
# 100: prefill 10 + 16 = 26 (TTFT 26), one decode 12 ms: TPOT 12.
ROWS = [_row(0, 0, 4, **{"class": "chat", "tenant": "a"}), _row(1, 0, 4, **{"class": "batch", "tenant": "b"}),
        _row(2, 100, 2, **{"class": "chat", "tenant": "a"})]


def _run(tmp_path, rows=ROWS, **kw):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run(SimConfig(trace=str(path), trace_format="tokens", timing=True, workers=1, mode="rr", capacity=64,
                         **LINEAR, **kw))


def test_by_class_and_by_tenant_give_each_its_figures(tmp_path):
    out = _run(tmp_path)
    chat, batch = out["by_class"]["chat"], out["by_class"]["batch"]
    assert list(out["by_class"]) == ["chat", "batch"]  # the order classes first arrive
    assert (chat["requests"], chat["shed"], chat["ttft_ms"]["mean"], chat["tpot_ms"]["mean"]) == (2, 0, 34.0, 13.0)
    assert (batch["requests"], batch["ttft_ms"]["mean"], batch["tpot_ms"]["mean"]) == (1, 42.0, 14.0)
    assert chat["goodput"] is None and batch["goodput"] is None  # no SLO at all
    assert list(out["by_tenant"]) == ["a", "b"] and out["by_tenant"]["a"]["requests"] == 2
    assert "goodput" not in out


def test_a_class_slo_sets_its_goodput_and_the_runs(tmp_path):
    """--slo chat:ttft_ms=30: chat1 (42) fails, chat2 (26) meets: chat 0.5. batch has no SLO of its own nor
    a run-wide one: it meets (no constraint), its own goodput null. The run: 2 of 3."""
    out = _run(tmp_path, slo_classes="chat:ttft_ms=30")
    assert out["by_class"]["chat"]["goodput"] == 0.5 and out["by_class"]["batch"]["goodput"] is None
    assert out["goodput"] == 0.6667
    assert out["by_tenant"]["a"]["goodput"] is None  # tenants take the run-wide SLOs only


def test_classes_without_their_own_slo_take_the_runs(tmp_path):
    """--slo chat:ttft_ms=30 --slo-ttft-ms 40: batch (42 > 40) now fails: batch 0.0, the run 1 of 3; tenant a
    on 40 ms: chat1 fails, chat2 meets (0.5); tenant b 0.0."""
    out = _run(tmp_path, slo_classes="chat:ttft_ms=30", slo_ttft_ms=40)
    assert out["by_class"]["batch"]["goodput"] == 0.0 and out["goodput"] == 0.3333
    assert out["by_tenant"]["a"]["goodput"] == 0.5 and out["by_tenant"]["b"]["goodput"] == 0.0


def test_a_tpot_class_slo(tmp_path):
    """--slo chat:tpot_ms=12.5: chat1's TPOT 14 fails, chat2's 12 meets."""
    out = _run(tmp_path, slo_classes="chat:tpot_ms=12.5")
    assert out["by_class"]["chat"]["goodput"] == 0.5


def test_without_class_or_tenant_no_key_is_added(tmp_path):
    rows = [{k: v for k, v in r.items() if k not in ("class", "tenant")} for r in ROWS]
    out = _run(tmp_path, rows)
    assert "by_class" not in out and "by_tenant" not in out


def test_a_user_is_a_tenant(tmp_path):
    rows = [_row(0, 0, 2, user="u1"), _row(1, 0, 2, user="u2")]
    out = _run(tmp_path, rows)
    assert list(out["by_tenant"]) == ["u1", "u2"] and "by_class" not in out


def test_shed_requests_count_in_their_class(tmp_path):
    """queue-bound:limit=1: batch's queue is its own; chat1 is queued until 42 when nothing else of chat came:
    no shed. With both chat requests at 0 the second is shed (chat's queue holds chat1 until its first token)."""
    rows = [_row(0, 0, 4, **{"class": "chat"}), _row(1, 0, 4, **{"class": "chat"}), _row(2, 0, 4, **{"class": "batch"})]
    out = _run(tmp_path, rows, admission_policy="queue-bound:limit=1")
    assert out["by_class"]["chat"]["shed"] == 1 and out["by_class"]["chat"]["requests"] == 2
    assert out["by_class"]["batch"]["shed"] == 0 and out["shed"] == 1


@pytest.mark.parametrize("text, words", [
    ("chat", "give CLASS:ttft_ms=X,tpot_ms=Y"),
    ("chat:x=1", "'x=1' is not ttft_ms=X or tpot_ms=Y"),
    ("chat:ttft_ms=-1", "ttft_ms must be a finite number of ms >= 0"),
    ("chat:ttft_ms=1;chat:tpot_ms=2", "class 'chat' is given twice"),
    ("chat:", "give ttft_ms=X, tpot_ms=Y or both"),
    ("chat:ttft_ms=5,ttft_ms=6", "ttft_ms is given twice"),
    ("", "give CLASS:ttft_ms=X,tpot_ms=Y"),
    (";;;", "--slo ';;;': give CLASS:ttft_ms=X,tpot_ms=Y"),  # no class at all (a fresh user's run went on)
])
def test_a_bad_class_slo_is_one_line_exit_2(text, words):
    res = invoke("sim", "--timing", "--slo", text)
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert words in line


def test_parse_class_slos():
    assert parse_class_slos("chat:ttft_ms=200,tpot_ms=30; batch:ttft_ms=5000") == {
        "chat": (200.0, 30.0), "batch": (5000.0, None)}
    assert parse_class_slos(None) == {}


def test_a_class_slo_no_request_carries_is_warned(tmp_path):
    from dynlab.engine.class_metrics import ClassWarning

    with pytest.warns(ClassWarning, match=r"--slo names 'voice', which no request of the run carries \(classes seen: "
                                          r"chat, batch\)"):
        _run(tmp_path, slo_classes="voice:ttft_ms=5")


def test_a_failed_request_is_left_out_of_its_class_as_out_of_the_run():
    """A failed request a trace recorded (--keep-failed: attribute failed) has no client figure in the run's
    ServingMetrics; its class leaves it out too: chat counts its one answered request only."""
    from types import SimpleNamespace

    from dynlab.engine.class_metrics import ClassMetrics

    def req(i, **attrs):
        return SimpleNamespace(id=i, attrs={"class": "chat", **attrs}, arrival_ms=0.0, first_token_ms=26.0,
                               output_length=2)

    m = ClassMetrics({"chat": (30.0, None)})
    answered, dead = req(0), req(1, failed=True)
    for r in (answered, dead):
        m.on_arrival(r, 0.0)
        m.on_finish(r, 38.0)
    chat = m.result([])["by_class"]["chat"]
    assert (chat["requests"], chat["ttft_ms"]["mean"], chat["tpot_ms"]["mean"], chat["goodput"]) == (1, 26.0, 12.0, 1.0)
