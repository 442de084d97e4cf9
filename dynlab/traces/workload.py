"""Workloads without a trace: the :class:`Workload` interface (plugin kind ``workload``), spec files, and
the rows a workload yields turned into requests (``sim --workload``) or written as a trace
(``dynlab workload SPEC --out FILE``).

A spec is a JSON object (a ``.yaml``/``.yml`` file is read as YAML when PyYAML is installed, the
``yaml`` extra). Its ``generator`` key names the registered workload (``synthetic``, the built-in,
when absent); the other keys are that workload's (docs/workloads.md). A workload yields **token
rows**, the rows of a ``tokens`` trace: ``{"timestamp": ms, "tokens": [ints], "output_length": n}``
in time order, so ``sim --workload SPEC`` and ``sim --trace FILE`` of the file it writes replay the
same requests.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import ClassVar, Iterable, Iterator

from dynlab.errors import DynlabError, InputFileError

#: ``--format`` values of ``dynlab workload``: a token trace, or a Mooncake trace of 512-token blocks
WRITE_FORMATS = ("token", "mooncake")
#: tokens per ``hash_id`` of a written Mooncake trace (Mooncake's own)
MOONCAKE_BLOCK = 512


class SpecError(DynlabError):
    """A bad workload spec: ``str()`` is ``SPEC: KEY: what is wrong`` (one line, naming the key)."""

    def __init__(self, source: str, key: str, message: str):
        self.source, self.key, self.message = source, key, message
        super().__init__(f"{source}: {key}: {message}" if key else f"{source}: {message}")


class Workload(ABC):
    """Base class of workload generators: a spec (a dict) in, token rows out.

    Subclasses set ``name`` (the spec's ``generator`` value) and a one-line docstring, check the
    spec in ``__init__`` (raise :class:`SpecError` via :meth:`fail`, naming the key), and implement
    :meth:`rows`. ``source`` names the spec in messages (its path).
    """

    name: ClassVar[str] = ""

    def __init__(self, spec: dict, source: str = "<spec>"):
        self.spec, self.source = spec, source

    def fail(self, key: str, message: str) -> SpecError:
        """The :class:`SpecError` for ``key`` (a dotted path such as ``arrival.rate``)."""
        return SpecError(self.source, key, message)

    @abstractmethod
    def rows(self) -> Iterator[dict]:
        """Token rows in time order: ``timestamp`` (ms), ``tokens`` (ints, at least one), ``output_length``
        (tokens >= 0)."""


def load_spec(path: str) -> dict:
    """The spec in ``path``: a JSON object, or YAML for ``.yaml``/``.yml`` (needs PyYAML).

    Raises :class:`~dynlab.errors.InputFileError` when the file cannot be opened, :class:`SpecError`
    when it is not an object (JSON's message with its line), or YAML without PyYAML.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise InputFileError(path, "no such workload spec file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(path, getattr(exc, "strerror", None) or str(exc)) from None
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise SpecError(path, "", "a YAML spec needs PyYAML (pip install 'dynlab[yaml]'), or write it as JSON") \
                from None
        try:
            spec = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}: " if mark is not None else ""
            raise SpecError(path, "", f"{where}not YAML: {getattr(exc, 'problem', None) or exc}") from None
    else:
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{path}:{exc.lineno}", "", f"not JSON: {exc.msg}") from None
    if not isinstance(spec, dict):
        raise SpecError(path, "", f"a spec is an object of keys (seed, requests, arrival, ...), got {type(spec).__name__}")
    return spec


def open_workload(path: str, registry=None) -> Workload:
    """The workload of the spec file ``path``, checked (:func:`load_spec`; the ``generator`` looked up
    in the ``workload`` registry, default ``synthetic``). Raises :class:`SpecError` for a bad spec or
    an unknown generator, :class:`~dynlab.errors.InputFileError` for a file that cannot be opened."""
    from dynlab import plugins

    spec = load_spec(path)
    registry = registry if registry is not None else plugins.workloads()
    name = spec.get("generator", "synthetic")
    if not isinstance(name, str) or name not in registry:
        raise SpecError(path, "generator", f"unknown workload {name!r}; available: {', '.join(registry.names())}")
    return registry.get(name)(spec, path)


def workload_requests(path: str, block: int = 16, scheme: str = "dynlab"):
    """The requests of the spec ``path`` (a :class:`~dynlab.traces.reader.TraceRequests`): each row's
    tokens hashed at ``block`` tokens per block with ``scheme``, as a ``tokens`` trace of the same
    rows is. Raises what :func:`open_workload` raises."""
    from dynlab.routing.hashing import block_hashes
    from dynlab.routing.strategy import Request
    from dynlab.traces.reader import TraceRequests

    out = TraceRequests()
    for i, row in enumerate(open_workload(path).rows()):
        toks = row["tokens"]
        out.append(Request(tuple(block_hashes(toks, block, scheme=scheme)), len(toks), row["output_length"],
                           row["timestamp"], i))
    out.block_tokens, out.own_block_tokens = block, None
    return out


def mooncake_rows(rows: Iterable[dict], block: int = MOONCAKE_BLOCK) -> Iterator[dict]:
    """Token rows as Mooncake rows: ``timestamp``, ``input_length``, ``output_length`` and ``hash_ids``,
    one id per ``block``-token block (the last one partial), chained: two rows share id ``i`` exactly
    when they share every token up to the end of block ``i``. Ids count from 0 in order of first use."""
    ids: dict = {}
    for row in rows:
        toks, parent, hashes = row["tokens"], -1, []
        for s in range(0, len(toks), block):
            key = (parent, tuple(toks[s:s + block]))
            parent = ids.setdefault(key, len(ids))
            hashes.append(parent)
        yield {"timestamp": row["timestamp"], "input_length": len(toks), "output_length": row["output_length"],
               "hash_ids": hashes}


def write_workload(spec_path: str, out: str, fmt: str = "token") -> int:
    """Generate the spec ``spec_path`` and write it to ``out`` as a ``token`` or ``mooncake`` trace
    (JSON lines), atomically (:func:`dynlab.atomic.replace_file`: a failure leaves ``out`` as it was).
    Returns the number of requests written. Raises what :func:`open_workload` raises, ``ValueError``
    for an unknown ``fmt``."""
    from dynlab.atomic import replace_file

    if fmt not in WRITE_FORMATS:
        raise ValueError(f"format must be one of {', '.join(WRITE_FORMATS)}, got {fmt!r}")
    rows = list(open_workload(spec_path).rows())  # generated (and checked) before anything is written
    if fmt == "mooncake":
        rows = list(mooncake_rows(rows))

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, separators=(", ", ": ")) + "\n")

    replace_file(out, write)
    return len(rows)


__all__ = ["Workload", "SpecError", "load_spec", "open_workload", "workload_requests", "mooncake_rows",
           "write_workload", "WRITE_FORMATS"]
