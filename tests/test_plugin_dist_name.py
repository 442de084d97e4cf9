"""dynlab.entry_points: the ``dynlab`` entry points read from the metadata folders as importlib.metadata reads
them (the same entry points, order and distribution names), each distribution's METADATA parsed once."""
from __future__ import annotations

import importlib.metadata
import sys

import pytest

from dynlab import entry_points as eps


def _importlib(group):
    return [(ep.name, ep.value, ep.dist.metadata["Name"] if ep.dist is not None else "?")
            for ep in importlib.metadata.entry_points(group=group)]


def _ours(group):
    return [(ep.name, ep.value, ep.dist_name()) for ep in eps.entry_points(group)]


def test_the_installed_entry_points_are_importlibs():
    assert eps._scan("dynlab") is not None  # this environment is read without importlib.metadata
    assert _ours("dynlab") == _importlib("dynlab")
    assert ("strategies", "dynlab_builtins.strategies", "dynlab") in _ours("dynlab")
    assert _ours("console_scripts") == _importlib("console_scripts")


def _dist(folder, name, metadata, entry_points):
    d = folder / name
    d.mkdir(parents=True)
    if metadata is not None:
        (d / ("PKG-INFO" if name.endswith(".egg-info") else "METADATA")).write_text(metadata)
    if entry_points is not None:
        (d / "entry_points.txt").write_text(entry_points)
    return d


def test_a_made_up_sys_path_reads_as_importlib_reads_it(tmp_path, monkeypatch):
    one, two = tmp_path / "one", tmp_path / "two"
    # the same distribution in two places (the first on sys.path wins), a second spelling of its name in
    # the first place (the same normalised name: left out too), comments and another group
    _dist(one, "Pkg_A-1.0.dist-info", "Metadata-Version: 2.1\nName: pkg-a\nVersion: 1.0\n\nbody\n",
          "# a comment\n[other]\nx = nope\n[dynlab]\nfirst = pkg_a.first\n  second=pkg_a.mod:attr  \n")
    _dist(one, "pkg.a-2.0.dist-info", "Name: pkg.a\n", "[dynlab]\nshadowed = pkg_a.other\n")
    _dist(two, "pkg_a-0.9.dist-info", "Name: pkg-a\n", "[dynlab]\nold = pkg_a.old\n")
    # an egg-info (PKG-INFO), a folded Name header (importlib's parser reads it), no METADATA at all
    _dist(two, "eggy-3.egg-info", "Metadata-Version: 1.0\nName: Eggy\n", "[dynlab]\negg = eggy\n")
    _dist(two, "folded-1.dist-info", "Name: fol\n ded\n", "[dynlab]\nf = folded\n")
    _dist(two, "bare-1.dist-info", None, "[dynlab]\nb = bare\n")
    _dist(two, "noeps-1.dist-info", "Name: noeps\n", None)
    monkeypatch.setattr(sys, "path", [str(one), str(tmp_path / "missing"), str(two), str(one)])
    importlib.invalidate_caches()
    assert eps._scan("dynlab") is not None
    assert _ours("dynlab") == _importlib("dynlab")
    names = [n for n, _, _ in _ours("dynlab")]
    # pkg.a normalises as Pkg_A does: the second folder is the same distribution, left out as the third
    assert names[:2] == ["first", "second"] and sorted(names[2:]) == ["b", "egg", "f"]  # (listing order)
    assert dict((n, d) for n, _, d in _ours("dynlab"))["egg"] == "Eggy"


def test_a_zip_on_sys_path_is_left_to_importlib(tmp_path, monkeypatch):
    (tmp_path / "lib.zip").write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip archive
    monkeypatch.setattr(sys, "path", [str(tmp_path / "lib.zip")] + sys.path)
    assert eps._scan("dynlab") is None
    assert _ours("dynlab") == _importlib("dynlab")


def test_one_metadata_read_per_distribution(tmp_path, monkeypatch):
    _dist(tmp_path, "multi-1.dist-info", "Name: multi\n", "[dynlab]\na = m.a\nb = m.b\nc = m.c\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    reads = []
    real = eps._metadata_name
    monkeypatch.setattr(eps, "_metadata_name", lambda folder: reads.append(folder) or real(folder))
    assert [ep.dist_name() for ep in eps.entry_points("dynlab")] == ["multi"] * 3
    assert len(reads) == 1


def test_load_imports_the_module_and_its_attribute():
    ep = eps.EntryPoint("x", "dynlab.routing.index:KvIndex.find_matches", eps._Dist(None))
    from dynlab.routing.index import KvIndex

    assert ep.load() is KvIndex.find_matches
    assert eps.EntryPoint("m", "dynlab.limits", eps._Dist(None)).load() is sys.modules["dynlab.limits"]
    assert eps._Dist(None).name() == "?"
    with pytest.raises(ValueError, match="not module"):
        eps.EntryPoint("bad", "no such thing!", eps._Dist(None)).load()
