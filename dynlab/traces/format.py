"""The trace-format interface: :class:`TraceFormat`, what a trace-format plugin implements.

It stands apart from the readers (:mod:`dynlab.traces.reader`), which look formats up in the
plugin registry, so that the registry can name this base class without importing the readers.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from types import MappingProxyType
from typing import Any, ClassVar, Iterator, Mapping, Optional

from dynlab.routing.strategy import NO_ATTRS, Request

#: the standard request attributes (``Request.attrs``) and their types: a format that declares one of them
#: in :attr:`TraceFormat.attributes` carries it with this type (``priority`` an int, not a bool)
ATTRIBUTES: Mapping[str, type] = MappingProxyType({"priority": int, "tenant": str, "user": str, "lora_name": str,
                                                    "session_id": str, "class": str})


def check_attribute(key: str, value: Any) -> Any:
    """``value`` of the attribute field ``key``, checked: a standard attribute's type (:data:`ATTRIBUTES`),
    else a JSON scalar (a string, a finite number or a boolean). Raises ``ValueError`` naming the field."""
    kind = ATTRIBUTES.get(key)
    if kind is int:
        if type(value) is not int:
            raise ValueError(f"field {key!r} must be an integer, got {value!r}")
    elif kind is str:
        if not isinstance(value, str):
            raise ValueError(f"field {key!r} must be a string, got {value!r}")
    elif not isinstance(value, (str, int, float)) or (type(value) is float and not math.isfinite(value)):
        raise ValueError(f"field {key!r} (a request attribute) must be a string, a finite number or a boolean, "
                         f"got {value!r}")
    return value


class TraceFormat(ABC):
    """Base class of trace readers: turns one decoded JSON line into a :class:`Request`.

    Subclasses set ``name`` (the ``--trace-format`` value) and a one-line docstring,
    implement :meth:`detect` (does a first record look like this format?) and
    :meth:`parse` (raise ``ValueError`` with a short message for a bad record; the
    reader adds ``FILE:LINE``). ``block`` is the ``--block`` option (tokens per
    block), for formats that hash tokens themselves.
    """

    name: ClassVar[str] = ""
    #: tokens per block of the names the format yields; ``None``: the ``--block`` option
    block_tokens: ClassVar[Optional[int]] = None
    #: whether the format hashes tokens itself (and so follows ``--hash``); a format that reads
    #: names from the trace (Mooncake's ``hash_ids``) leaves it False and ``--hash dynamo`` is refused
    hashes_tokens: ClassVar[bool] = False
    #: the hash scheme (``--hash``) for formats that hash tokens; set by the reader after construction
    hash_scheme: str = "dynlab"
    #: tokens after each block its name covers (vLLM's EAGLE hash lookahead,
    #: :func:`dynlab.routing.hashing.lookahead_names`); set by the reader for formats that hash tokens
    hash_lookahead: int = 0
    #: whether the format reads its file whole (:meth:`read_all`): a file that is not one JSON object
    #: per line (CSV, a JSON array), or whose rows must be assembled (sessions) or sorted first
    whole_file: ClassVar[bool] = False
    #: whether the format's rows carry text (turned into tokens by ``--tokenizer``, :mod:`dynlab.traces.text`)
    reads_text: ClassVar[bool] = False
    #: the ``--tokenizer`` path (``None``: the approximation); set by the reader after construction
    tokenizer: Optional[str] = None
    #: whether the format's rows record failed requests (BurstGPT's ``Response tokens`` 0): a ``whole_file`` format
    #: that skips them in :meth:`read_all` and counts them in :attr:`failed`, unless :attr:`keep_failed`
    #: (``--keep-failed``, set by the reader) asks for them, marked with the request attribute ``failed`` (True)
    records_failed: ClassVar[bool] = False
    keep_failed: bool = False
    #: the failed rows :meth:`read_all` read (skipped, or kept with ``keep_failed``)
    failed: int = 0
    #: the fields a streamed (JSON lines) format reads; the reader warns once, naming the line, when the
    #: first record holds others than these and :attr:`attributes` (a typo, or a field this format ignores);
    #: ``None``: not checked
    fields: ClassVar[Optional[frozenset]] = None
    #: the fields the format carries as request attributes (``Request.attrs``, read by strategies, recorders
    #: and policies, written by ``--requests-out``): any of the standard ones (:data:`ATTRIBUTES`: ``priority``
    #: an int; ``tenant``, ``user``, ``lora_name``, ``session_id``, ``class`` strings) and the format's own (a string, a
    #: finite number or a boolean). A streamed format's reader fills ``attrs`` from them after :meth:`parse`
    #: (unless ``parse`` set it), refusing a wrong type as ``FILE:LINE``; a ``null`` is an absent field; a
    #: ``whole_file`` format calls :meth:`attrs_of` on its rows itself. They are not "fields not used by dynlab".
    attributes: ClassVar[frozenset] = frozenset()

    def __init__(self, block: int = 16):
        self.block = block

    @classmethod
    @abstractmethod
    def detect(cls, record: Any) -> bool:
        """True when ``record`` (the first line, decoded) is in this format."""

    @abstractmethod
    def parse(self, record: Any, index: int) -> Request:
        """The request for ``record``; ``index`` is its position among the trace's requests."""

    @classmethod
    def detect_text(cls, line: str) -> bool:
        """True when ``line`` (the file's first non-blank line, as text) starts a file of this format that
        is not JSON lines (a CSV header, the ``[`` of a JSON array). Only ``whole_file`` formats say yes."""
        return False

    @classmethod
    def header_mismatch(cls, line: str) -> Optional[str]:
        """What ``line`` (a first line that is not JSON) lacks to be this format's header, when it looks like one of
        its kind (a CSV format: its missing columns, ``"A, B"``); ``None`` when it does not look like one. The reader
        names it instead of "not JSON" (for the ``--trace-format`` given, else for every format that answers)."""
        return None

    def read_all(self, first: tuple, lines: Iterator[tuple], name: str) -> list:
        """``whole_file`` formats: every request of the file, in time order (``index`` from 0).

        ``first``: ``(line number, record)`` of the first non-blank line (the decoded JSON object, or the
        line's text when :meth:`detect_text` chose the format); ``lines``: the remaining ``(line number,
        text)``. Raise :class:`dynlab.errors.InputError` (``FILE:LINE``) for a bad row. Fields the format
        does not use go in :attr:`unused` (the reader warns once, naming them).
        """
        raise NotImplementedError(f"trace format {self.name!r} reads line by line")

    #: field names the file held that the format did not use (filled by :meth:`read_all`)
    unused: set = frozenset()

    def attrs_of(self, record: Mapping) -> Mapping[str, Any]:
        """The attributes of ``record`` (a decoded row): its fields named in :attr:`attributes`, in the row's
        order, checked (:func:`check_attribute`; ``null`` values left out), as a read-only mapping;
        ``NO_ATTRS`` (shared, empty) when it holds none. Raises ``ValueError`` for a wrong type."""
        names = self.attributes
        found = {k: check_attribute(k, v) for k, v in record.items() if k in names and v is not None}
        return MappingProxyType(found) if found else NO_ATTRS
