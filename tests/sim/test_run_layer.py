"""The run layer's contracts: SimConfig's sections, flat keywords, the import graph, no private overrides."""
from __future__ import annotations

import ast
import pathlib
from dataclasses import fields, replace

import pytest

import dynlab
from dynlab.engine.config import SECTION_CLASSES, SECTIONS, PdSection, SimConfig, TrafficSection
from dynlab.engine.metrics import Recorder, hooks

ROOT = pathlib.Path(dynlab.__file__).parent


def test_flat_keywords_keep_working_and_dynlab_run_is_unchanged():
    config = SimConfig(mode="kv", workers=2, prefixes=12, reps=6, seed=1)
    # the seed lab's numbers (docs/commands.md, `dynlab sim`)
    assert dynlab.run(config) == {"mode": "kv", "workers": 2, "requests": 72, "repeat_requests": 60, "hits": 60,
                                  "hit_rate": 1.0}
    c = SimConfig(workers=3, link_gbps=2.0, slo_ttft_ms=100.0, opts={"a": "1"})
    assert (c.fleet.workers, c.disagg.link_gbps, c.slo.slo_ttft_ms, c.fleet.opts) == (3, 2.0, 100.0, {"a": "1"})
    assert replace(c, workers=4).fleet.workers == 4  # dataclasses.replace on flat fields, as before


def test_every_field_is_in_exactly_one_section():
    names = [f for section in SECTIONS.values() for f in section]
    assert sorted(names) == sorted(f.name for f in fields(SimConfig))
    assert len(names) == len(set(names))
    assert list(SECTIONS) == ["traffic", "fleet", "engine", "kv", "events", "slo", "disagg"]


def test_section_defaults_are_simconfigs():
    default = SimConfig()
    for name, cls in SECTION_CLASSES.items():
        assert getattr(default, name) == cls()
    assert SimConfig.from_sections() == default


def test_from_sections_round_trip_and_errors():
    c = SimConfig(trace="t.jsonl", time_scale=0.5, split="2:1", link_latency_ms=3.0, timing=True)
    assert SimConfig.from_sections(**{name: getattr(c, name) for name in SECTIONS}) == c
    assert SimConfig.from_sections(traffic=TrafficSection(seed=7)).seed == 7
    with pytest.raises(TypeError, match="unknown section 'pd'"):
        SimConfig.from_sections(pd=PdSection())
    with pytest.raises(TypeError, match="must be a PdSection"):
        SimConfig.from_sections(disagg=TrafficSection())


def test_hooks_skip_what_a_recorder_does_not_override():
    class OnlyFinish(Recorder):
        def on_finish(self, req, t):
            pass

    r = OnlyFinish()
    assert hooks([r], "on_finish") == [r.on_finish]
    assert hooks([r], "on_step") == [] and hooks([r], "on_route") == []


# -- the import graph -------------------------------------------------------------------------------
#: layers, lowest first: a module may import its own layer or a lower one, never a higher one. ``plugins``
#: is dynlab/plugins.py, which names each kind's base class by its dotted name instead of importing it
#: (:data:`dynlab.plugins.BASES`), so the layers that read registries sit above it with no loop (issue 39)
LAYERS = ["plugins", "routing", "models", "kv", "traces", "latency", "engine", "disagg", "sim"]
#: arrows known to run back up (none since the model catalogue, dynlab/models, took config.json parsing)
KNOWN_UPWARD: set = set()


def _imports(path: pathlib.Path):
    """Every ``dynlab.X`` package a module imports, at module level or inside a function (lazy)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dynlab."):
            yield node.module.split(".")[1]
        elif isinstance(node, ast.ImportFrom) and node.module == "dynlab":  # from dynlab import plugins
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("dynlab."):
                    yield alias.name.split(".")[1]


def test_no_arrow_runs_back_up_between_the_layers():
    upward = set()
    for layer in LAYERS:
        for path in (ROOT / layer).glob("*.py") if (ROOT / layer).is_dir() else [ROOT / f"{layer}.py"]:
            for target in _imports(path):
                if target in LAYERS and LAYERS.index(target) > LAYERS.index(layer):
                    upward.add((str(path.relative_to(ROOT)), target))
                assert target not in ("cli",), f"{path} imports dynlab.cli"
    assert upward <= KNOWN_UPWARD, upward - KNOWN_UPWARD


def test_engine_serving_no_longer_imports_disagg():
    assert "disagg" not in set(_imports(ROOT / "engine" / "serving.py"))


def test_disagg_overrides_no_private_method_of_engine_classes():
    from dynlab.disagg import fleet
    from dynlab.engine.timed import TimedFleet
    from dynlab.engine.worker import EngineWorker

    for obj in vars(fleet).values():
        if isinstance(obj, type) and obj.__module__ == fleet.__name__:
            assert not issubclass(obj, (TimedFleet, EngineWorker)), obj
    # nor reads an engine's private state: every `x._name` in disagg/ is on self
    for path in (ROOT / "disagg").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                assert isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"), \
                    f"{path.name}:{node.lineno} reads .{node.attr}"


def test_decode_routers_are_ordinary_strategies():
    from dynlab.disagg.decode_router import DECODE_ROUTER_CLASSES, decode_router
    from dynlab.engine.config import DECODE_ROUTERS
    from dynlab.routing.strategy import Strategy

    assert tuple(DECODE_ROUTER_CLASSES) == DECODE_ROUTERS
    assert all(issubclass(cls, Strategy) for cls in DECODE_ROUTER_CLASSES.values())
    with pytest.raises(ValueError, match="decode_router must be one of"):
        decode_router("nosuch", 2, 100)
