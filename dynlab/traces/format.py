"""The trace-format interface: :class:`TraceFormat`, what a trace-format plugin implements.

It stands apart from the readers (:mod:`dynlab.traces.reader`), which look formats up in the
plugin registry, so that the registry can name this base class without importing the readers.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Optional

from dynlab.routing.strategy import Request


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

    def __init__(self, block: int = 16):
        self.block = block

    @classmethod
    @abstractmethod
    def detect(cls, record: Any) -> bool:
        """True when ``record`` (the first line, decoded) is in this format."""

    @abstractmethod
    def parse(self, record: Any, index: int) -> Request:
        """The request for ``record``; ``index`` is its position among the trace's requests."""
