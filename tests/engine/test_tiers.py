"""The CPU tier behind each engine: the tier itself, the load rule, conservation of blocks, events, the cache lab.

Expected values are derived by hand in comments; the cache-lab comparison states where the two models
agree (see docs/tiers.md).
"""
from __future__ import annotations

import json
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import published, replay_timed
from dynlab.engine.worker import EngineWorker
from dynlab.kv.cpu_tier import DEFAULT_PCIE_GBPS, CpuTier, cpu_blocks
from dynlab.labs.on_engine import engine_blocks, scenario_on_engine
from dynlab.labs.scenario import cliff, run_scenario
from dynlab.latency.base import LatencyModel, StepBatch
from dynlab.routing.events import BlockRemoved, BlockStored
from dynlab.routing.index import KvIndex
from dynlab.routing.strategy import Request


class Flat(LatencyModel):
    """Every step takes ``ms`` (a test double: hand-computable times)."""

    name = "test-flat"

    def __init__(self, ms=10.0):
        super().__init__(None, {})
        self.ms = ms

    def step_ms(self, batch: StepBatch) -> float:
        return self.ms

    def decode_ms(self, requests, context, steps):
        return steps * self.ms


class One:
    """A strategy for one worker that records the KV events it receives."""

    name = "one"
    predicted = None
    uses_events = True

    def __init__(self):
        self.events = []

    def route(self, request, fleet):
        return 0

    def on_event(self, event):
        self.events.append(event)

    def refused_events(self):
        return None


def serve(engine, requests, strategy=None):
    strategy = strategy or One()
    out = replay_timed(requests, strategy, [engine], names_of=lambda r: list(r.hashes), kv_bytes_per_block=100.0)
    return out, strategy


# ---------------------------------------------------------------------------------------------- the tier
def test_offload_is_lru_and_reports_the_net_change():
    tier = CpuTier(3)
    assert tier.offload([1, 2]) == ((1, 2), ())
    tier.touch([1])  # order now 2, 1
    # 3 fits; 4 drops the least recent (2); 1 is already held (touched, not stored again)
    assert tier.offload([3, 4, 1]) == ((3, 4), (2,))
    assert tier.names() == {1, 3, 4}
    # more names than room: 5, 6, 7 push out 3, 4, 1 and then 5 itself: 5 is in neither list
    assert tier.offload([5, 6, 7, 8]) == ((6, 7, 8), (3, 4, 1))
    assert CpuTier(0).offload([1]) == ((), ())


def test_lookup_is_contiguous_from_start():
    tier = CpuTier(10)
    tier.offload([11, 12, 14])
    assert tier.lookup([10, 11, 12, 13, 14], 1, 10) == 2  # 11, 12; 13 is missing
    assert tier.lookup([10, 11, 12, 13, 14], 1, 1) == 1
    assert tier.lookup([10, 11, 12, 13, 14], 0, 5) == 0


def test_cpu_blocks_from_gigabytes():
    # floor(1e9 bytes / 1e6 bytes per block) = 1000 blocks
    assert cpu_blocks(1.0, 1e6) == 1000
    assert cpu_blocks(0.0, 1e6) == 0
    with pytest.raises(ValueError):
        cpu_blocks(-1, 1e6)
    assert DEFAULT_PCIE_GBPS == 25.0


