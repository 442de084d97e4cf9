"""The P/D fleet (dynlab.disagg.fleet): the issue's hand-computed case, the link rule (FIFO), decode-side
waiting, the decode routers, and invariants over random workloads (hypothesis)."""
from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab.engine.config import PdSection, SimConfig, SloSection
from dynlab.engine.env import RunEnv
from dynlab.engine.metrics import Recorder
from dynlab.engine.request import EngineRequest
from dynlab.engine.spec import Acceptance, SpecDecoding, parse_acceptance
from dynlab.engine.run import build_strategy
from dynlab.engine.worker import EngineWorker
from dynlab.latency.grid import build_latency_model, hardware_for
from dynlab.routing.strategy import Request

from helpers import invoke, pd_result, serve_disagg, terms_off, terms_off_args

KVB = 131_072  # llama-3.1-8b: 2 x 32 layers x 8 KV heads x 128 x 2 bytes
BLOCK = 16


def linear(b0=10.0, b1=0.01, b2=1.0):
    """The hand linear model with its server terms (step CPU time) off: a step costs its betas alone. (The
    library-level runs here have no front end or detokenisation: RunEnv.timed's defaults are 0.)"""
    opts = terms_off("linear", {"beta0": b0, "beta1": b1, "beta2": b2})["latency_opts"]
    return build_latency_model("linear", hardware_for("llama-3.1-8b"), opts)


def eagle(k):
    """EAGLE with ``k`` drafts per step (``k`` lookahead slots: a spare of ``2k``), acceptance 0.7; ``None`` for 0."""
    return SpecDecoding("eagle", k, Acceptance(parse_acceptance("0.7", k), "seeded", seed=0)) if k else None


def engines(n, capacity, handoff, latency=None, bulk=True, max_num_seqs=256, budget=8192, spec=0):
    """``spec``: EAGLE's drafts per step (:func:`eagle`), as the CLI speculates: on the decode pool only."""
    latency = latency or linear()
    return [EngineWorker(w, capacity, BLOCK, latency, handoff=handoff, bulk=bulk, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=budget, spec=None if handoff else eagle(spec)) for w in range(n)]


