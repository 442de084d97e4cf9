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