# ---------------------------------------------------------------------------------------------- load rule
def test_cpu_hits_wait_for_their_load_then_join_the_next_step():
    """Pool of 3 blocks of 4 tokens, flat 10 ms steps, 2 ms per block loaded, CPU tier of 8 blocks.

    A (t=0): 9 tokens, names 1, 2 (cap (9-1)//4 = 2 blocks), 1 output token, 3 blocks: one step 0-10,
    TTFT 10; freed tail first: free queue [tail, 2, 1]. B (t=100): names 3, 4, 9 tokens, 3 blocks: evicts
    2 then 1, written to the CPU tier; TTFT 10. C (t=200): A's prompt again: GPU lookup 0, CPU lookup 2
    -> admitted at 200 (its 3 blocks evict B's 4, 3: written too) with a load of 2 x 2 = 4 ms, ready at
    204; nothing else runs, so the worker wakes at 204 and schedules its 1 remaining token: step
    204-214, TTFT 14 = 4 ms load + one step. Mean TTFT (10 + 10 + 14) / 3 = 11.3.
    """
    engine = EngineWorker(0, 3, 4, Flat(10.0), cpu_capacity=8, load_ms_per_block=2.0)
    reqs = [Request((1, 2), 9, 1, timestamp=0.0, index=0), Request((3, 4), 9, 1, timestamp=100.0, index=1),
            Request((1, 2), 9, 1, timestamp=200.0, index=2)]
    out, strategy = serve(engine, reqs)
    assert out["ttft_ms"]["mean"] == 11.3 and out["ttft_ms"]["p50"] == 10.0
    assert (out["gpu_hit_blocks"], out["cpu_hit_blocks"]) == (0, 2)
    # bytes: 2 blocks written at B's step, 2 at C's admission, 2 loaded for C: 6 x 100
    assert out["pcie_bytes"] == 600
    stored_cpu = [ev.hashes for ev in strategy.events if type(ev) is BlockStored and ev.medium == "CPU"]
    assert stored_cpu[0] == (2, 1)  # B's allocation evicted 2 then 1 (A's tail first)


def test_a_load_does_not_delay_other_requests_decode():
    """A decoding request keeps its 10 ms steps while another request's blocks load (100 ms per block).

    D (t=0) decodes 20 tokens: steps every 10 ms, first token at 10. A prefix put in the CPU tier by
    hand makes E (t=25, admitted at the next step start, 30) load 2 blocks for 200 ms, ready at 230:
    D's steps go on (TPOT 10 ms), E joins the step starting at 230, first token at 240 (TTFT 215).
    Mean TTFT (10 + 215) / 2 = 112.5.
    """
    engine = EngineWorker(0, 32, 4, Flat(10.0), cpu_capacity=8, load_ms_per_block=100.0)
    engine.cpu.offload([7, 8])
    reqs = [Request((1,), 5, 20, timestamp=0.0, index=0), Request((7, 8), 9, 1, timestamp=25.0, index=1)]
    out, _ = serve(engine, reqs)
    assert out["tpot_ms"]["p50"] == 10.0
    assert out["ttft_ms"]["mean"] == 112.5


