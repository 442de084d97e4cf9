"""Scorers: every registered scorer's contract (registry-wide), the weighted strategy's rules."""
from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynlab import hookimpl, plugins
from dynlab.engine.config import SimConfig
from dynlab.engine.run import build_strategy
from dynlab.routing.events import BlockStored
from dynlab.routing.index import KvIndex
from dynlab.routing.scorer import Scorer
from dynlab.routing.strategy import FleetView, Request, RunContext

from helpers import invoke

SCORER_NAMES = plugins.scorers().names()
BUILTIN = {"prefix", "queue", "kv-usage", "load"}


def test_registry_has_the_builtins_and_plugins_lists_them():
    assert BUILTIN <= set(SCORER_NAMES)
    out = invoke("plugins")
    assert out.exit_code == 0
    rows = [line.split() for line in out.stdout.splitlines()]
    assert {r[1] for r in rows if r[0] == "scorer"} >= BUILTIN


@st.composite
def situations(draw):
    """A fleet of 1-6 workers with random load, an index fed random chains, and a request."""
    n = draw(st.integers(1, 6))
    load = st.lists(st.integers(0, 50), min_size=n, max_size=n)
    fleet = FleetView(draw(load), draw(load), draw(st.lists(st.integers(0, 5000), min_size=n, max_size=n)),
                      draw(st.lists(st.integers(0, 10**5), min_size=n, max_size=n)), [0] * n, draw(load))
    index = KvIndex(16)
    for _ in range(draw(st.integers(0, 8))):
        index.apply_event(BlockStored(draw(st.integers(0, n - 1)), tuple(draw(st.text("ab", max_size=5)))))
    path = draw(st.text("ab", max_size=6))
    request = Request(tuple(path[:j + 1] for j in range(len(path))), input_length=16 * len(path))
    pool = draw(st.one_of(st.none(), st.integers(0, 10**4)))
    return n, fleet, index, request, pool


@pytest.mark.parametrize("name", SCORER_NAMES)
@given(situation=situations())
def test_every_scorer_gives_one_finite_score_per_worker(name, situation):
    n, fleet, index, request, pool = situation
    cls = plugins.scorers().get(name)
    assert issubclass(cls, Scorer) and cls.name == name
    ctx = RunContext(workers=n, options={o.name: o.default for o in cls.options}, timed=True,
                     pool_blocks=pool if pool is not None else 1000)
    scorer = cls(ctx)
    before = [list(getattr(fleet, a)) for a in ("requests", "active_requests", "active_blocks",
                                                 "queued_prefill_tokens", "waiting_requests")]
    scores = scorer.score(request, fleet, index)
    assert len(scores) == n
    assert all(isinstance(s, (int, float)) and math.isfinite(s) for s in scores)
    assert scorer.score(request, fleet, index) == scores  # a function of what it is shown
    assert [list(getattr(fleet, a)) for a in ("requests", "active_requests", "active_blocks",
                                              "queued_prefill_tokens", "waiting_requests")] == before
    if name in BUILTIN:
        assert all(0.0 <= s <= 1.0 for s in scores)


def weighted(n, scorers, timed=False, **extra):
    return build_strategy(SimConfig(mode="weighted", workers=n, timing=timed, opts={"scorers": scorers, **extra}),
                          random.Random(0))


@given(n=st.integers(2, 6), chains=st.lists(st.tuples(st.integers(0, 5), st.text("ab", max_size=6)), max_size=10),
       path=st.text("ab", min_size=1, max_size=6))
def test_weighted_prefix_alone_chooses_as_kv_events_when_overlaps_differ(n, chains, path):
    w_strategy = weighted(n, "prefix:1")
    kv = build_strategy(SimConfig(mode="kv-events", workers=n), random.Random(0))
    for worker, chain in chains:
        ev = BlockStored(worker % n, tuple(chain[:j + 1] for j in range(len(chain))))
        w_strategy.on_event(ev)
        kv.on_event(ev)
    request = Request(tuple(path[:j + 1] for j in range(len(path))), input_length=16 * len(path))
    overlaps = kv.router.index.find_matches(request.hashes)
    best = sorted(overlaps.values(), reverse=True)
    if not best or (len(best) > 1 and best[0] == best[1]):
        return  # no overlap, or a tie: the two break ties differently (load vs routed counts)
    zeros = [0] * n
    fleet = FleetView([0] * n, zeros, zeros, zeros, zeros)
    assert w_strategy.route(request, fleet) == kv.route(request, fleet)
    assert w_strategy.predicted == kv.predicted == best[0]


