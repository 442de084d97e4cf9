"""The ``dynlab`` entry points of the installed distributions, found without ``importlib.metadata``
where the environment allows.

``importlib.metadata`` imports ``email``, ``zipfile`` and ``csv`` (about 15 ms of a ~0.4 s count-based
run's start-up, measured 2026-12-02 with ``python -X importtime``) to read what, in an ordinary
environment, is a few small text files. :func:`entry_points` reads them itself when every place
``importlib.metadata`` would look is a plain directory: the metadata path finder is the only
distribution finder on ``sys.meta_path`` and no ``sys.path`` entry is a file (a zip) or an ``.egg``.
It then follows ``importlib.metadata``'s own rules (Python 3.11's ``Lookup``, ``_unique`` and
``Sectioned``): directories in ``sys.path`` order; in each, ``*.dist-info`` / ``*.egg-info`` folders
in listing order grouped by normalised name; the first distribution of a normalised name wins;
``entry_points.txt`` read as ``[group]`` sections of ``name = value`` lines (``#`` comments). So the
entry points, their order and their distributions' names are the same (a test compares both ways).
Anywhere else, or on anything unexpected, it asks ``importlib.metadata``.
"""
from __future__ import annotations

import os
import re
import sys
from importlib import import_module

_PATTERN = re.compile(r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$")  # importlib's


class EntryPoint:
    """One entry point: ``name``, ``value`` (``module[:attr]``), :meth:`load`, :meth:`dist_name`."""

    __slots__ = ("name", "value", "_dist")

    def __init__(self, name: str, value: str, dist: "_Dist"):
        self.name, self.value, self._dist = name, value, dist

    def load(self):
        """The module (or its attribute) the value names, imported (``importlib.metadata``'s rule).
        Raises ``ValueError`` for a value that names no module, else what the import raises."""
        match = _PATTERN.match(self.value)
        if match is None:
            raise ValueError(f"entry point {self.name!r}: {self.value!r} is not module[:attr]")
        obj = import_module(match.group("module"))
        for attr in filter(None, (match.group("attr") or "").split(".")):
            obj = getattr(obj, attr)
        return obj

    def dist_name(self) -> str:
        """The ``Name`` of the distribution that declares it (``?`` when unknown), read once per distribution."""
        return self._dist.name()


class _Dist:
    """A distribution's metadata folder; its ``Name`` read on first use (each read parses its METADATA)."""

    __slots__ = ("path", "_name", "_importlib")

    def __init__(self, path, importlib_dist=None):
        self.path, self._name, self._importlib = path, None, importlib_dist

    def name(self) -> str:
        if self._name is None:
            if self._importlib is not None:
                self._name = self._importlib.metadata["Name"]
            elif self.path is None:
                self._name = "?"
            else:
                name = _metadata_name(self.path)
                if name is None:  # a METADATA beyond the simple case: importlib's e-mail parser reads it
                    import importlib.metadata
                    import pathlib

                    name = importlib.metadata.PathDistribution(pathlib.Path(self.path)).metadata["Name"]
                self._name = name
        return self._name


def entry_points(group: str) -> list[EntryPoint]:
    """The entry points of ``group`` of every installed distribution, in ``importlib.metadata``'s order."""
    found = None
    try:
        found = _scan(group)
    except Exception:  # anything unusual: importlib.metadata says what it says (or raises it)
        found = None
    if found is not None:
        return found
    import importlib.metadata

    dists: dict = {}  # one per distribution folder, so that its METADATA is parsed once
    out = []
    for ep in importlib.metadata.entry_points(group=group):
        key = str(getattr(ep.dist, "_path", id(ep.dist)))
        if key not in dists:
            dists[key] = _Dist(None, ep.dist)
        out.append(EntryPoint(ep.name, ep.value, dists[key]))
    return out


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")  # importlib's Prepared.normalize


def _scan(group: str):
    """:func:`entry_points` read from the directories; ``None`` where only importlib.metadata can read it."""
    from importlib.machinery import PathFinder

    finders = [f for f in sys.meta_path if getattr(f, "find_distributions", None) is not None]
    if finders != [PathFinder]:
        return None
    out, seen = [], set()
    for root in sys.path:
        if not isinstance(root, str) or os.path.basename(root).lower().endswith(".egg"):
            return None
        try:
            children = os.listdir(root or ".")
        except OSError:
            if os.path.isfile(root or "."):  # a zip: importlib reads its names
                return None
            continue
        infos: dict = {}
        for child in children:
            low = child.lower()
            if low.endswith((".dist-info", ".egg-info")):
                infos.setdefault(_normalize(low.rpartition(".")[0].partition("-")[0]), []).append(child)
        for child in (c for group_ in infos.values() for c in group_):
            stem, ext = os.path.splitext(child)
            name = stem.partition("-")[0]
            if ext not in (".dist-info", ".egg-info") or not name:
                return None  # importlib would read the Name from METADATA here
            key = _normalize(name)
            if key in seen:
                continue
            seen.add(key)
            path = os.path.join(root, child)
            text = _read(path, "entry_points.txt")
            if text:
                out.extend(_parse(text, group, _Dist(path)))
    return out


def _read(folder: str, filename: str):
    """A metadata file's text (UTF-8), ``None`` when absent (importlib's ``read_text``)."""
    try:
        with open(os.path.join(folder, filename), encoding="utf-8") as fh:
            return fh.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
        return None


def _parse(text: str, group: str, dist: _Dist) -> list[EntryPoint]:
    """The ``group`` entries of an ``entry_points.txt`` (importlib's ``Sectioned`` rules)."""
    section, out = None, []
    for line in map(str.strip, text.splitlines()):
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line.strip("[]")
            continue
        if section == group:
            name, value = line.split("=", 1)  # a line without '=' raises (as importlib does): importlib then
            out.append(EntryPoint(name.strip(), value.strip(), dist))
    return out


def _metadata_name(folder: str):
    """The ``Name`` header of a folder's METADATA (PKG-INFO for an egg-info), ``None`` beyond the simple
    case (no file, no Name, a folded header), which importlib's e-mail parser then reads."""
    text = _read(folder, "METADATA") or _read(folder, "PKG-INFO")
    if not text:
        return None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line:
            return None  # the end of the headers
        key, sep, value = line.partition(":")
        if sep and key.lower() == "name":
            if i + 1 < len(lines) and lines[i + 1][:1] in (" ", "\t"):
                return None
            return value.strip()
    return None