# ------------------------------------------------------------------------------------- conservation (hypothesis)
class Checked(EngineWorker):
    """An engine that checks, after every step start and end, its tiers against a model built from its reports."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.gpu_model, self.cpu_model = Counter(), set()  # GPU: name -> cached copies (vLLM 0.33.0 keeps each)

    def start_step(self, now):
        gpu_before = set(published(self.pool))
        end = super().start_step(now)
        self._mirror(gpu_before)
        return end

    def cross_boundary(self):  # a bulk run's block boundary evicts and writes to the CPU tier as a step start
        gpu_before = set(published(self.pool))
        removed = super().cross_boundary()
        self._mirror(gpu_before)
        return removed

    def cross_before(self, t):  # without a CPU tier: every boundary before t in one go, evictions only
        gpu_before = set(published(self.pool))
        evicting = super().cross_before(t)
        self._mirror(gpu_before)
        return evicting

    def _mirror(self, gpu_before):
        copies = Counter(self.removed)
        assert all(self.gpu_model[n] >= c for n, c in copies.items())  # no copy removed twice or never stored
        self.gpu_model -= copies
        removed = set(copies)
        stored, dropped = set(self.cpu_stored), set(self.cpu_removed)
        assert not stored & self.cpu_model and dropped <= self.cpu_model  # no duplicate, no phantom
        self.cpu_model = (self.cpu_model | stored) - dropped
        held = self.cpu.names() if self.cpu is not None else set()
        assert held == self.cpu_model
        if self.write_through:
            assert not stored and not dropped  # an eviction writes nothing: the copy was made at compute
        else:  # no block is lost: what left the GPU is in the CPU tier unless the tier dropped it (full) or is 0
            lost = removed - held
            assert not lost or self.cpu is None or len(self.cpu) == self.cpu.capacity, lost
        assert removed <= gpu_before
        self.check()

    def finish_step(self):
        res = super().finish_step()
        self.gpu_model.update(res.stored)  # a name stored again: one more copy
        assert published(self.pool) == set(+self.gpu_model)
        stored, dropped = set(res.cpu_stored), set(res.cpu_removed)
        assert not stored & self.cpu_model and dropped <= self.cpu_model
        self.cpu_model = (self.cpu_model | stored) - dropped
        held = self.cpu.names() if self.cpu is not None else set()
        assert held == self.cpu_model
        if self.write_through and self.cpu is not None:
            # what the step computed is on both tiers, unless the tier is full and dropped it again
            missing = set(res.stored) - held
            assert not missing or len(self.cpu) == self.cpu.capacity, missing
        else:
            assert not stored and not dropped
        self.check()
        return res


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6), st.integers(1, 40), st.integers(1, 6),
                          st.integers(0, 30)), min_size=1, max_size=25),
       st.integers(6, 16), st.integers(0, 12), st.sampled_from([0.0, 0.5, 7.0]), st.sampled_from(["evict", "compute"]))
def test_blocks_move_between_tiers_without_loss_or_duplication(rows, capacity, cpu, load_ms, cpu_write):
    # prompts share prefixes: prefix p's names are p*100 + i (chained: the same prefix, the same names)
    block = 4
    reqs, t = [], 0.0
    for i, (prefix, nblocks, extra, out_len, gap) in enumerate(rows):
        t += gap
        tokens = nblocks * block + extra % block + 1
        names = tuple(prefix * 100 + j for j in range(tokens // block))
        reqs.append(Request(names, tokens, out_len, timestamp=t, index=i))
    engine = Checked(0, capacity, block, Flat(3.0), max_num_batched_tokens=16, cpu_capacity=cpu,
                     load_ms_per_block=load_ms, cpu_write=cpu_write)
    out, strategy = serve(engine, reqs)
    assert out["requests"] == len(reqs)
    assert not engine.loading and not engine.ready
    # the events mirror both tiers: an index fed them holds what each tier holds
    index = KvIndex()
    for ev in strategy.events:
        index.apply_event(ev)
    assert index.blocks(0) == published(engine.pool)
    assert index.tier_blocks(0, "CPU") == (engine.cpu.names() if engine.cpu else set())
    assert out["cpu_hit_blocks"] <= engine.loaded_blocks


# ---------------------------------------------------------------------------------------------- the cache lab
TOKENS, DOCS = 5011, 10


def _last(gpu: int, cpu: int, passes, cpu_write: str) -> dict:
    return scenario_on_engine(gpu, cpu, passes, cpu_write=cpu_write)["passes"][-1]


def test_lab_capacities_map_to_whole_documents():
    """4 documents of 5011 tokens fit 21520 tokens; each takes ceil(5011 / 16) + 1 = 315 pool blocks and
    5011 // 16 = 313 CPU blocks."""
    assert engine_blocks(21520, 21520) == (4 * 315, 4 * 313)
    assert engine_blocks(5010, 0) == (0, 0)
    with pytest.raises(ValueError):
        scenario_on_engine(5010)  # no document fits


LAB_GPU = [21520, 30000, 45000, 50109, 50110, 60000]


@pytest.mark.parametrize("cpu_write", ["evict", "compute"])
def test_gpu_cliff_whole_document_hits_equal_the_lab(cpu_write):
    """`dynlab cliff` (passes fwd,fwd): 0 hits until all ten documents fit, then 10. One worker's
    whole-document GPU hits equal that at every mapped capacity; below the cliff the engine also keeps
    partial prefixes (vLLM frees a sequence tail first), which the lab's whole-document entries cannot."""
    lab = cliff(LAB_GPU, passes=["fwd", "fwd"])
    fleet = {str(c): _last(c, 0, ["fwd", "fwd"], cpu_write)["gpu_hits"] for c in LAB_GPU}
    assert fleet == lab == {"21520": 0, "30000": 0, "45000": 0, "50109": 0, "50110": 10, "60000": 10}


LAB_CPU = [0, 5011, 21520, 30000, 40000, 45099, 50110, 60000]


