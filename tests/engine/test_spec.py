"""Speculative decoding in the engine (issue 26): vLLM's scheduler/KV rules by hand, the acceptance model."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab.engine.spec import Acceptance, SpecDecoding, parse_acceptance, spec_metrics
from dynlab.engine.worker import EngineRequest, EngineWorker
from tests.engine.test_worker import Linear, run


def _reqs(block, *specs):
    return [EngineRequest(i, 0.0, n_in, n_out, list(range(100 * i, 100 * i + n_in // block)))
            for i, (n_in, n_out) in enumerate(specs)]


def _spec(method, k, acceptance="1.0", draws="seeded"):
    return SpecDecoding(method, k, Acceptance(parse_acceptance(acceptance, k), draws, seed=0))


def test_eagle_k2_on_a_3_block_pool_preempts_once():
    # block 4, two requests of 2 prompt tokens and 3 output tokens. Off: 4 tokens each, 1 block each.
    # EAGLE K=2: admission takes 2 + 2 lookahead = 4 slots (1 block each, 1 free); the first verify
    # step needs 2 + 3 + 2 = 7 slots = 2 blocks: A takes the free one, B finds none and preempts itself.
    w = EngineWorker(0, 3, 4, Linear(), spec=_spec("eagle", 2))
    reqs = _reqs(4, (2, 3), (2, 3))
    run(w, reqs, check=True)
    assert w.preemptions == 1 and [r.preemptions for r in reqs] == [0, 1]
    assert [r.generated for r in reqs] == [3, 3]  # never past output_length (A accepted 2, emitted 2)
    s = w.spec
    assert (s.num_drafts, s.draft_tokens, s.accepted_tokens) == (2, 4, 4)
    assert w.steps == 4  # prefill both; A verifies (B preempted); B recomputes 3 tokens; B verifies
    off = EngineWorker(0, 3, 4, Linear())
    reqs = _reqs(4, (2, 3), (2, 3))
    run(off, reqs, check=True)
    assert off.preemptions == 0


def test_k4_budget_cuts_a_verify_step():
    # budget 8: prefill 4 + 4; then A schedules 1 + 4 = 5, B the 3 left (1 + 2 drafts); all accepted
    lin = Linear()
    w = EngineWorker(0, 100, 16, lin, max_num_batched_tokens=8, spec=_spec("ngram", 4))
    reqs = _reqs(16, (4, 10), (4, 10))
    res = run(w, reqs, check=True)
    assert [r.batch_size for r in res] == [2, 2, 2, 1]
    assert [r.generated for r in reqs] == [10, 10]
    s = w.spec
    assert (s.num_drafts, s.draft_tokens, s.accepted_tokens) == (5, 16, 16)
    m = spec_metrics([s])
    assert m["mean_acceptance_length"] == 4.2  # 1 + 16 / 5
    assert m["spec_acceptance_per_position"] == [1.0, 1.0, 0.6, 0.6]
    # step 2: two decodes plus their drafts priced as chunks of 4 and 2 tokens: 10 + 0.01 * 6 + 2
    assert lin.batches[1].prefill_tokens == (4, 2) and lin.batches[1].decode_requests == 2
    assert res[1].end - res[1].start == pytest.approx(12.06)
    assert [r.finish_ms for r in reqs] == pytest.approx([10.08 + 12.06 * 2, 10.08 + 12.06 * 2 + 11.04])


def test_acceptance_shapes():
    assert parse_acceptance("0.5", 3) == (0.5, 0.25, 0.125)
    assert parse_acceptance("0.8,0.6", 2) == (0.8, 0.6)
    with pytest.raises(ValueError, match=r"3 per-position rates for --spec-tokens 2; give at most 2"):
        parse_acceptance("0.8,0.6,0.4", 2)  # the third rate would be dropped silently
    assert parse_acceptance("0.8,0.4", 3) == pytest.approx((0.8, 0.4, 0.2))
    with pytest.raises(ValueError, match="cannot increase"):
        parse_acceptance("0.4,0.6", 2)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        parse_acceptance("1.5", 2)


def test_acceptance_lengths_file(tmp_path):
    p = tmp_path / "len.txt"
    p.write_text("1 2 3\n3\n")
    assert parse_acceptance(f"file:{p}", 2) == (0.75, 0.5)  # lengths > 1: 3 of 4; > 2: 2 of 4
    p.write_text("1\n4\n")
    with pytest.raises(ValueError, match=r"len.txt:2: acceptance length 4 outside 1..3"):
        parse_acceptance(f"file:{p}", 2)


def test_expected_draws_accumulate():
    class R:
        spec_state = None
        id = 0
    acc, r = Acceptance((0.5, 0.25), "expected"), R()
    # E[a] = 0.75 per step: cumulative 0.75, 1.5, 2.25, 3.0 -> 0, 1, 1, 1
    assert [acc.accepted(r, 2) for _ in range(4)] == [0, 1, 1, 1]


@settings(max_examples=40)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=4), st.integers(0, 50))
def test_seeded_draws_follow_the_rates(rates, seed):
    rates = sorted(rates, reverse=True)
    acc = Acceptance(rates, "seeded", seed)

    class R:
        spec_state = None
        id = "r"
    a = [acc.accepted(R(), len(rates)) for _ in range(1)]
    assert all(0 <= x <= len(rates) for x in a)
    r1, r2 = R(), R()
    assert [acc.accepted(r1, len(rates)) for _ in range(5)] == [acc.accepted(r2, len(rates)) for _ in range(5)]


@settings(max_examples=30)
@given(st.integers(1, 4), st.sampled_from(["ngram", "eagle"]), st.integers(1, 6), st.integers(8, 40),
       st.lists(st.tuples(st.integers(1, 30), st.integers(1, 20)), min_size=1, max_size=5))
def test_spec_runs_finish_every_request_exactly(k, method, cap, budget, specs):
    w = EngineWorker(0, cap + 8, 4, Linear(), max_num_batched_tokens=budget,
                     spec=_spec(method, k, "0.7", "seeded"))
    reqs = _reqs(4, *specs)
    run(w, reqs, check=True)
    for r in reqs:
        assert r.rejected or r.generated == r.output_length


MOON = "".join(f'{{"timestamp": {t}, "input_length": {n}, "output_length": 6, "hash_ids": {ids}}}\n'
               for t, n, ids in [(0, 1024, [1, 2]), (50, 1536, [1, 2, 3]), (90, 600, [7, 8])])


def _cli(tmp_path, *args):
    import json

    from click.testing import CliRunner

    from dynlab.cli import main

    (tmp_path / "m.jsonl").write_text(MOON)
    out = CliRunner().invoke(main, [*args[:1], "--trace", str(tmp_path / "m.jsonl"), "--timing", *args[1:]])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout) if args[0] == "sim" else out.stdout  # stdout: a warning goes to stderr


def test_pd_decode_pool_speculates(tmp_path):
    # the prefill worker computes the prompt and the first token; the decode worker verifies drafts:
    # 5 tokens left per request at K = 2, all accepted (rate 1): 3 + 2 emitted, two verify steps each
    r = _cli(tmp_path, "sim", "--split", "1:1", "--spec-method", "eagle", "--spec-tokens", "2",
             "--spec-acceptance", "1.0")
    assert r["spec_draft_tokens"] == 3 * 4 and r["spec_accepted_tokens"] == 3 * 4
    assert r["mean_acceptance_length"] == 3.0 and r["spec_acceptance_per_position"] == [1.0, 1.0]


def test_sim_keys_and_compare(tmp_path):
    r = _cli(tmp_path, "sim", "--spec-method", "mtp", "--spec-tokens", "3", "--spec-acceptance", "0.8,0.6,0.4",
             "--spec-draws", "expected")
    assert (r["spec_method"], r["spec_tokens"], r["spec_lookahead_tokens"], r["spec_rates"]) == ("mtp", 3, 3, [0.8, 0.6, 0.4])
    assert r["spec_draws"] == "expected"
    text = _cli(tmp_path, "compare", "--spec-method", "eagle3", "--spec-tokens", "0,2", "--spec-acceptance", "0.8,0.6")
    assert "spec_tokens" in text or "--spec-tokens" in text


@pytest.mark.parametrize("value, words", [
    ("0.4,0.6", "rates cannot increase"),
    ("file:{tmp}/len.txt", "len.txt:2: 'x' is not an acceptance length"),
    ("file:{tmp}/missing.txt", "cannot read"),
    ("0.9,0.8,0.7", "3 per-position rates for --spec-tokens 2; give at most 2"),
])
def test_a_bad_acceptance_is_one_line(tmp_path, value, words):
    from click.testing import CliRunner

    from dynlab.cli import main

    (tmp_path / "len.txt").write_text("1 2\nx\n")
    out = CliRunner().invoke(main, ["sim", "--timing", "--spec-method", "eagle", "--spec-tokens", "2",
                                    "--spec-acceptance", value.format(tmp=tmp_path), "--quiet"])
    assert out.exit_code == 2
    (line,) = out.output.strip().splitlines()
    assert line.startswith("Error: ") and words in line


def test_compare_over_k_gives_each_run_its_first_k_rates(tmp_path):
    import json

    text = _cli(tmp_path, "compare", "--spec-method", "eagle", "--spec-tokens", "0,2,3",
                "--spec-acceptance", "0.9,0.8,0.7")
    runs = json.loads(text)
    assert runs["2"]["spec_rates"] == [0.9, 0.8] and runs["3"]["spec_rates"] == [0.9, 0.8, 0.7]
    assert "spec_rates" not in runs["0"]


def test_linear_spec_gamma_prices_the_drafter():
    from dynlab.engine.spec import drafter_ms
    from dynlab_builtins.latency import Linear

    opts = {"beta0": 4.0, "beta1": 0.0, "beta2": 1.0, "spec_gamma": 0.5}
    lin = Linear(None, opts)
    # 0.5 ms x K = 3 drafts x 4 decoding requests = 6 ms; ngram's lookup is free; no decode, no drafter
    assert drafter_ms(lin, "eagle", 3, 4, 4096) == 6.0
    assert drafter_ms(lin, "ngram", 3, 4, 4096) == 0.0 and drafter_ms(lin, "mtp", 3, 0, 0) == 0.0
    # without spec_gamma: dynlab's rule, K decode steps (4 + 1 x 4 = 8 ms each) over 32 layers
    plain = Linear(None, {**opts, "spec_gamma": None})
    assert drafter_ms(plain, "eagle", 2, 4, 4096) == 2 * 8.0 / 32


def test_spec_gamma_prices_the_drafter_and_the_draft_model_sizes_the_pool():
    # llama-3.1-8b on one h100: 29,205 blocks without a draft, 15,273 with qwen3-0.6b's weights and KV
    # (docs/engine.md); spec_gamma prices the drafter, so no line says the roofline priced the draft
    import json

    from click.testing import CliRunner

    from dynlab.cli import main

    base = ["sim", "--timing", "--latency-model", "linear", "--latency-opt", "spec_gamma=0.5", "--spec-method",
            "draft", "--spec-tokens", "2"]
    runs = [CliRunner().invoke(main, base + extra) for extra in ([], ["--spec-model", "qwen3-0.6b"])]
    assert [r.exit_code for r in runs] == [0, 0]
    (plain, draft) = [json.loads(r.stdout) for r in runs]
    assert (plain["kv_blocks"], draft["kv_blocks"]) == (29205, 15273)
    assert draft["spec_model"] == "qwen3-0.6b" and draft.get("latency_domain") is None
    assert "qwen3-0.6b" in draft["kv_blocks_source"]


def test_a_comparison_over_k_runs_its_k0_baseline_without_spec_gamma(tmp_path):
    # compare --spec-tokens 0,2 / sweep --grid spec-tokens=0,2 with linear's spec_gamma: the K = 0 run is the
    # baseline without the spec options, spec_gamma (a drafter's price) among them; it was refused
    import json

    from click.testing import CliRunner

    from dynlab.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {5 * i}, "input_length": 40, "output_length": 4, "hash_ids": [1]}}\n'
                             for i in range(2)))
    base = ["--trace", str(trace), "--timing", "--latency-model", "linear", "--latency-opt", "spec_gamma=0.5",
            "--spec-method", "eagle", "--quiet"]
    r = CliRunner().invoke(main, ["compare", *base, "--spec-tokens", "0,2", "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert "spec_method" not in out["0"] and out["2"]["spec_tokens"] == 2
    alone = CliRunner().invoke(main, ["sim", *base[:5], "--quiet"])  # the baseline as its own run
    assert alone.exit_code == 0, alone.output
    assert json.loads(alone.stdout) == out["0"]
    r = CliRunner().invoke(main, ["sweep", *base, "--grid", "spec-tokens=0,2"])
    assert r.exit_code == 0, r.output
    cells = sorted((json.loads(line) for line in r.stdout.splitlines()), key=lambda c: c["result"].get("spec_tokens", 0))
    assert [c["result"] for c in cells] == [out["0"], out["2"]]  # sweep streams cells as they finish


@pytest.mark.parametrize("extra", [[], ["--spec-method", "ngram", "--spec-tokens", "2"]])
def test_spec_gamma_without_a_drafter_is_refused(extra):
    from click.testing import CliRunner

    from dynlab.cli import main

    out = CliRunner().invoke(main, ["sim", "--timing", "--latency-model", "linear", *extra,
                                    "--latency-opt", "spec_gamma=0.5", "--quiet"])
    assert out.exit_code == 2
    assert "spec_gamma without a drafter to price" in out.output.strip().splitlines()[-1]


def test_spec_model_prices_the_draft_with_its_own_config():
    from dynlab.engine.spec import drafter_ms
    from dynlab.latency.base import StepBatch
    from dynlab.latency.grid import build_latency_model, hardware_for

    target = build_latency_model("roofline", hardware_for("llama-3.1-8b", "h100", 1))
    draft = build_latency_model("roofline", hardware_for("qwen3-0.6b", "h100", 1))
    one = draft.step_ms(StepBatch((), (), 8, 8 * 2048))
    # K = 3 steps of the draft model at the target's batch (8 decodes, 2,048 tokens of context each)
    assert drafter_ms(target, "draft", 3, 8, 8 * 2048, draft) == 3 * one
    # without --spec-model: a tenth of the target's decode step, K times
    t_one = target.step_ms(StepBatch((), (), 8, 8 * 2048))
    assert drafter_ms(target, "draft", 3, 8, 8 * 2048) == 3 * t_one / 10.0
    # the draft model is smaller: its step is cheaper than the target's
    assert one < t_one


def test_spec_model_key_and_an_unknown_model_is_one_line(tmp_path):
    r = _cli(tmp_path, "sim", "--spec-method", "draft", "--spec-tokens", "2", "--spec-model", "qwen3-0.6b")
    assert r["spec_model"] == "qwen3-0.6b"
    from click.testing import CliRunner

    from dynlab.cli import main

    out = CliRunner().invoke(main, ["sim", "--timing", "--spec-method", "draft", "--spec-tokens", "2",
                                    "--spec-model", "nope", "--quiet"])
    assert out.exit_code == 2  # a usage error, as --model nope
    (line,) = out.output.strip().splitlines()
    assert line.startswith("Error: unknown model 'nope'")


def test_spec_model_under_another_latency_model_says_the_draft_is_roofline(tmp_path):
    import json

    from click.testing import CliRunner

    from dynlab.cli import main

    (tmp_path / "m.jsonl").write_text(MOON)
    args = ["sim", "--trace", str(tmp_path / "m.jsonl"), "--timing", "--spec-method", "draft", "--spec-tokens", "2",
            "--spec-model", "qwen3-0.6b"]
    out = CliRunner().invoke(main, args + ["--latency-model", "linear"])
    assert out.exit_code == 0, out.output
    why = "the draft's steps (--spec-model qwen3-0.6b) are priced by the roofline, the target's by linear"
    assert why in json.loads(out.stdout)["latency_domain"] and why in out.stderr  # the key and a warning
    assert "latency_domain" not in _cli(tmp_path, *args[:1], *args[4:])  # the roofline prices both


@pytest.mark.parametrize("draft, warned", [("llama-3.1-70b", True), ("llama-3.1-8b", True), ("qwen3-0.6b", False)])
def test_a_draft_model_not_smaller_than_the_target_warns_once(tmp_path, draft, warned):
    """llama-3.1-8b serves on 4 GPUs (a 70B draft beside it does not fit one H100); a draft of 70B (141.1 GB of
    weights) or of the target itself (16.1 GB) reads at least the target's weights per draft step, so it is
    warned about in one line; Qwen3-0.6B is not (the run goes on)."""
    from click.testing import CliRunner

    from dynlab.cli import main

    (tmp_path / "m.jsonl").write_text(MOON)
    out = CliRunner().invoke(main, ["sim", "--trace", str(tmp_path / "m.jsonl"), "--timing", "--spec-method", "draft",
                                    "--spec-tokens", "2", "--spec-model", draft, "--mode", "rr", "--tp", "4", "--quiet"])
    assert out.exit_code == 0, out.output
    lines = [x for x in out.stderr.splitlines() if "--spec-model" in x]
    if warned:
        (line,) = lines
        assert line.startswith(f"Warning: --spec-model {draft} (") and "is not smaller than --model llama-3.1-8b (16.1 GB)" in line
    else:
        assert lines == []


@pytest.mark.parametrize("make, code", [
    (lambda d: "nope", 2),                                   # unknown name: a usage error
    (lambda d: str(d / "missing.json"), 2),                  # a file that cannot be opened (InputFileError)
    (lambda d: str(d), 2),                                   # a directory without config.json
    (lambda d: _write(d / "bad.json", "{bad"), 1),           # a file that opens but holds a bad config,
    (lambda d: _write(d / "odd.json", '{"a": 1}'), 1),       # as every command that reads one (commands.md)
])
def test_spec_model_errors_exit_as_model_errors_do(tmp_path, make, code):
    """--spec-model reads a model as --model does, so each error is the same one line and exit code: 2 for
    a usage error (a name, a path that cannot be opened), 1 for a config.json whose content is bad."""
    from click.testing import CliRunner

    from dynlab.cli import main

    (tmp_path / "m.jsonl").write_text(MOON)
    value = make(tmp_path)
    base = ["sim", "--trace", str(tmp_path / "m.jsonl"), "--timing", "--quiet"]
    spec = CliRunner().invoke(main, base + ["--spec-method", "draft", "--spec-tokens", "2", "--spec-model", value])
    model = CliRunner().invoke(main, base + ["--model", value])
    assert spec.exit_code == model.exit_code == code, (spec.output, model.output)
    (line,) = spec.stderr.strip().splitlines()
    assert line.startswith("Error: ") and line == model.stderr.strip()


def _write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_compare_caps_a_file_of_acceptance_lengths_per_k(tmp_path):
    """Lengths 1 2 3 5 5 4 1 (measured at K = 4): at K = 4, r_i = the share longer than i = 5/7, 4/7, 3/7, 2/7.
    compare --spec-tokens 2,4 gives the K = 2 run the first two, which is the file capped at K + 1 = 3
    (1 2 3 3 3 3 1: 5/7, 4/7); alone, a K = 2 run refuses the file (a length of 5 cannot happen at K = 2)."""
    import dataclasses

    from dynlab.engine.config import SimConfig
    from dynlab.engine.spec import align_rates

    path = tmp_path / "lengths.txt"
    path.write_text("1 2 3 5 5\n4 1\n")
    text = f"file:{path}"
    base = SimConfig(timing=True, spec_method="eagle", spec_acceptance=text)
    k2, k4 = align_rates([dataclasses.replace(base, spec_tokens=k) for k in (2, 4)])
    assert k4.spec_acceptance == text
    assert parse_acceptance(k2.spec_acceptance, 2) == (5 / 7, 4 / 7)
    (path.parent / "capped.txt").write_text("1 2 3 3 3\n3 1\n")
    assert parse_acceptance(f"file:{path.parent / 'capped.txt'}", 2) == (5 / 7, 4 / 7)
    with pytest.raises(ValueError, match=r"lengths.txt:1: acceptance length 5 outside 1..3 \(K = 2\)"):
        parse_acceptance(text, 2)
    # a file that does not fit the largest K is refused at that K, whatever the order of the runs
    for ks in ((2, 3), (3, 2), (0, 2, 3)):
        with pytest.raises(ValueError, match=r"lengths.txt:1: acceptance length 5 outside 1..4 \(K = 3\)"):
            align_rates([dataclasses.replace(base, spec_tokens=k) for k in ks])


def test_compare_refuses_a_file_of_lengths_at_the_largest_k(tmp_path):
    """A fresh user's trial: compare --spec-tokens 0,2,4 on a file holding a length 6 named K = 2's limit
    (1..3), the first run to read it; the limit is the largest K's, 1..5 (K = 4); sweep's grid alike."""
    from click.testing import CliRunner

    from dynlab.cli import main

    (tmp_path / "acc6.txt").write_text("2\n6\n")
    spec = ["--timing", "--spec-method", "eagle", "--spec-acceptance", f"file:{tmp_path / 'acc6.txt'}"]
    want = f"Error: {tmp_path / 'acc6.txt'}:2: acceptance length 6 outside 1..5 (K = 4)"
    for ks in ("0,2,4", "4,2"):
        r = CliRunner().invoke(main, ["compare", "--spec-tokens", ks] + spec)
        assert (r.exit_code, r.stderr.strip().splitlines()[-1]) == (2, want)
    r = CliRunner().invoke(main, ["sweep", "--executor", "serial", "--quiet", "--grid", "spec_tokens=2,4"] + spec)
    assert (r.exit_code, r.stderr.strip().splitlines()[-1]) == (2, want)


def test_compare_table_of_k_values_has_tpot_p99_and_acceptance_length():
    """compare --spec-tokens 0,2: the K = 0 run has no acceptance length ("-"); the acceptance length appears
    only when some run speculates (TPOT p99 is in every timed table since issue 43)."""
    from dynlab.cli.routing import _format_table

    def run(tpot, ttft, **spec):
        return {"requests": 3, "ttft_ms": {"p50": ttft, "p99": 2 * ttft}, "tpot_ms": {"p50": tpot, "p99": 3 * tpot},
                "goodput": 0.5, **spec}

    header, k0, k2 = _format_table({"0": run(8.0, 100.0), "2": run(4.0, 90.0, mean_acceptance_length=2.44)}).splitlines()
    cols = header.split()
    assert cols[cols.index("tpot_p50_ms"):] == ["tpot_p50_ms", "tpot_p99_ms", "accept_len", "goodput"]
    assert dict(zip(cols, k0.split())) == {"run": "0", "requests": "3", "ttft_p50_ms": "100.0", "ttft_p99_ms": "200.0",
                                           "tpot_p50_ms": "8.0", "tpot_p99_ms": "24.0", "accept_len": "-",
                                           "goodput": "0.5"}
    assert dict(zip(cols, k2.split()))["accept_len"] == "2.44"
    plain = _format_table({"0": run(8.0, 100.0)}).split()
    assert "tpot_p99_ms" in plain and "accept_len" not in plain
