"""Engine block runs (``engine_block_runs``) and the routing recorder fed runs: the same figures as names."""
from hypothesis import given, settings
from hypothesis import strategies as st

from dynlab.engine.metrics import RoutingMetrics
from dynlab.engine.names import engine_block_names, engine_block_runs


def test_runs_by_hand():
    # trace blocks of 64 tokens, engine blocks of 16: 4 engine blocks per trace block; 150 tokens make
    # 9 full engine blocks: 4 under id 7, 4 under id 8, 1 under id 9 (its last token, 143, is in trace block 2)
    names, runs = engine_block_runs([7, 8, 9], 150, 64, 16)
    assert runs == [(7 * 1024, 4), (8 * 1024, 4), (9 * 1024, 1)]
    assert names == engine_block_names([7, 8, 9], 150, 64, 16)
    assert engine_block_runs([7, 8], 10, 64, 16) == ([], [])
    assert engine_block_runs([7, 8], 32, 16, 16) == ([7, 8], [(7, 1), (8, 1)])


prompts = st.lists(st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=6), st.integers(1, 6 * 48),
                             st.integers(0, 3), st.integers(0, 40)), max_size=25)


@given(prompts, st.sampled_from([(48, 16), (40, 16), (16, 16), (50, 7)]))
@settings(max_examples=200)
def test_routing_metrics_same_with_runs(reqs, sizes):
    """Property: fed runs, the recorder reports exactly what it reports fed the names (prefix-chained
    ids: id i of a prompt encodes its whole prefix, so chains are built from the drawn digits)."""
    trace_block, block = sizes
    plain, by_runs = RoutingMetrics(4), RoutingMetrics(4)
    for digits, length, w, actual in reqs:
        chain, acc = [], 0
        for d in digits:
            acc = acc * 7 + d + 1
            chain.append(acc)
        length = min(length, len(chain) * trace_block)
        names, runs = engine_block_runs(chain, length, trace_block, block)
        assert names == engine_block_names(chain, length, trace_block, block)
        assert [n for first, c in runs for n in range(first, first + c)] == names
        cap = max(len(names) - 1, 0)
        plain.on_route(tuple(names), w, None, min(actual, len(names)), cap)
        by_runs.on_route(tuple(names), w, None, min(actual, len(names)), cap, runs=runs)
    assert plain.result() == by_runs.result()
    assert plain.ideal_blocks == by_runs.ideal_blocks


def _reference_names(chain, input_length, trace_block, block):
    """The module docstring's formula, one engine block at a time: block j is named after the trace
    block t holding its last token, plus its offset among the blocks whose last token is in t."""
    out = []
    for j in range(input_length // block):
        t = ((j + 1) * block - 1) // trace_block
        first = min(i for i in range(j + 1) if ((i + 1) * block - 1) // trace_block == t)
        out.append(chain[t] if trace_block == block else chain[t] * 1024 + j - first)
    return out


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=8), st.integers(0, 8 * 64),
       st.sampled_from([(512, 16), (64, 16), (48, 16), (40, 16), (16, 16), (50, 7), (7, 50)]))
@settings(max_examples=300)
def test_names_and_runs_follow_the_formula(chain, length, sizes):
    trace_block, block = sizes
    length = min(length, len(chain) * trace_block)
    names, runs = engine_block_runs(chain, length, trace_block, block)
    assert names == _reference_names(chain, length, trace_block, block)
    assert engine_block_names(chain, length, trace_block, block) == names
    assert [n for first, c in runs for n in range(first, first + c)] == names
