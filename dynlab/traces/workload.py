"""Workloads without a trace: the :class:`Workload` interface (plugin kind ``workload``) and spec files.

:mod:`dynlab.traces.workload_io` turns the rows a registered workload yields into requests
(``sim --workload``) or writes them as a trace (``dynlab workload SPEC --out FILE``); this module, like
:mod:`dynlab.traces.format` for trace formats, is the interface alone and imports no registry.

A spec is a JSON object (a ``.yaml``/``.yml`` file is read as YAML when PyYAML is installed, the
``yaml`` extra). Its ``generator`` key names the registered workload (``synthetic``, the built-in,
when absent); the other keys are that workload's (docs/workloads.md). A workload yields **token
rows**, the rows of a ``tokens`` trace: ``{"timestamp": ms, "tokens": [ints], "output_length": n}``
(plus ``"output_tokens": [n ints]`` when the workload knows its replies' ids) in time order, so ``sim --workload SPEC`` and ``sim --trace FILE`` of the file it writes replay the
same requests.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import ClassVar, Iterator, Optional

from dynlab.errors import DynlabError, InputFileError

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
    #: ``(users, think time ms)`` when the spec asks for closed-loop users (the timed run takes them as
    #: ``--concurrency`` and ``--think-time-ms``); ``None``: the rows' timestamps are their arrivals
    closed: Optional[tuple] = None
    #: ``{row: (previous row, think time ms)}`` for turns sent after the previous turn's answer (rows
    #: counted from 0 in the order :meth:`rows` yields them); ``None``: every row arrives at its timestamp
    follows: Optional[dict] = None

    def __init__(self, spec: dict, source: str = "<spec>"):
        self.spec, self.source = spec, source

    def fail(self, key: str, message: str) -> SpecError:
        """The :class:`SpecError` for ``key`` (a dotted path such as ``arrival.rate``)."""
        return SpecError(self.source, key, message)

    def resolve(self, path: str) -> str:
        """A file the spec names (a trace of lengths, say), as the spec's author meant it: a relative path is
        relative to the spec file's folder, not to the working directory; an absolute path, ``-`` and a
        bundled trace name (:data:`dynlab.traces.bundled.BUILTIN_TRACES`) are returned as they are, and so is
        every path when the spec has no file (``source`` is not a path)."""
        import os

        from dynlab.traces.bundled import BUILTIN_TRACES

        if path == "-" or path in BUILTIN_TRACES or os.path.isabs(path) or not os.path.isfile(self.source):
            return path
        return os.path.join(os.path.dirname(self.source), path)

    @abstractmethod
    def rows(self) -> Iterator[dict]:
        """Token rows in time order: ``timestamp`` (ms), ``tokens`` (ints, at least one), ``output_length``
        (tokens >= 0) and, optionally, ``output_tokens`` (``output_length`` ints: the reply's ids) and the
        standard request attributes (``priority`` an int; ``tenant``, ``user``, ``lora_name``, ``session_id``, ``class``
        strings; ``Request.attrs``, :data:`dynlab.traces.format.ATTRIBUTES`)."""


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


__all__ = ["Workload", "SpecError", "load_spec"]