def test_ties_go_to_the_least_loaded_then_the_lowest_index():
    # prefix only, no overlap anywhere: every total is 0; active requests [2, 1, 1] -> worker 1
    s = weighted(3, "prefix:1")
    fleet = FleetView([0] * 3, [2, 1, 1], [0] * 3, [0] * 3, [0] * 3)
    assert s.route(Request(("a",)), fleet) == 1


def test_weights_add_up_by_hand():
    # prefix:1 + load:2, 2 workers. Worker 0 holds both blocks (prefix 1.0) and has 3 active requests
    # (load 1/4): 1 + 2/4 = 1.5. Worker 1: prefix 0, load 1/(1+0) = 1: 0 + 2 = 2.0 -> worker 1.
    s = weighted(2, "prefix:1,load:2", timed=True)
    s.on_event(BlockStored(0, ("a", "ab")))
    fleet = FleetView([0, 0], [3, 0], [0, 0], [0, 0], [0, 0])
    assert s.totals(Request(("a", "ab")), fleet) == [1.5, 2.0]
    assert s.route(Request(("a", "ab")), fleet) == 1 and s.predicted == 0
    # with prefix weighing 3: 3 + 0.5 = 3.5 against 2 -> worker 0, predicted 2 blocks
    s = weighted(2, "prefix:3,load:2", timed=True)
    s.on_event(BlockStored(0, ("a", "ab")))
    assert s.route(Request(("a", "ab")), fleet) == 0 and s.predicted == 2


def test_kv_usage_is_the_free_share_of_the_pool():
    cls = plugins.scorers().get("kv-usage")
    fleet = FleetView([0] * 3, [0] * 3, [0, 250, 2000], [0] * 3, [0] * 3)
    scorer = cls(RunContext(workers=3, options={"pool_blocks": 0}, timed=True, pool_blocks=1000))
    assert scorer.score(Request(()), fleet, KvIndex()) == [1.0, 0.75, 0.0]
    scorer = cls(RunContext(workers=3, options={"pool_blocks": 500}, timed=True, pool_blocks=1000))
    assert scorer.score(Request(()), fleet, KvIndex()) == [1.0, 0.5, 0.0]


def test_queue_and_load_scores():
    fleet = FleetView([0] * 2, [0, 3], [0] * 2, [0] * 2, [0] * 2, [1, 0])
    ctx = RunContext(workers=2, timed=True)
    assert plugins.scorers().get("queue")(ctx).score(Request(()), fleet, KvIndex()) == [0.5, 1.0]
    assert plugins.scorers().get("load")(ctx).score(Request(()), fleet, KvIndex()) == [1.0, 0.25]


def test_default_weights_are_llm_ds():
    opts = {o.name: o.default for o in plugins.strategies().get("weighted").options}
    assert opts["scorers"] == "prefix:3,queue:2,kv-usage:2"
    assert "kv-usage.pool_blocks" in opts


@pytest.mark.parametrize("opts, words", [
    (["scorers=prefix:1,load:1"], ["load", "--timing"]),
    (["scorers=prefix:x"], ["weight", "prefix"]),
    (["scorers=prefix:-1"], ["weight"]),
    (["scorers=prefix:1,prefix:2"], ["twice"]),
    (["scorers=prefix:1,"], ["empty"]),
    (["scorers=nope:1"], ["nope", "prefix", "kv-usage"]),
    (["scorers=prefix:1", "kv-usage.pool_blocks=5"], ["kv-usage.pool_blocks", "not in"]),
])
def test_bad_scorer_options_are_one_line_usage_errors(opts, words):
    args = ["sim", "--mode", "weighted"]
    for o in opts:
        args += ["--opt", o]
    out = invoke(*args)
    assert out.exit_code == 2, out.output
    (line,) = out.stderr.splitlines()
    assert all(w in line for w in words), line


def test_a_scorer_registered_at_run_time_is_usable():
    class Last(Scorer):
        """Prefers the highest-numbered worker."""

        name = "throwaway-last"

        def score(self, request, fleet, index):
            return [float(w) for w in range(fleet.workers)]

    class Plugin:
        @staticmethod
        @hookimpl
        def dynlab_register_scorers(register):
            register(Last)

    pm = plugins.get_plugin_manager()
    pm.register(Plugin, name="throwaway-scorer")
    try:
        assert "throwaway-last" in plugins.scorers()
        s = weighted(3, "throwaway-last:1")
        assert s.route(Request(("a",)), FleetView([0] * 3, [0] * 3, [0] * 3, [0] * 3, [0] * 3)) == 2
    finally:
        pm.unregister(name="throwaway-scorer")
    assert "throwaway-last" not in plugins.scorers()


def test_weighted_runs_timed():
    out = invoke("sim", "--mode", "weighted", "--timing", "--workers", "3", "--all-metrics")
    assert out.exit_code == 0, out.stderr
