"""Every registered strategy (third-party ones included) routes validly; the registry's rules; `dynlab strategies`."""
from __future__ import annotations

import importlib.metadata
import random

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from dynlab import hookimpl, plugins
from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.engine.counted import Worker
from dynlab.engine.run import build_strategy
from dynlab.routing.events import AllBlocksCleared, BlockRemoved, BlockStored
from dynlab.routing.strategy import FleetView, Request, RunContext, Strategy
from dynlab.sim.drive import replay

# Collected once, when pytest imports this module: whatever is installed is covered.
STRATEGY_NAMES = plugins.strategies().names()
SOURCES = {e.name: e.source for e in plugins.strategies().entries()}
#: strategies that read what only a timed run has (lora-affinity): built as for a timed run, driven here all the same
NEEDS_TIMING = {e.name: getattr(e.cls, "needs_timing", False) for e in plugins.strategies().entries()}


@st.composite
def workloads(draw):
    """Requests whose block names share heads (chains over a tiny alphabet), some without any block."""
    paths = draw(st.lists(st.text(alphabet="abc", max_size=6), max_size=25))
    requests = []
    for i, path in enumerate(paths):
        names = tuple(path[: j + 1] for j in range(len(path)))
        requests.append(Request(names, input_length=16 * len(names) + draw(st.integers(0, 15)), index=i,
                                timestamp=draw(st.one_of(st.none(), st.floats(0, 1e6))),
                                output_length=draw(st.integers(0, 50))))
    return requests


# An event after a request: none, the request's blocks stored, some removed, or the worker cleared.
EVENTS = st.lists(st.sampled_from(["none", "stored", "removed", "cleared", "stored"]), min_size=25, max_size=25)


class _Fleet:
    """The engine's side of a run, kept by the test: counts per worker and a live FleetView of them."""

    def __init__(self, n):
        self.counts = [0] * n
        self.cached = [0] * n
        zeros = [0] * n
        self.view = FleetView(self.counts, zeros, zeros, zeros, self.cached)


def assert_valid_worker(w, n):
    assert isinstance(w, int) and not isinstance(w, bool), w
    assert 0 <= w < n, (w, n)


def test_registry_has_the_builtins():
    assert {"rr", "random", "kv", "kv-events"} <= set(STRATEGY_NAMES)


@pytest.mark.parametrize("name", STRATEGY_NAMES)
@given(n=st.integers(1, 6), block=st.integers(1, 16), seed=st.integers(0, 2**32), requests=workloads(),
       events=EVENTS, publish=st.booleans())
