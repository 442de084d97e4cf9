"""An engine whose pool works on runs (``EngineWorker(runs=True)``, :class:`RunBlockPool`) serves any
workload exactly as one whose pool works on names: the same steps, stored and removed names in the
same order, preemptions, hits and times."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab.engine.names import engine_block_runs
from dynlab.engine.worker import EngineRequest, EngineWorker
from dynlab.kv.run_pool import RunBlockPool
from test_worker import Linear, run


@st.composite
def workloads(draw):
    """Prompts named by prefix-chained trace ids (a tree of paths: shared prefixes), ``per`` engine
    blocks per trace block, a small pool (evictions, preemptions), chunked prefill."""
    block = draw(st.sampled_from([1, 2, 4]))
    trace_block = block * draw(st.sampled_from([1, 3, 4]))
    ids: dict = {}  # a path of the tree -> its trace id
    specs = []
    for i in range(draw(st.integers(1, 10))):
        path = draw(st.lists(st.integers(0, 2), min_size=1, max_size=6))
        chain = [ids.setdefault(tuple(path[:t + 1]), 7 + 3 * len(ids)) for t in range(len(path))]
        inp = draw(st.integers(1, len(path) * trace_block))
        specs.append((draw(st.integers(0, 120)), inp, draw(st.integers(1, 12)),
                      engine_block_runs(chain, inp, trace_block, block)))
    specs.sort(key=lambda s: s[0])
    sizes = (draw(st.integers(1, 30)), draw(st.integers(1, 40)), draw(st.integers(1, 5)))
    return block, sizes, specs


def serve(wl, runs, bulk, cross):
    block, (capacity, budget, seqs), specs = wl
    w = EngineWorker(0, capacity, block, Linear(1.0, 0.25, 1.0), max_num_batched_tokens=budget,
                     max_num_seqs=seqs, bulk=bulk, runs=runs)
    w.cross_boundaries = cross
    reqs = [EngineRequest(i, float(a), inp, out, names, rs) for i, (a, inp, out, (names, rs)) in enumerate(specs)]
    results = run(w, reqs, check=True)
    return w, reqs, [(x.start, x.end, x.steps, x.stored, x.removed, [(r.id, t) for r, t in x.finished],
                      x.preempted, x.used_blocks) for x in results]


@settings(max_examples=200)
@given(workloads(), st.booleans(), st.booleans())
def test_runs_and_names_serve_alike(wl, bulk, cross):
    names_w, names_reqs, by_names = serve(wl, False, bulk, cross)
    runs_w, runs_reqs, by_runs = serve(wl, True, bulk, cross)
    assert isinstance(runs_w.pool, RunBlockPool)
    assert by_runs == by_names
    assert (runs_w.preemptions, runs_w.peak_used_blocks) == (names_w.preemptions, names_w.peak_used_blocks)
    assert [r.hit_tokens for r in runs_reqs] == [r.hit_tokens for r in names_reqs]
