"""dynlab.plugins._dist_name: an entry point's distribution name, its METADATA parsed once per distribution."""
from __future__ import annotations

from dynlab.plugins import _dist_name


class FakeDist:
    def __init__(self, path, name):
        self._path, self._name, self.reads = path, name, 0

    @property
    def metadata(self):
        self.reads += 1
        return {"Name": self._name}


def test_one_parse_per_distribution_and_unknown_is_a_question_mark():
    names: dict = {}
    a1, a2, b = FakeDist("/site/a.dist-info", "a"), FakeDist("/site/a.dist-info", "a"), FakeDist("/site/b", "b")
    assert [_dist_name(d, names) for d in (a1, a2, b, a1)] == ["a", "a", "b", "a"]
    assert (a1.reads, a2.reads, b.reads) == (1, 0, 1)  # the second entry point of `a` reads nothing
    assert _dist_name(None, names) == "?"


def test_the_installed_plugins_keep_their_distribution_as_source():
    from dynlab import plugins

    assert {e.source for e in plugins.strategies().entries()} >= {"dynlab"}


def test_a_third_party_entry_point_named_like_a_builtin_is_loaded_not_skipped(tmp_path, monkeypatch):
    """A distribution whose entry point is called ``strategies`` (a built-in's name) was skipped without a word
    and its strategy then showed up as unknown (issue 39); it is registered as ``strategies (DIST)``."""
    import importlib.metadata
    import warnings

    from dynlab import plugins

    (tmp_path / "same_name_plugin.py").write_text(
        "from dynlab import hookimpl\nfrom dynlab.routing.strategy import Strategy\n\n"
        "class FirstWorker(Strategy):\n    '''Always worker 0.'''\n    name = 'first-worker'\n\n"
        "    def route(self, request, fleet):\n        return 0\n\n"
        "@hookimpl\ndef dynlab_register_strategies(register):\n    register(FirstWorker)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    builtin = [ep for ep in importlib.metadata.entry_points(group="dynlab")]
    assert "strategies" in {ep.name for ep in builtin}
    extra = importlib.metadata.EntryPoint("strategies", "same_name_plugin", "dynlab")
    again = [ep for ep in builtin if ep.name == "strategies"]  # one distribution seen twice: loaded once
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither entry point is left out with a warning
        pm = plugins.load_plugins([*builtin, extra, *again])
    names = [name for name, _ in pm.list_name_plugin()]
    assert "strategies" in names and "strategies (?)" in names and names.count("strategies") == 1
    found = plugins.strategies(pm)
    assert "first-worker" in found and "rr" in found
