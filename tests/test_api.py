"""The stable public API: the names that import from ``dynlab`` itself, and ``import dynlab`` staying light."""
from __future__ import annotations

import subprocess
import sys

import dynlab


def test_public_names_import_from_dynlab_directly():
    from dynlab import KvIndex, KvRouter, SimConfig, __version__, block_hashes, hookimpl, overlap, run
    from dynlab.engine.config import SimConfig as config_SimConfig
    from dynlab.sim.runner import run as engine_run
    from dynlab.hookspecs import hookimpl as spec_hookimpl
    from dynlab.routing.hashing import block_hashes as hashing_block_hashes, overlap as hashing_overlap
    from dynlab.routing.index import KvIndex as index_KvIndex
    from dynlab.routing.router import KvRouter as router_KvRouter

    assert (block_hashes, overlap, KvRouter, KvIndex) == (
        hashing_block_hashes, hashing_overlap, router_KvRouter, index_KvIndex)
    assert (SimConfig, run, hookimpl) == (config_SimConfig, engine_run, spec_hookimpl)
    assert isinstance(__version__, str)
    assert set(dynlab.__all__) == {"hookimpl", "__version__", "block_hashes", "dynamo_local_hashes", "overlap",
                                   "KvRouter", "KvIndex", "SimConfig", "run"}
    from dynlab import dynamo_local_hashes
    from dynlab.routing.hashing import dynamo_local_hashes as hashing_dynamo_local_hashes

    assert dynamo_local_hashes is hashing_dynamo_local_hashes
    assert set(dynlab.__all__) <= set(dir(dynlab))


def test_the_public_names_work():
    from dynlab import KvIndex, KvRouter, SimConfig, block_hashes, overlap, run

    assert len(block_hashes(list(range(40)), 16)) == 2
    assert overlap([1, 2, 3], {1, 2}) == 2
    assert KvRouter(2).route(list(range(96))) == 0
    idx = KvIndex()
    idx.apply_stored(0, [1, 2, 3])
    assert idx.find_matches([1, 2, 9]) == {0: 2}
    assert run(SimConfig(mode="rr"))["requests"] == 72


def test_unknown_name_is_an_attribute_error():
    try:
        dynlab.no_such_name
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_import_dynlab_imports_neither_the_engine_nor_the_router_nor_pluggy():
    code = ("import sys, dynlab; "
            "print(sorted(m for m in sys.modules if m.startswith(('dynlab.', 'pluggy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_subpackages_re_export_their_main_names():
    from dynlab.kv import EvictionPolicy, FutureIndex, LRUCache, TwoTierCache
    from dynlab.routing import (AllBlocksCleared, BlockRemoved, BlockStored, FleetView, KvEvent, KvIndex, KvRouter,
                                Request, RunContext, Strategy, StrategyOption, block_hashes, overlap)
    from dynlab.traces import BUILTIN_TRACES, TraceFormat, load_trace, open_trace

    import dynlab.routing

    assert set(dynlab.routing.__all__) == {
        "block_hashes", "overlap", "KvIndex", "KvRouter", "Strategy", "StrategyOption", "RunContext", "FleetView",
        "Request", "BlockStored", "BlockRemoved", "AllBlocksCleared", "KvEvent", "KvEventBatch",
        "dynamo_local_hashes", "HASH_SCHEMES"}
    assert all(x is not None for x in (EvictionPolicy, FutureIndex, LRUCache, TwoTierCache, AllBlocksCleared,
                                       BlockRemoved, BlockStored, FleetView, KvEvent, KvIndex, KvRouter, Request,
                                       RunContext, Strategy, StrategyOption, block_hashes, overlap, BUILTIN_TRACES,
                                       TraceFormat, load_trace, open_trace))


def test_python_m_dynlab_is_the_command():
    import subprocess
    import sys

    from dynlab import __version__

    done = subprocess.run([sys.executable, "-m", "dynlab", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"dynlab, version {__version__}\n"
    done = subprocess.run([sys.executable, "-m", "dynlab", "sim", "--workers", "0"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("Error: ") and "Usage: dynlab" not in done.stderr