def _heads(gpu: int) -> int:
    """The pool under vLLM 0.33.0's free-queue order (issue 24 rule 2) that holds whole documents as the lab
    does: ``floor(gpu / 5011)`` documents of 5011 // 16 = 313 full (named) blocks, plus ONE block for the
    partial last block (3 tokens) of the read in progress. A read frees its partial block to the free
    queue's head, where the next read takes it again, so with ``k`` documents cached exactly one block is
    unnamed: a missed read (314 blocks) takes it plus the 313 blocks of the least recently read document
    (released tail first, so all of them), and a hit (313 blocks hit, (5011 - 1) // 16 = 313) takes just
    it. No partial block is ever freed behind a named one: the engine evicts whole documents, the lab's rule."""
    return (gpu // TOKENS) * (TOKENS // 16) + 1


def _last_heads(gpu: int, cpu: int, passes, cpu_write: str) -> dict:
    return scenario_on_engine(gpu, cpu, passes, cpu_write=cpu_write, gpu_blocks=_heads(gpu))["passes"][-1]


def test_cpu_cliff_is_reproduced_by_a_write_through_tier():
    """`dynlab cliff --cpu 0,5011,...` (GPU 21520 tokens, passes fwd,fwd,rev), every metric, by one worker whose
    CPU tier is written when blocks are computed (``cpu_write="compute"``, the lab's inclusive rule), on the
    pool of :func:`_heads`. By hand from the lab: the last pass re-reads 9, 8, 7, 6 on the GPU (4 documents),
    and the CPU tier, which holds the last floor(C / 5011) documents computed (LRU; a GPU hit does not touch
    it), serves 5, 4, ... down to document 10 - floor(C / 5011): 0, 0, 0, 1, 3, 5, 6, 6 CPU hits."""
    lab = {m: cliff(LAB_CPU, over="cpu", metric=m) for m in ("hits", "gpu_hits", "cpu_hits", "misses")}
    assert lab["cpu_hits"] == dict(zip(map(str, LAB_CPU), [0, 0, 0, 1, 3, 5, 6, 6]))
    fleet = {m: {} for m in lab}
    for c in LAB_CPU:
        f = _last_heads(21520, c, ["fwd", "fwd", "rev"], "compute")
        assert f["partial"] == 0
        for m in ("gpu_hits", "cpu_hits", "misses"):
            fleet[m][str(c)] = f[m]
        fleet["hits"][str(c)] = f["gpu_hits"] + f["cpu_hits"]
    assert fleet == lab


def test_the_per_document_mapping_keeps_partial_prefixes_under_vllms_order():
    """Why the lab comparisons use :func:`_heads`: the default mapping (315 blocks a document, one spare each)
    leaves 4 x 315 - 4 x 313 = 8 unnamed blocks at the free queue's head with 4 documents cached (vLLM 0.33
    returns a read's partial block there), so a missed read (314 blocks) takes those 8 and only 306 of the
    oldest document: its first 7 blocks survive, a partial hit the lab's whole documents never have. With
    fwd,fwd,rev at 21520 tokens the rev pass's misses 5, 4, ... each leave the next document so; only the
    one read again in the pass counts: 1 partial. On :func:`_heads`' pool: none."""
    assert engine_blocks(21520, 0) == (4 * 315, 0) and _heads(21520) == 4 * 313 + 1
    assert _last(21520, 0, ["fwd", "fwd", "rev"], "compute")["partial"] == 1
    assert _last_heads(21520, 0, ["fwd", "fwd", "rev"], "compute")["partial"] == 0


@pytest.mark.parametrize("passes", [["fwd", "fwd", "rev"], ["fwd", "rev", "fwd"], ["rev", "rev"]])
@pytest.mark.parametrize("gpu", [5011, 21520, 45000, 50109, 50110])
def test_write_through_tier_equals_the_lab_pass_by_pass(gpu, passes):
    """Every pass's numbers and hit documents of ``run_scenario`` (the lab), at GPU sizes holding 1, 4, 8,
    9 and 10 documents and CPU sizes from none to every document, on the pool of :func:`_heads` (whole
    documents evicted: equal even one document short of all ten, where the per-document mapping keeps
    partial prefixes, see :func:`test_one_document_short_the_engine_keeps_partial_prefixes`)."""
    for cpu in (0, 5011, 21520, 40000, 50110):
        lab = run_scenario(gpu=gpu, cpu=cpu, passes=passes)["passes"]
        fleet = scenario_on_engine(gpu, cpu, passes, cpu_write="compute", gpu_blocks=_heads(gpu))["passes"]
        assert [p.pop("partial") for p in fleet] == [0] * len(passes)
        assert fleet == lab, (gpu, cpu)


def test_one_document_short_the_engine_keeps_partial_prefixes():
    """GPU 50109 tokens (9 documents, 2835 blocks), passes fwd,fwd: the lab misses all ten documents of the
    second pass. The engine's first pass takes 314 blocks a read (313 named + the last 3 tokens' block), so
    9 reads leave 2835 - 9 * 314 = 9 blocks never used; the tenth read takes those 9 and then 305 from the
    head of the free queue: document 0's blocks, tail first, so its first 9 blocks survive. Every later
    read finds the document it evicts in part the same way: ten partial hits, no whole hit, no miss."""
    second = scenario_on_engine(50109, 0, ["fwd", "fwd"])["passes"][1]
    assert (second["gpu_hits"], second["misses"], second["partial"]) == (0, 0, 10)
    assert run_scenario(gpu=50109, passes=["fwd", "fwd"])["passes"][1]["misses"] == 10


def test_victim_tier_differs_from_the_lab_where_the_write_rules_differ():
    """The default victim tier (a block is written when the GPU evicts it), on the CPU curve's workload and the
    pool of :func:`_heads` (whole documents move). Equal to the lab: the GPU's whole-document hits at every
    CPU size (4); every count without a CPU tier (4 GPU hits, 6 misses) and once the CPU holds every
    document (4 GPU, 6 CPU, 0 misses). In between the victim tier misses fewer documents (GPU and CPU hold
    different blocks, so their capacities add). By hand at CPU 21520 tokens (4 documents, LRU, written on
    GPU eviction, touched by a CPU hit): pass 1 evicts 0..5 from the GPU, the tier keeps [2, 3, 4, 5]; pass
    2 misses every document (6..9 were evicted by 0..3) and the tier ends as [2, 3, 4, 5] again, the GPU
    holding 6..9. Pass 3 (rev): 9, 8, 7, 6 GPU hits; 5 a CPU hit whose load evicts 9 (the GPU's least
    recent) into the tier, dropping 2; 4 a CPU hit, evicting 8, dropping 3; then 3, 2, 1, 0 miss: 2 CPU
    hits and 4 misses (the lab: 0 and 6)."""
    lab = {m: cliff(LAB_CPU, over="cpu", metric=m) for m in ("gpu_hits", "cpu_hits", "misses")}
    for c in LAB_CPU:
        f = _last_heads(21520, c, ["fwd", "fwd", "rev"], "evict")
        assert f["gpu_hits"] == lab["gpu_hits"][str(c)] == 4
        assert f["partial"] == 0
        assert f["misses"] <= lab["misses"][str(c)]
        if c == 0 or c >= DOCS * TOKENS:
            assert (f["cpu_hits"], f["misses"]) == (lab["cpu_hits"][str(c)], lab["misses"][str(c)])
    f = _last_heads(21520, 21520, ["fwd", "fwd", "rev"], "evict")
    assert (f["cpu_hits"], f["misses"], lab["misses"]["21520"]) == (2, 4, 6)


# ---------------------------------------------------------------------------------------------- the router
def test_index_keeps_tiers_apart():
    index = KvIndex()
    index.apply_event(BlockStored(0, (1, 2)))
    index.apply_event(BlockStored(0, (3, 4), medium="CPU"))
    index.apply_event(BlockStored(1, (1, 2, 3), medium="CPU"))
    assert index.find_matches([1, 2, 3, 4, 5]) == {0: 2}  # the default path: GPU only
    # worker 0: GPU 1, 2 then CPU 3, 4; worker 1: no GPU, CPU 1, 2, 3
    assert index.find_matches_tiers([1, 2, 3, 4, 5]) == {0: (2, 2), 1: (0, 3)}
    index.apply_event(BlockRemoved(0, (4,), medium="CPU"))
    assert index.find_matches_tiers([1, 2, 3, 4]) == {0: (2, 1), 1: (0, 3)}
    assert index.tier_blocks(1, "CPU") == {1, 2, 3} and index.blocks(1) == frozenset()


def _strategy(mode, workers, opts):
    from dynlab import plugins
    from dynlab.routing.strategy import RunContext

    return plugins.strategies().get(mode)(RunContext(workers, 16, random.Random(0), opts))


def _fleet(workers):
    from dynlab.routing.strategy import FleetView

    z = [0] * workers
    return FleetView(list(z), list(z), list(z), list(z), list(z))


def test_kv_cost_credits_host_blocks():
    """Request of 4 blocks, idle fleet: cost = 4 - overlap_credit * (gpu + host_credit * cpu) + 4.
    Worker 0 holds 2 GPU blocks: 4 - 2 + 4 = 6. Worker 1 holds 1 GPU block then 3 CPU blocks:
    host_credit 0.75 -> 4 - (1 + 2.25) + 4 = 4.75 (cheaper); host_credit 0 -> 4 - 1 + 4 = 7."""
    events = [BlockStored(0, (1, 2)), BlockStored(1, (1,)), BlockStored(1, (2, 3, 4), medium="CPU")]
    req = Request((1, 2, 3, 4), 64, 1)
    for credit, want_costs, want in ((0.75, [6.0, 4.75], 1), (0.0, [6.0, 7.0], 0)):
        s = _strategy("kv-cost", 2, {"host_credit": credit})
        for ev in events:
            s.on_event(ev)
        costs, _ = s.costs(req, _fleet(2))
        assert costs == want_costs
        assert s.route(req, _fleet(2)) == want and s.predicted == (2 if want == 0 else 1)


def test_kv_events_counts_gpu_blocks_unless_tiers_all():
    events = [BlockStored(0, (1, 2)), BlockStored(1, (1,)), BlockStored(1, (2, 3), medium="CPU")]
    req = Request((1, 2, 3, 4), 64, 1)
    for tiers, want in (("gpu", 0), ("all", 1)):  # GPU overlaps 2 vs 1; all tiers 2 vs 1 + 2 = 3
        s = _strategy("kv-events", 2, {"tiers": tiers})
        for ev in events:
            s.on_event(ev)
        assert s.route(req, _fleet(2)) == want
    with pytest.raises(ValueError, match="tiers"):
        _strategy("kv-events", 2, {"tiers": "cpu"})


def test_kv_cost_host_credit_default_is_dynamos():
    assert _strategy("kv-cost", 1, {}).host_credit == 0.75


@pytest.mark.parametrize("gpu, cpu, cpu_write", [(21520, 30000, "compute"), (21520, 40000, "compute"),
                                                 (21520, 40000, "evict"), (5011, 40000, "compute"),
                                                 (45000, 5011, "evict")])
def test_a_one_worker_fleet_run_of_the_lab_workload_hits_as_the_engine_does(tmp_path, gpu, cpu, cpu_write):
    """The same reads as a Mooncake trace through `dynlab sim --timing --workers 1` (the fleet: router, KV
    events, the roofline latency model): its gpu_hit_blocks and cpu_hit_blocks equal those of
    ``scenario_on_engine``, which drives the engine alone. Document d is ten 512-token trace blocks
    (ceil(5011 / 512) = 10 ids d*100 .. d*100+9), so its 313 engine blocks are named alike on every read;
    reads are 10 s apart, far longer than one read takes, so each runs alone as in the lab."""
    from dynlab.labs.scenario import pass_docs

    from helpers import invoke, ok

    passes = ["fwd", "fwd", "rev"]
    rows = [{"timestamp": i * 10000, "input_length": TOKENS, "output_length": 1,
             "hash_ids": [d * 100 + k for k in range(10)]}
            for i, d in enumerate(d for p in passes for d in pass_docs(p, DOCS))]
    trace = tmp_path / "lab.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gpu_blocks, cpu_blocks_ = engine_blocks(gpu, cpu)
    out = json.loads(ok(invoke("sim", "--trace", trace, "--workers", "1", "--timing", "--mode", "rr",
                               "--capacity", gpu_blocks, "--cpu-capacity", cpu_blocks_, "--cpu-write", cpu_write,
                               "--quiet")).stdout)
    alone = scenario_on_engine(gpu, cpu, passes, cpu_write=cpu_write)
    assert (out["gpu_hit_blocks"], out["cpu_hit_blocks"]) == (alone["gpu_hit_blocks"], alone["cpu_hit_blocks"])
    assert alone["cpu_hit_blocks"] > 0


@pytest.mark.parametrize("text, ok", [("0", True), ("0.75", True), ("1", True), ("1.01", False), ("1e308", False),
                                      ("-0.1", False)])
def test_kv_cost_host_credit_is_bounded_to_dynamos_range(text, ok):
    # Dynamo credits a block by tier: device 1.0, host 0.75, disk 0.25; a host block is worth 0 to 1 device block
    from dynlab import plugins

    (option,) = [o for o in plugins.strategies().get("kv-cost").options if o.name == "host_credit"]
    if ok:
        assert option.convert(text) == float(text)
    else:
        with pytest.raises(ValueError, match="host_credit"):
            option.convert(text)


@pytest.mark.parametrize("mode, opt", [("kv-cost", "host_credit=1"), ("kv-events", "tiers=all")])
@pytest.mark.parametrize("tier", [["--cpu-capacity", "0"], ["--cpu-memory-gb", "1"]])
def test_tier_options_run_with_a_cpu_tier(mode, opt, tier):
    # the refusal (tests/test_option_table.py NO_EFFECT) is for runs without a tier; with one they run
    from click.testing import CliRunner

    from dynlab.cli import main

    result = CliRunner().invoke(main, ["sim", "--timing", "--prefixes", "2", "--reps", "2", "--mode", mode,
                                       "--opt", opt, *tier])
    assert result.exit_code == 0, result.output


def test_compare_table_shows_the_engines_prefix_hit_rate_which_a_cpu_tier_moves(tmp_path):
    """`compare --format table` of timed runs has a prefix_hit_rate column (the engines' hit rate, GPU and
    CPU tier) holding each run's JSON value: on the lab's reads (GPU of 5,011 tokens, one document; CPU
    tier of 40,000 tokens, write-through) the tier raises it while the router's GPU-only block_hit_rate
    stays where it was."""
    from dynlab.labs.scenario import pass_docs

    from helpers import invoke, ok

    rows = [{"timestamp": i * 10000, "input_length": TOKENS, "output_length": 1,
             "hash_ids": [d * 100 + k for k in range(10)]}
            for i, d in enumerate(d for p in ["fwd", "fwd"] for d in pass_docs(p, DOCS))]
    trace = tmp_path / "lab.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gpu_blocks, cpu_blocks_ = engine_blocks(5011, 60000)
    args = ["compare", "--trace", trace, "--workers", "1", "--timing", "--mode", "rr", "--capacity", gpu_blocks,
            "--cpu-capacity", f"0,{cpu_blocks_}", "--cpu-write", "compute", "--quiet"]
    data = json.loads(ok(invoke(*args, "--format", "json")).stdout)
    none, tier = data["0"], data[str(cpu_blocks_)]
    assert tier["prefix_hit_rate"] > none["prefix_hit_rate"]
    assert tier["block_hit_rate"] == none["block_hit_rate"]
    lines = ok(invoke(*args, "--format", "table")).stdout.splitlines()
    head = lines[0].split()
    col = head.index("prefix_hit_rate")
    assert head[col - 1] == "block_hit_rate"
    assert [line.split()[col] for line in lines[1:]] == [str(none["prefix_hit_rate"]), str(tier["prefix_hit_rate"])]


@pytest.mark.parametrize("tier, blocks, source", [
    (["--cpu-capacity", "5000"], 5000, "--cpu-capacity 5000 blocks of 16 tokens"),
    # Llama-3.1-8B: 131,072 B of KV a token x 16 tokens = 2,097,152 B a block; 64e9 / 2,097,152 = 30,517.6
    (["--cpu-memory-gb", "64"], 30517,
     "floor(64 x 10^9 B / 2,097,152 B per block of 16 tokens) = 30517 blocks (488,272 tokens) per worker"),
])
def test_the_cpu_tier_says_where_its_size_comes_from(tier, blocks, source):
    from helpers import invoke, ok

    out = json.loads(ok(invoke("sim", "--timing", "--prefixes", "2", "--reps", "2", "--mode", "rr", *tier)).stdout)
    assert (out["cpu_kv_blocks"], out["cpu_kv_blocks_source"]) == (blocks, source)
    assert list(out).index("cpu_kv_blocks_source") == list(out).index("cpu_kv_blocks") + 1


def test_no_cpu_tier_no_source_key():
    from helpers import invoke, ok

    out = json.loads(ok(invoke("sim", "--timing", "--prefixes", "2", "--reps", "2", "--mode", "rr")).stdout)
    assert "cpu_kv_blocks" not in out and "cpu_kv_blocks_source" not in out