def test_strategy_returns_a_valid_worker(name, n, block, seed, requests, events, publish):
    """Driven by hand: the FleetView updates between requests, and KV events of every kind arrive."""
    strategy = build_strategy(SimConfig(mode=name, workers=n, block=block, publish="yes" if publish else "no",
                                        timing=NEEDS_TIMING[name]), random.Random(seed))
    assert isinstance(strategy, Strategy)
    fleet = _Fleet(n)
    for req, event in zip(requests, events):
        w = strategy.route(req, fleet.view)
        assert_valid_worker(w, n)
        fleet.counts[w] += 1
        if not publish or event == "none":
            continue
        if event == "stored" and req.hashes:
            strategy.on_event(BlockStored(w, req.hashes))
            fleet.cached[w] += len(req.hashes)
        elif event == "removed" and req.hashes:
            strategy.on_event(BlockRemoved(w, req.hashes[len(req.hashes) // 2:]))
        elif event == "cleared":
            strategy.on_event(AllBlocksCleared(w))
            fleet.cached[w] = 0


@pytest.mark.parametrize("name", STRATEGY_NAMES)
@given(n=st.integers(1, 6), seed=st.integers(0, 2**32), requests=workloads(), publish=st.booleans(),
       delay=st.integers(0, 3))
def test_strategy_survives_the_replay_engine(name, n, seed, requests, publish, delay):
    """Through dynlab.sim.drive.replay with simulated workers (which rejects an invalid worker)."""
    strategy = build_strategy(SimConfig(mode=name, workers=n, timing=NEEDS_TIMING[name]), random.Random(seed))
    metrics = replay(requests, strategy, [Worker(w) for w in range(n)], publish=publish, event_delay=delay)
    assert metrics["requests"] == len(requests)
    assert sum(metrics["requests_per_worker"]) == len(requests)


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_strategy_is_described(name):
    entry = {e.name: e for e in plugins.strategies().entries()}[name]
    assert issubclass(entry.cls, Strategy) and entry.cls.name == name
    assert entry.description, f"{name} has no one-line docstring"
    assert entry.source


def test_direct_construction_with_run_context():
    """A strategy is constructed from a RunContext alone, as the issue's interface says."""
    cls = plugins.strategies().get("kv")
    strategy = cls(RunContext(workers=3, block=4, rng=random.Random(0)))
    fleet = _Fleet(3)
    req = Request(("a", "ab"), input_length=8)
    first = strategy.route(req, fleet.view)
    fleet.counts[first] += 1
    assert strategy.route(req, fleet.view) == first  # remembered where it routed


# ---------------------------------------------------------------- the registry refuses bad names


def make_strategy(name, doc="A throwaway strategy for the registry tests."):
    return type(f"Throwaway_{abs(hash(name))}", (Strategy,), {
        "name": name, "__doc__": doc, "route": lambda self, request, fleet: 0})


class ThrowawayPlugin:
    """A plugin object registering the given strategy classes."""

    def __init__(self, *classes):
        self.classes = classes

    @hookimpl
    def dynlab_register_strategies(self, register):
        for cls in self.classes:
            register(cls)


@pytest.fixture
def register_plugin():
    """Register throwaway plugins on the process's manager; unregister them afterwards, whatever happens."""
    pm = plugins.get_plugin_manager()
    added = []

    def register(plugin, name):
        pm.register(plugin, name=name)
        added.append(plugin)
        return plugin

    try:
        yield register
    finally:
        for plugin in added:
            pm.unregister(plugin)
    assert set(plugins.strategies().names()) == set(STRATEGY_NAMES)


def test_a_registered_plugin_is_seen_at_once(register_plugin):
    register_plugin(ThrowawayPlugin(make_strategy("throwaway-seen")), "throwaway-src")
    registry = plugins.strategies()
    assert "throwaway-seen" in registry
    assert [e.source for e in registry.entries() if e.name == "throwaway-seen"] == ["throwaway-src"]


@pytest.mark.parametrize("name", ["", None])
def test_empty_name_is_refused_naming_the_source(register_plugin, name):
    cls = make_strategy("x")
    cls.name = name if name is not None else ""
    register_plugin(ThrowawayPlugin(cls), "throwaway-empty-src")
    with pytest.raises(plugins.RegistryError) as info:
        plugins.strategies()
    assert "throwaway-empty-src" in str(info.value)


def test_missing_name_is_refused(register_plugin):
    class NoName(Strategy):
        """Sets no name."""

        def route(self, request, fleet):
            return 0

    register_plugin(ThrowawayPlugin(NoName), "throwaway-noname-src")
    with pytest.raises(plugins.RegistryError, match="throwaway-noname-src"):
        plugins.strategies()


def test_duplicate_of_a_builtin_names_both_sources(register_plugin):
    register_plugin(ThrowawayPlugin(make_strategy("rr")), "throwaway-dup-src")
    with pytest.raises(plugins.RegistryError) as info:
        plugins.strategies()
    message = str(info.value)
    assert "rr" in message and "throwaway-dup-src" in message
    assert SOURCES["rr"] in message.replace("throwaway-dup-src", "")


def test_duplicate_between_two_plugins_names_both_sources(register_plugin):
    register_plugin(ThrowawayPlugin(make_strategy("throwaway-twice")), "throwaway-first-src")
    register_plugin(ThrowawayPlugin(make_strategy("throwaway-twice")), "throwaway-second-src")
    with pytest.raises(plugins.RegistryError) as info:
        plugins.strategies()
    message = str(info.value)
    assert "throwaway-first-src" in message and "throwaway-second-src" in message
    assert "throwaway-twice" in message


def test_duplicate_within_one_plugin_is_refused(register_plugin):
    register_plugin(ThrowawayPlugin(make_strategy("throwaway-same"), make_strategy("throwaway-same")),
                    "throwaway-same-src")
    with pytest.raises(plugins.RegistryError, match="throwaway-same-src"):
        plugins.strategies()


def test_registry_errors_are_value_errors():
    assert issubclass(plugins.RegistryError, ValueError)


def test_unknown_name_lists_what_exists():
    with pytest.raises(plugins.UnknownNameError) as info:
        plugins.strategies().get("no-such-strategy")
    for name in STRATEGY_NAMES:
        assert name in str(info.value)


# ---------------------------------------------------------------- dynlab strategies


def _entry_point_distributions() -> dict[str, str]:
    """Module of each `dynlab` entry point -> the distribution that declares it (from the metadata)."""
    out = {}
    for ep in importlib.metadata.entry_points(group="dynlab"):
        out[ep.value.split(":")[0]] = ep.dist.name if ep.dist is not None else ""
    return out


def _line_for(output: str, name: str) -> str:
    lines = [line for line in output.splitlines() if line.split() and line.split()[0] == name]
    assert len(lines) == 1, (name, output)
    return lines[0]


def test_strategies_command_lists_name_description_distribution():
    result = CliRunner().invoke(main, ["strategies"])
    assert result.exit_code == 0, result.output
    dists = _entry_point_distributions()
    for entry in plugins.strategies().entries():
        line = _line_for(result.stdout, entry.name)
        doc_line = entry.cls.__doc__.strip().splitlines()[0].strip()
        assert doc_line in line
        dist = dists.get(entry.cls.__module__)
        assert dist, f"{entry.name}: its module {entry.cls.__module__} is not a dynlab entry point"
        assert dist in line.replace(entry.name, "", 1).replace(doc_line, "")
    # The built-ins come from the dynlab distribution itself.
    assert "dynlab" in _line_for(result.stdout, "rr").replace("rr", "", 1).split(".")[-1]


def test_strategies_command_lists_a_runtime_plugin(register_plugin):
    register_plugin(ThrowawayPlugin(make_strategy("throwaway-listed", "Throwaway: listed by the command.")),
                    "throwaway-listed-src")
    result = CliRunner().invoke(main, ["strategies"])
    assert result.exit_code == 0, result.output
    line = _line_for(result.stdout, "throwaway-listed")
    assert "Throwaway: listed by the command." in line and "throwaway-listed-src" in line


def test_conflicting_plugin_is_a_one_line_error(register_plugin):
    register_plugin(ThrowawayPlugin(make_strategy("rr")), "dup-src")
    r = CliRunner().invoke(main, ["strategies"])
    assert r.exit_code == 1, r.output
    assert "dup-src" in r.output and r.output.count("\n") == 1 and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["sim", "--mode", "kv"])
    assert r.exit_code == 1 and "registered twice" in r.output


def test_plugins_lists_every_kind_with_distribution_and_version():
    import importlib.metadata
    import json as _json

    from dynlab import plugins as _plugins

    out = CliRunner().invoke(main, ["plugins", "--json"])
    assert out.exit_code == 0, out.output
    rows = _json.loads(out.stdout)["plugins"]
    version = importlib.metadata.version("dynlab")
    for kind, registry in _plugins.kinds().items():
        names = [r["name"] for r in rows if r["kind"] == kind]
        assert names == registry().names()
    assert {r["kind"] for r in rows} == {"strategy", "eviction policy", "trace format", "latency model", "scorer",
                                            "workload", "engine kind", "queue policy", "admission policy", "controller"}
    assert all(r["source"] == "dynlab" and r["version"] == version for r in rows if r["name"] in ("rr", "lru", "mooncake"))
    text = CliRunner().invoke(main, ["plugins"]).stdout.splitlines()
    assert text[0].split() == ["KIND", "NAME", "DISTRIBUTION", "VERSION", "DESCRIPTION"]
    assert len(text) == len(rows) + 1


@pytest.mark.parametrize("command", ["strategies", "policies"])
def test_strategies_and_policies_take_the_same_flags(command):
    import json as _json

    for flags in ([], ["--verbose"], ["-v"], ["--json"], ["--json", "--verbose"]):
        r = CliRunner().invoke(main, [command, *flags])
        assert r.exit_code == 0, (flags, r.output)
    plain = _json.loads(CliRunner().invoke(main, [command, "--json"]).stdout)[command]
    verbose = _json.loads(CliRunner().invoke(main, [command, "--json", "--verbose"]).stdout)[command]
    assert [p["name"] for p in plain] == [p["name"] for p in verbose]
    assert all(set(p) == {"name", "description", "source", "version"} for p in plain)
    assert all(set(v) > set(p) for p, v in zip(plain, verbose))  # --verbose adds details


def test_every_hookspec_is_one_kind_of_the_table_and_its_function_checks_the_base():
    """plugins.KINDS drives every registry: one row per ``dynlab_register_*`` hookspec, each public function
    (``plugins.strategies`` ...) the table's, and a class that does not subclass its kind's base is refused."""
    import inspect

    from dynlab import hookspecs, plugins as _plugins
    from dynlab.engine.queues import QueuePolicy

    hooks = {n for n, _ in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("dynlab_register_")}
    assert {f"dynlab_register_{fn}" for _, fn, _ in _plugins.KINDS} == hooks
    for kind, fn, _ in _plugins.KINDS:
        assert _plugins.kinds()[kind] is getattr(_plugins, fn) and getattr(_plugins, fn).__name__ == fn
        assert getattr(_plugins, fn)().names() == _plugins.registry(kind).names()
    assert isinstance(_plugins.queue_policies().get("fcfs")(), QueuePolicy)
    # each kind's base is named, not imported, by plugins.py: every dotted name is a real class of that name
    import importlib

    for kind, dotted in _plugins.BASES.items():
        module, name = dotted.rsplit(".", 1)
        assert getattr(importlib.import_module(module), name).__qualname__ == name, kind
    assert set(_plugins.BASES) == {kind for kind, _, _ in _plugins.KINDS}

    class NotAStrategy:
        name = "not-a-strategy"

    pm = _plugins.get_plugin_manager()
    plugin = ThrowawayPlugin(NotAStrategy)
    pm.register(plugin, name="not-a-strategy-src")
    try:
        with pytest.raises(_plugins.RegistryError, match="strategy 'not-a-strategy' is not a subclass of "
                                                         "dynlab.routing.strategy.Strategy"):
            _plugins.strategies()
    finally:
        pm.unregister(plugin)