def names_of(req):
    return list(req.hashes[:req.input_length // BLOCK])


def serve(requests, prefill, decode, mode="rr", **kw):
    """``kw``: fields of the P/D section (``link_gbps=``, ``decode_router=`` ...)."""
    strategy = build_strategy(SimConfig(mode=mode, workers=len(prefill)), random.Random(0))
    return serve_disagg(requests, strategy, prefill, decode, names_of=names_of, kv_bytes_per_token=KVB,
                        pd=PdSection(**kw))


def request(i, t, n_in, n_out, prefix=None):
    prefix = i if prefix is None else prefix
    hashes = tuple(prefix * 10_000 + j for j in range(n_in // BLOCK))
    return Request(hashes, n_in, n_out, t, i)


def test_the_issue_hand_computed_case():
    # one 1,000-token request, output 10, linear beta0=10 beta1=0.01 beta2=1, llama-3.1-8b, 50 GB/s:
    # prefill step 10 + 0.01 x 1000 = 20 ms (the prefill side's TTFT); bytes 1000 x 131,072 = 131,072,000;
    # transfer 131,072,000 B / 50e9 B/s = 2.62144 ms; 9 decode steps of 10 + 1 x 1 = 11 ms from 22.62144:
    # the user's first token ends the first, at 22.62144 + 11 = 33.62144 (TTFT, issue 24)
    fleet = serve([request(0, 0.0, 1000, 10)], engines(1, 1000, True), engines(1, 1000, False), link_gbps=50)
    (rec,) = fleet.records.values()
    assert fleet.transfer.ttft_prefill == [20.0] and rec.prefill_done == 20.0
    assert fleet.serving.ttft == [pytest.approx(33.62144, abs=1e-12)]
    assert rec.first_token == rec.request.first_token_ms == fleet.serving.ttft[0]
    assert rec.nbytes == 131_072_000 == 1000 * KVB
    assert rec.transfer_ms == pytest.approx(2.62144, abs=1e-12)
    assert fleet.serving.e2e == [pytest.approx(121.62144, abs=1e-12)]
    assert rec.decode_wait_ms == 0.0
    # the prefill worker freed its blocks when the transfer ended, keeping them cached
    prefill = fleet.engines[0]
    assert prefill.used_blocks == 0 and prefill.pool.lookup(rec.request.names, 99) == 1000 // BLOCK
    assert fleet.decode[0].used_blocks == 0


def test_the_issue_case_through_the_command(tmp_path):
    trace = tmp_path / "one.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "tokens": list(range(1000)), "output_length": 10}) + "\n")
    result = invoke("sim", "--trace", str(trace), "--timing", "--prefill-workers", "1", "--decode-workers", "1",
                    "--model", "llama-3.1-8b", "--link-gbps", "50", "--latency-model", "linear",
                    "--latency-opt", "beta0=10", "--latency-opt", "beta1=0.01", "--latency-opt", "beta2=1",
                    *terms_off_args("linear"))  # every overhead term off: the hand case's times are the betas'
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    # the run JSON rounds percentiles to 0.1 ms (the exact values are tested through the library above)
    # TTFT the user's (33.62144), the prefill side's 20 ms its own key; TPOT (121.62144 - 33.62144) / 9 = 9.78
    assert out["ttft_ms"]["p50"] == 33.6 and out["e2e_ms"]["p50"] == 121.6 and out["tpot_ms"]["p50"] == 9.8
    assert out["ttft_prefill_ms"] == {"p50": 20.0, "p90": 20.0, "p99": 20.0, "mean": 20.0}
    assert out["transfer_bytes"] == 131_072_000 and out["transfer_ms"] == {"p50": 2.6, "p90": 2.6, "p99": 2.6,
                                                                          "mean": 2.6}
    assert out["decode_wait_ms"]["p99"] == 0.0 and out["transfers"] == 1 and out["link_sharing"] == "fifo"
    assert out["workers"] == 2 and out["prefill_workers"] == 1 and out["decode_workers"] == 1
    assert out["link_gbps"] == 50.0 and out["decode_router"] == "least-loaded"
    assert out["prefill_pool"]["workers"] == 1 and out["decode_pool"]["workers"] == 1
    # utilization: prefill busy 20 ms, decode busy 99 ms, over the span 121.62144 ms
    assert out["prefill_pool"]["utilization"] == round(20 / 121.62144, 4)
    assert out["decode_pool"]["utilization"] == round(99 / 121.62144, 4)
    assert out["output_tokens_per_s_per_gpu"] == round(10 / 0.12162144 / 2, 1)


def test_transfers_from_one_prefill_worker_share_its_link_first_come_first_served():
    # two 1,000-token requests prefilled in one step (10 + 0.01 x 2000 = 30 ms), each on its own decode worker:
    # d = 2.62144 ms each. FIFO: the first arrives at 30 + d, the second waits for the link: 30 + 2d.
    # (A fair share would deliver both at 30 + 2d.)
    d = 2.62144
    fleet = serve([request(0, 0.0, 1000, 2), request(1, 0.0, 1000, 2)], engines(1, 1000, True),
                  engines(2, 1000, False), decode_router="round-robin")
    a, b = fleet.records[0], fleet.records[1]
    assert (a.decode, b.decode) == (0, 1)
    assert a.arrived == pytest.approx(30 + d) and b.arrived == pytest.approx(30 + 2 * d)
    assert a.transfer_ms == pytest.approx(d) and b.transfer_ms == pytest.approx(2 * d)
    assert b.link_start == pytest.approx(a.link_end)
    # two prefill workers have two links: no queueing
    fleet = serve([request(0, 0.0, 1000, 2), request(1, 0.0, 1000, 2)], engines(2, 1000, True),
                  engines(2, 1000, False), decode_router="round-robin")
    assert [r.transfer_ms for r in fleet.records.values()] == [pytest.approx(d), pytest.approx(d)]


def test_link_latency_is_added_and_does_not_occupy_the_link():
    d = 2.62144
    fleet = serve([request(0, 0.0, 1000, 2), request(1, 0.0, 1000, 2)], engines(1, 1000, True),
                  engines(2, 1000, False), decode_router="round-robin", link_latency_ms=5.0)
    a, b = fleet.records[0], fleet.records[1]
    assert a.transfer_ms == pytest.approx(d + 5) and b.transfer_ms == pytest.approx(2 * d + 5)


def test_a_request_waits_for_decode_blocks():
    # two 100-token requests (output 3) prefilled together: 10 + 0.01 x 200 = 12 ms. The decode worker
    # holds 7 blocks = ceil(101 / 16), one request's KV and next token: A reserves at 12, its 100 x 131,072 B
    # take d = 0.262144 ms, then 2 decode steps of 11 ms: A finishes at 34.262144 and frees its blocks;
    # B reserves then (decode_wait 22.262144 ms), its transfer ends d later, it finishes 22 ms after that.
    d = 0.262144
    fleet = serve([request(0, 0.0, 100, 3), request(1, 0.0, 100, 3)], engines(1, 20, True), engines(1, 7, False))
    a, b = fleet.records[0], fleet.records[1]
    assert a.decode_wait_ms == 0.0 and b.decode_wait_ms == pytest.approx(22 + d)
    assert b.reserved == pytest.approx(34 + d) and b.arrived == pytest.approx(34 + 2 * d)
    assert sorted(fleet.serving.e2e) == [pytest.approx(34 + d), pytest.approx(56 + 2 * d)]
    assert fleet.decode[0].peak_used_blocks == 7
    out = fleet.result()
    assert out["decode_wait_ms"]["p99"] == round(0.99 * (22 + d), 1)  # inclusive quantile of [0, 22.26]


def test_overlap_transfer_hides_the_transfer_behind_the_prefill():
    # layer-pipelined: the transfer is requested when the prefill is scheduled (t=0) and ends with the prefill
    # (20 ms) since 2.62144 ms < 20 ms: decode starts at 20, E2E = 20 + 9 x 11 = 119
    fleet = serve([request(0, 0.0, 1000, 10)], engines(1, 1000, True), engines(1, 1000, False),
                  overlap_transfer=True)
    (rec,) = fleet.records.values()
    assert rec.reserved == 0.0 and rec.arrived == 20.0 and rec.transfer_ms == 20.0
    assert fleet.serving.e2e == [pytest.approx(119.0)]
    # a slow link: 131,072,000 B at 1 GB/s = 131.072 ms, past the prefill's end: E2E = 131.072 + 99
    fleet = serve([request(0, 0.0, 1000, 10)], engines(1, 1000, True), engines(1, 1000, False),
                  overlap_transfer=True, link_gbps=1.0)
    assert fleet.serving.e2e == [pytest.approx(131.072 + 99)]


def test_decode_prefix_cache_sends_only_the_blocks_the_decode_worker_lacks():
    # B shares A's first 4 blocks (64 tokens) and comes after A finished: 100 - 64 = 36 tokens sent
    reqs = [request(0, 0.0, 100, 2), Request(tuple(range(4)) + (99,) * 2, 100, 2, 1000.0, 1)]
    reqs[0] = Request(tuple(range(4)) + (7, 8), 100, 2, 0.0, 0)
    fleet = serve(reqs, engines(1, 100, True), engines(1, 100, False), decode_prefix_cache=True)
    a, b = fleet.records[0], fleet.records[1]
    assert (a.hit_tokens, b.hit_tokens) == (0, 64)
    assert (a.nbytes, b.nbytes) == (100 * KVB, 36 * KVB)
    fleet = serve(reqs, engines(1, 100, True), engines(1, 100, False))
    assert [r.nbytes for r in fleet.records.values()] == [100 * KVB, 100 * KVB]


@pytest.mark.parametrize("router, expected", [("round-robin", [0, 1, 0, 1]), ("least-loaded", [0, 1, 0, 1]),
                                              ("kv-usage", [0, 1, 1, 1])])
def test_decode_routers(router, expected):
    # four requests prefilled one after another (a step each, max 1 sequence); lengths 300, 100, 100, 100.
    # least-loaded: fewest unfinished requests, ties to the lowest id; kv-usage: lowest share of blocks in use
    # (worker 0 holds the 300-token request's ceil(301 / 16) = 19 blocks, worker 1 the 100-token ones' 7 each:
    # 7, then 14 < 19, so the fourth goes to worker 1 too, where least-loaded sends it to worker 0: 1 < 2 requests)
    reqs = [request(0, 0.0, 300, 50), request(1, 0.0, 100, 50), request(2, 0.0, 100, 50), request(3, 0.0, 100, 50)]
    fleet = serve(reqs, engines(1, 1000, True, max_num_seqs=1), engines(2, 1000, False), decode_router=router)
    assert [fleet.records[i].decode for i in range(4)] == expected


def test_one_token_requests_finish_on_the_prefill_worker():
    fleet = serve([request(0, 0.0, 100, 1)], engines(1, 100, True), engines(1, 100, False))
    assert fleet.records == {} and fleet.serving.e2e == [pytest.approx(11.0)]


# ------------------------------------------------------------------- a request the decode pool can never hold
class Rejects(Recorder):
    """The engine requests rejected, in order."""

    def __init__(self):
        self.rejected = []

    def on_reject(self, req):
        self.rejected.append(req)


def serve_slo(requests, prefill, decode, slo_ttft_ms):
    """:func:`serve` with a TTFT SLO (goodput) and a :class:`Rejects`; the trace's timestamps are the arrivals."""
    strategy = build_strategy(SimConfig(mode="rr", workers=len(prefill)), random.Random(0))
    env = RunEnv.timed(requests, strategy, len(prefill), slo=SloSection(slo_ttft_ms=slo_ttft_ms),
                       recorders=(Rejects(),))
    return serve_disagg(requests, strategy, prefill, decode, names_of=names_of, kv_bytes_per_token=KVB, env=env,
                        pd=PdSection(link_gbps=50))


def test_a_request_the_decode_pool_cannot_hold_is_rejected_at_arrival():
    # prefill pool 100 blocks (1,600 tokens), decode pool 10 blocks (160 tokens), block 16, linear beta0=10,
    # beta1=0.01, beta2=1, 50 GB/s (5e7 B/ms). A (0 ms, 100 in, 10 out: 109 tokens) fits both pools:
    # prefill 10 + 1 = 11 ms, transfer 100 x 131,072 B / 5e7 = 0.262144 ms, first decode step 11 ms:
    # TTFT 22.262144, E2E 11.262144 + 9 x 11 = 110.262144. B (1 ms, 200 in, 10 out: 209 tokens) fits the
    # prefill pool only: rejected at its arrival, no step. C (300 ms, 50 in, 2 out): prefill 10.5 ms,
    # transfer 0.131072 ms, one decode step 11 ms: TTFT = E2E = 21.631072. D (400 ms, 400 in, 1 out)
    # never needs the decode pool: it finishes on the prefill worker at 10 + 4 = 14 ms.
    reqs = [request(0, 0.0, 100, 10), request(1, 1.0, 200, 10), request(2, 300.0, 50, 2),
            request(3, 400.0, 400, 1)]
    fleet = serve_slo(reqs, engines(1, 100, True), engines(1, 10, False), slo_ttft_ms=30)
    ttft, e2e = [14.0, 21.631072, 22.262144], [14.0, 21.631072, 110.262144]
    assert sorted(fleet.serving.ttft) == pytest.approx(ttft, abs=1e-9)
    assert sorted(fleet.serving.e2e) == pytest.approx(e2e, abs=1e-9)
    assert fleet.serving.rejected == 1 and fleet.engines[0].rejected == 0  # rejected by the decode side
    assert sorted(fleet.records) == [0, 2]  # B is never handed off, never transferred
    assert fleet.prefill_fleet.routing.counts == [4]  # routed (and counted) as an aggregated rejection is
    assert fleet.engines[0].steps == 3  # A's, C's and D's prefills only: no work spent on B
    out = fleet.result()
    assert out["transfers"] == 2 and out["transfer_bytes"] == (100 + 50) * KVB
    result = fleet.serving.result(fleet.all_engines)
    # the others' figures are those of a run without B; B counts as a goodput miss (3 of 4 meet 30 ms)
    alone = serve_slo([r for r in reqs if r.index != 1], engines(1, 100, True), engines(1, 10, False), 30)
    assert fleet.serving.ttft == alone.serving.ttft and fleet.serving.e2e == alone.serving.e2e
    assert result["goodput"] == 0.75 and alone.serving.result(alone.all_engines)["goodput"] == 1.0
    assert result["rejected"] == 1 and result["prefix_hit_rate"] == 0.0
    (rejects,) = [r for r in fleet.env.recorders if isinstance(r, Rejects)]
    assert [r.id for r in rejects.rejected] == [1] and rejects.rejected[0].rejected  # (--requests-out's flag)


def test_every_decode_worker_must_hold_it():
    # decode workers of 10 and 6 blocks (160 and 96 tokens): the decode router may pick either, so a
    # request of 100 + 10 - 1 = 109 tokens is rejected; one of 80 + 10 - 1 = 89 is served
    reqs = [request(0, 0.0, 100, 10), request(1, 1.0, 80, 10)]
    decode = engines(1, 10, False) + [EngineWorker(1, 6, BLOCK, linear())]
    fleet = serve(reqs, engines(1, 100, True), decode, decode_router="round-robin")
    assert fleet.serving.rejected == 1 and fleet.engines[0].rejected == 0 and sorted(fleet.records) == [1]


def test_the_decode_side_speculative_spare_counts():
    # both pools 4 blocks (64 tokens); the decode pool speculates, EAGLE K=2 (2 lookahead slots): a spare
    # of 4. 40 in + 25 out - 1 = 64 tokens fit the prefill pool, 64 + 4 = 68 not the decode pool: rejected;
    # 40 + 21 - 1 + 4 = 64 fit both: served. An aggregated engine that speculates rejects the first too.
    reqs = [request(0, 0.0, 40, 25), request(1, 1.0, 40, 21)]
    fleet = serve(reqs, engines(1, 4, True), engines(1, 4, False, spec=2))
    assert fleet.serving.rejected == 1 and fleet.engines[0].rejected == 0 and sorted(fleet.records) == [1]
    assert len(fleet.serving.e2e) == 1 and fleet.records[1].request.generated == 21
    agg = engines(1, 4, False, spec=2)[0]
    assert not agg.submit(EngineRequest(0, 0.0, 40, 25, names_of(reqs[0])), 0.0)
    assert agg.submit(EngineRequest(1, 0.0, 40, 21, names_of(reqs[1])), 0.0)


def test_the_decode_side_speculative_spare_through_the_command(tmp_path):
    # the CLI gives both pools one size but speculates on the decode pool only: the case above, which
    # ended in "RuntimeError: worker 0: nothing schedulable although requests wait (bug)" before
    trace = tmp_path / "two.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "tokens": list(range(40)), "output_length": 25}) + "\n" +
                     json.dumps({"timestamp": 1, "tokens": list(range(1000, 1040)), "output_length": 21}) + "\n")
    args = ["sim", "--trace", str(trace), "--timing", "--prefill-workers", "1", "--decode-workers", "1",
            "--capacity", "4", "--block", "16", "--latency-model", "linear", "--spec-method", "eagle",
            "--spec-tokens", "2", "--slo-ttft-ms", "1000"]
    result = invoke(*args, "--requests-out", str(tmp_path / "reqs.jsonl"))
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["rejected"] == 1 and out["transfers"] == 1 and out["goodput"] == 0.5
    assert out["transfer_bytes"] == 40 * KVB
    recs = [json.loads(line) for line in (tmp_path / "reqs.jsonl").read_text().splitlines()]
    assert [(r["rejected"], r["decode_worker"], r["first_scheduled_ms"]) for r in recs] == [(True, None, None),
                                                                                          (False, 0, 1.0)]


def test_a_decode_reservation_holds_the_speculative_lookahead():
    # decode pool 4 blocks (64 tokens), EAGLE K = 1 (1 lookahead slot); two prompts of 31 tokens, 2 out, at 0 ms on
    # two prefill engines. Each fits alone (31 + 2 - 1 + 2 = 34 tokens). A reservation of prompt + 1 = 32 tokens
    # (2 blocks) each let both transfers in and filled the pool; admitting either then needed 32 + 1 = 33 tokens
    # (3 blocks): none free, nothing running: "nothing schedulable although requests wait (bug)". Reserving the
    # lookahead too (33 tokens, 3 blocks, as vLLM allocates a remote prefill's blocks with its lookahead slots), the
    # second transfer waits for the first request's blocks and both are served.
    reqs = [request(0, 0.0, 31, 2), request(1, 0.0, 31, 2)]
    fleet = serve(reqs, engines(2, 100, True), engines(1, 4, False, spec=1))
    assert fleet.serving.rejected == 0 and sorted(fleet.records) == [0, 1]
    assert all(fleet.records[i].request.generated == 2 for i in (0, 1))
    assert fleet.records[1].decode_wait_ms > 0  # its reservation waited for request 0's blocks


# ------------------------------------------------------------------------------------------ invariants
workloads = st.lists(
    st.tuples(st.integers(0, 40),  # inter-arrival ms
              st.integers(1, 300),  # prompt tokens (some never fit a pool of 9 to 30 blocks)
              st.integers(1, 6),  # output tokens
              st.integers(0, 3)),  # shared prefix id
    min_size=1, max_size=14)


def build(wl):
    reqs, t = [], 0.0
    for i, (gap, n_in, n_out, prefix) in enumerate(wl):
        t += gap
        # blocks of a shared prefix first, then the request's own
        hashes = tuple(prefix * 10_000 + j if j < 3 else i * 10_000 + 5_000 + j for j in range(n_in // BLOCK))
        reqs.append(Request(hashes, n_in, n_out, t, i))
    return reqs


@settings(max_examples=60)
@given(wl=workloads, p=st.integers(1, 3), d=st.integers(1, 3), pcap=st.integers(9, 30), dcap=st.integers(9, 30),
       overlap=st.booleans(), cache=st.booleans(), router=st.sampled_from(["least-loaded", "round-robin", "kv-usage"]),
       latency=st.sampled_from([0.0, 3.0]), seqs=st.integers(1, 4), spec=st.sampled_from([0, 0, 1, 2]))
def test_invariants(wl, p, d, pcap, dcap, overlap, cache, router, latency, seqs, spec):
    # dcap may be smaller than pcap, and the decode pool may speculate (a spare of 2 x spec slots)
    reqs = build(wl)
    prefill = engines(p, pcap, True, max_num_seqs=seqs, budget=64)
    decode = engines(d, dcap, False, max_num_seqs=seqs, budget=64, spec=spec)
    fleet = serve(reqs, prefill, decode, link_gbps=0.001, link_latency_ms=latency, overlap_transfer=overlap,
                  decode_prefix_cache=cache, decode_router=router)
    undecodable = {r.index for r in reqs if r.output_length > 1 and
                   r.input_length + r.output_length - 1 + 2 * spec > dcap * BLOCK}
    fits = [r for r in reqs if r.input_length + r.output_length - 1 <= pcap * BLOCK and r.index not in undecodable]
    served = {r.index for r in fits}
    # every request that fits is prefilled once (one first token), finishes once; the others are rejected,
    # those the decode pool could never hold at their arrival; served + rejected = all
    assert len(fleet.serving.ttft) == len(served) == len(fleet.serving.e2e)
    assert fleet.serving.rejected == len(reqs) - len(served)
    # the prefill engines rejected the others (the decode side's, at arrival, never reach a prefill engine)
    assert sum(e.rejected for e in fleet.engines) == len(reqs) - len(served) - len(undecodable)
    # every request with something to decode is transferred once, to one decode worker, and decoded there
    decoding = {r.index for r in fits if r.output_length > 1}
    assert set(fleet.records) == decoding
    for rec in fleet.records.values():
        r = rec.request
        assert rec.asked <= rec.reserved <= rec.link_start <= rec.link_end <= rec.arrived <= r.finish_ms
        assert rec.prefill_done <= rec.arrived and r.generated == r.output_length
        assert rec.nbytes == (r.input_length - rec.hit_tokens) * KVB
        assert rec.hit_tokens == 0 or cache
    assert fleet.dload == [0] * d and all(not q for q in fleet.pending)
    # transferred bytes = the requests' uncached KV bytes
    out = fleet.result()
    assert out["transfers"] == len(decoding)
    assert out["transfer_bytes"] == sum((rec.request.input_length - rec.hit_tokens) * KVB
                                        for rec in fleet.records.values())
    if not cache:
        assert out["transfer_bytes"] == sum(r.input_length * KVB for r in fits if r.output_length > 1)
    # no pool exceeds its blocks; at the end nothing is held, reserved or running
    for e in list(fleet.engines) + fleet.decode:
        e.check()
        assert e.peak_used_blocks <= e.capacity and e.used_blocks == 0 and e.idle
        assert not e.held and not e.reserved
    # FIFO on each prefill worker's link: transfers do not overlap on one link
    for w in range(p):
        spans = sorted((rec.link_start, rec.link_end) for rec in fleet.records.values() if rec.prefill == w)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))


@settings(max_examples=40)
@given(wl=workloads, overlap=st.booleans())
def test_step_by_step_equals_bulk_in_a_pd_fleet(wl, overlap):
    reqs = build(wl)
    runs = []
    for bulk in (True, False):
        fleet = serve(reqs, engines(2, 30, True, bulk=bulk), engines(2, 30, False, bulk=bulk),
                      overlap_transfer=overlap, link_gbps=0.01)
        runs.append(fleet)
    a, b = runs
    assert a.serving.ttft == pytest.approx(b.serving.ttft)
    assert sorted(a.serving.e2e) == pytest.approx(sorted(b.serving.e2e))
    assert {k: r.nbytes for k, r in a.records.items()} == {k: r.nbytes for k, r in b.records.items()}


def test_pd_result_keys():
    strategy = build_strategy(SimConfig(mode="rr", workers=1), random.Random(0))
    out = pd_result(serve_disagg([request(0, 0.0, 100, 3)], strategy, engines(1, 100, True), engines(1, 100, False),
                                 names_of=names_of, kv_bytes_per_token=KVB))
    for key in ("transfer_ms", "decode_wait_ms"):
        assert set(out[key]) == {"p50", "p90", "p99", "mean"}
    assert out["transfer_bytes"] == 100 * KVB
    assert list(out["prefill_pool"]) == list(out["decode_pool"]) == ["workers", "utilization", "mean_kv_usage",
                                                                      "mean_kv_usage_busy", "peak_kv_blocks"]
    assert set(out["ttft_prefill_ms"]) == {"p50", "p90", "p99", "mean"}


# ------------------------------------------------------------------------------------------ the commands
MOON = ("".join(json.dumps(r) + "\n" for r in [
    {"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]},
    {"timestamp": 50, "input_length": 1536, "output_length": 4, "hash_ids": [1, 2, 3]},
    {"timestamp": 90, "input_length": 600, "output_length": 4, "hash_ids": [7, 8]}]))


@pytest.fixture
def moon(tmp_path):
    path = tmp_path / "moon.jsonl"
    path.write_text(MOON)
    return str(path)


def test_compare_split_runs_aggregated_and_disaggregated_at_equal_gpus(moon, tmp_path):
    plot = tmp_path / "split.png"
    result = invoke("compare", "--trace", moon, "--timing", "--split", "2:0,1:1", "--link-gbps", "25",
                    "--slo-ttft-ms", "2000", "--slo-tpot-ms", "50", "--format", "json", "--plot", str(plot))
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert list(out) == ["2:0", "1:1"]
    agg, pd = out["2:0"], out["1:1"]
    assert agg["workers"] == pd["workers"] == 2 and "transfer_ms" not in agg and "link_gbps" not in agg
    assert pd["prefill_workers"] == pd["decode_workers"] == 1 and pd["link_gbps"] == 25.0
    assert pd["transfer_bytes"] == (1024 + 1536 + 600) * KVB
    for r in (agg, pd):
        assert {"goodput", "output_tokens_per_s_per_gpu", "ttft_ms", "tpot_ms"} <= set(r)
    assert plot.stat().st_size > 0
    table = invoke("compare", "--trace", moon, "--timing", "--split", "2:0,1:1", "--format", "table")
    header = table.stdout.splitlines()[0].split()
    assert {"ttft_p50_ms", "tpot_p50_ms", "tok_s_gpu", "xfer_p50_ms"} <= set(header)


def test_the_split_equals_the_explicit_fleet(moon):
    a = invoke("sim", "--trace", moon, "--timing", "--split", "1:2")
    b = invoke("sim", "--trace", moon, "--timing", "--prefill-workers", "1", "--decode-workers", "2")
    assert a.exit_code == b.exit_code == 0 and json.loads(a.stdout) == json.loads(b.stdout)
    c = invoke("sim", "--trace", moon, "--timing", "--split", "3:0")
    d = invoke("sim", "--trace", moon, "--timing", "--workers", "3")
    assert json.loads(c.stdout) == json.loads(d.stdout)


def test_sweep_takes_the_split_axis(moon):
    result = invoke("sweep", "--executor", "serial", "--quiet", "--trace", moon, "--timing",
                    "--grid", "split=2:0,1:1", "--link-gbps", "10")
    assert result.exit_code == 0, result.stderr
    cells = [json.loads(line) for line in result.stdout.splitlines()]
    assert [c["cell"]["split"] for c in cells] == ["2:0", "1:1"]
    assert "transfer_ms" not in cells[0]["result"] and cells[1]["result"]["link_gbps"] == 10.0


@pytest.mark.parametrize("args, words", [
    (["--timing", "--split", "8"], "split must be P:D"),
    (["--timing", "--split", "0:2"], "P >= 1"),
    (["--timing", "--prefill-workers", "2"], "--prefill-workers and --decode-workers go together"),
    (["--timing", "--decode-workers", "0", "--prefill-workers", "1"], "--decode-workers"),
])
def test_bad_fleets_are_refused_in_one_line(args, words):
    result = invoke("sim", *args)
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert words in line, line


def test_compare_split_refuses_pd_options_when_no_split_is_disaggregated(moon):
    result = invoke("compare", "--trace", moon, "--timing", "--split", "2:0,1:0", "--link-gbps", "25")
    assert result.exit_code == 2 and "--link-gbps has no effect" in result.stderr


# -- a reply's blocks on the decode worker (issue 24 leftovers: output_tokens in P/D) ---------------------------
def conversation():
    """Turn 1: 32 prompt tokens, a 20-token reply (output_tokens) at 0; turn 2 at 1000 ms: turn 1's prompt and
    reply plus 12 new tokens (64 tokens, 4 blocks). Names as the token-trace reader gives them."""
    from dynlab.engine.metrics import Recorder
    from dynlab.routing.hashing import block_hashes
    from dynlab.traces.replies import reply_names

    p1, reply = list(range(1, 33)), list(range(100, 120))
    hashes, replied = reply_names(p1, reply, BLOCK)
    p2 = p1 + reply + list(range(200, 212))
    turn2 = tuple(block_hashes(p2, BLOCK))

    class Stored(Recorder):
        def __init__(self):
            self.by_worker = {}

        def on_step(self, worker, result):
            self.by_worker.setdefault(worker, []).extend(result.stored)

    return ([Request(tuple(hashes), 32, 20, 0.0, 0, output_hashes=replied), Request(turn2, 64, 2, 1000.0, 1)],
            replied, turn2, Stored())


def serve_recorded(reqs, recorder, **kw):
    from dynlab.engine.env import RunEnv

    strategy = build_strategy(SimConfig(mode="rr", workers=1), random.Random(0))
    env = RunEnv.timed(reqs, strategy, 1, arrival_rng=random.Random(0), recorders=[recorder])
    return serve_disagg(reqs, strategy, engines(1, 100, True), engines(1, 100, False), names_of=names_of,
                        kv_bytes_per_token=KVB, env=env, pd=PdSection(**kw))


def test_the_decode_worker_names_and_publishes_its_reply_blocks():
    # turn 1's prompt + reply minus its last token: 32 + 19 = 51 tokens, 3 full blocks: the reply's one named
    # block (tokens 32..47) is the turn-2 prompt's block 2 (the chain continued over the reply)
    reqs, replied, turn2, stored = conversation()
    assert len(replied) == 1 and replied[0] == turn2[2]
    fleet = serve_recorded(reqs, stored, decode_prefix_cache=True)
    a, b = fleet.records[0], fleet.records[1]
    # the decode worker cached turn 1's 2 prompt blocks (received) and its reply block (computed there), and its
    # step result published that block (BlockStored): turn 2 finds 3 blocks there and is sent 64 - 48 tokens
    assert (a.hit_tokens, b.hit_tokens) == (0, 48)
    assert (a.nbytes, b.nbytes) == (32 * KVB, 16 * KVB)
    assert replied[0] in stored.by_worker[1]  # worker 1: the decode worker (the prefill pool is worker 0)
    # the prefill worker handed turn 1 off at its first token: it never computed the reply, so turn 2's
    # prefill there hits turn 1's 2 prompt blocks only (32 tokens) and recomputes the reply (as in Dynamo and
    # llm-d, whose prefill router scores the prefill workers' KV events)
    assert (a.request.hit_tokens, b.request.hit_tokens) == (0, 32)
    # what the prefill worker stored: turn 1's 2 prompt blocks, then turn 2's blocks 2 and 3 (the reply recomputed)
    assert stored.by_worker[0] == list(turn2)


def test_without_reply_tokens_or_a_decode_prefix_cache_the_decode_worker_names_nothing():
    reqs, replied, turn2, stored = conversation()
    fleet = serve_recorded(reqs, stored)  # no --decode-prefix-cache: the decode worker models no prefix cache
    assert [r.hit_tokens for r in fleet.records.values()] == [0, 0] and not stored.by_worker.get(1)
    reqs[0] = Request(reqs[0].hashes, 32, 20, 0.0, 0)  # no output_tokens: the prompt blocks only, as before
    reqs2, _, _, stored2 = conversation()
    fleet = serve_recorded([reqs[0], reqs2[1]], stored2, decode_prefix_cache=True)
    assert [r.hit_tokens for r in fleet.records.values()] == [0, 32]


conversations = st.lists(st.tuples(st.integers(0, 40),  # inter-arrival ms
                                   st.integers(1, 40),  # new prompt tokens of the turn
                                   st.integers(1, 30),  # reply tokens
                                   st.integers(0, 2)),  # the conversation it continues
                         min_size=1, max_size=12)


def build_conversations(wl):
    """Turns whose prompt is their conversation's earlier prompts and replies plus new tokens; each names
    its reply (``output_hashes``), as a token trace's ``output_tokens`` do."""
    from dynlab.traces.replies import reply_names

    history, reqs, t, fresh = {}, [], 0.0, iter(range(1, 10**6))
    for i, (gap, new, n_out, conv) in enumerate(wl):
        t += gap
        prompt = history.get(conv, []) + [next(fresh) for _ in range(new)]
        reply = [next(fresh) for _ in range(n_out)]
        hashes, replied = reply_names(prompt, reply, BLOCK)
        reqs.append(Request(tuple(hashes), len(prompt), n_out, t, i, output_hashes=replied))
        history[conv] = prompt + reply
    return reqs


@settings(max_examples=50)
# dcap below the prefill pool's 30 blocks too: a request that fits the prefill pool only is rejected at arrival
@given(wl=conversations, d=st.integers(1, 2), dcap=st.integers(4, 40), overlap=st.booleans(),
       router=st.sampled_from(["least-loaded", "round-robin", "kv-usage"]))
def test_invariants_with_named_replies(wl, d, dcap, overlap, router):
    reqs = build_conversations(wl)
    # the prefill pool (30 blocks) must hold each request, the decode pool each with something to decode
    served = [r for r in reqs if r.input_length + r.output_length - 1 <= BLOCK * (30 if r.output_length == 1
                                                                                  else min(30, dcap))]
    runs = []
    for bulk in (True, False):
        fleet = serve(reqs, engines(1, 30, True, bulk=bulk, budget=64), engines(d, dcap, False, bulk=bulk, budget=64),
                      link_gbps=0.01, overlap_transfer=overlap, decode_prefix_cache=True, decode_router=router)
        # no exception; served + rejected = all, each served request once
        assert len(fleet.serving.e2e) == len(served) and fleet.serving.rejected == len(reqs) - len(served)
        for rec in fleet.records.values():
            r = rec.request
            # a decode-side hit is whole prompt blocks (never reply blocks: it stops at the prompt's)
            assert 0 <= rec.hit_tokens <= r.input_length and rec.hit_tokens % BLOCK == 0
            assert rec.nbytes == (r.input_length - rec.hit_tokens) * KVB and r.generated == r.output_length
        for e in list(fleet.engines) + fleet.decode:
            e.check()
            assert e.used_blocks == 0 and e.idle and not e.held and not e.reserved
        runs.append(fleet)
    a, b = runs  # bulk decode runs name a reply's blocks as step-by-step does
    assert {k: r.hit_tokens for k, r in a.records.items()} == {k: r.hit_tokens for k, r in b.records.items()}
    assert sorted(a.serving.e2e) == pytest.approx(sorted(b.serving.e2e))
