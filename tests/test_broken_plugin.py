"""One broken third-party plugin (an entry point of the ``dynlab`` group whose import raises, or whose register
hook raises) is left out with one warning on stderr naming it and the error; every command goes on with the
built-ins (dynlab/plugins.py)."""
from __future__ import annotations

import importlib.metadata
import json

import pytest

from dynlab import plugins
from helpers import invoke, ok

BROKEN_IMPORT = "raise RuntimeError('boom at import')\n"
BROKEN_HOOK = ("from dynlab import hookimpl\n\n"
               "@hookimpl\ndef dynlab_register_strategies(register):\n    raise RuntimeError('boom in hook')\n\n"
               "@hookimpl\ndef dynlab_register_scorers(register):\n    raise RuntimeError('boom in hook')\n")


class FakeDist:
    """The distribution an entry point comes from: only its ``Name`` is read (plugins._dist_name)."""

    def __init__(self, name):
        self._path, self.metadata = f"/site/{name}.dist-info", {"Name": name}


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """``installed(name, source)``: the process's ``dynlab`` entry points plus one of distribution ``NAME-dist``
    naming a module of ``source``; the plugin manager is rebuilt from them (and again after the test)."""
    builtin = list(importlib.metadata.entry_points(group="dynlab"))
    monkeypatch.syspath_prepend(str(tmp_path))

    def install(name, source):
        (tmp_path / f"{name}_plugin.py").write_text(source)
        extra = importlib.metadata.EntryPoint(name, f"{name}_plugin", "dynlab")._for(FakeDist(f"{name}-dist"))
        monkeypatch.setattr(importlib.metadata, "entry_points",
                            lambda group=None, **kw: [*builtin, extra] if group == "dynlab" else [])
        plugins.get_plugin_manager.cache_clear()
        plugins._HOOK_FAILED.clear()

    yield install
    plugins.get_plugin_manager.cache_clear()
    plugins._HOOK_FAILED.clear()


def _runs_with_warnings(*expected: str):
    r = ok(invoke("sim", "--mode", "weighted"))  # the strategies and the scorers are collected, some more than once
    assert json.loads(r.stdout)["mode"] == "weighted"
    assert r.stderr.splitlines() == list(expected)
    return r


def test_a_plugin_whose_import_raises_is_left_out_with_one_warning(installed):
    installed("broken", BROKEN_IMPORT)
    _runs_with_warnings("Warning: dynlab plugin 'broken' from broken-dist is left out: RuntimeError: boom at import")
    listed = ok(invoke("plugins"))
    assert "broken" not in listed.stdout and "kv-cost" in listed.stdout


def test_a_plugin_whose_hook_raises_is_left_out_of_that_kind_with_one_warning_each(installed):
    installed("hookbad", BROKEN_HOOK)
    _runs_with_warnings(*(f"Warning: dynlab plugin hookbad-dist is left out of {kind}: its dynlab_register_{kind} "
                          "hook failed: RuntimeError: boom in hook" for kind in ("strategies", "scorers")))
    r = ok(invoke("plugins"))  # every kind collected again, in the same process: nothing warned twice
    assert "kv-cost" in r.stdout and "hookbad" not in r.stdout and r.stderr == ""


def test_a_hook_that_raises_after_registering_leaves_none_of_its_classes(installed):
    installed("half", "from dynlab import hookimpl\nfrom dynlab.routing.strategy import Strategy\n\n"
                      "class First(Strategy):\n    name = 'first'\n\n    def route(self, request, fleet):\n"
                      "        return 0\n\n"
                      "@hookimpl\ndef dynlab_register_strategies(register):\n    register(First)\n"
                      "    raise RuntimeError('half way')\n")
    with pytest.warns(plugins.PluginWarning, match="half-dist is left out of strategies: .*half way"):
        found = plugins.strategies()
    assert "first" not in found and "rr" in found
