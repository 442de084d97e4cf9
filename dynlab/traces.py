"""Trace formats (placeholder until the trace readers land)."""
from __future__ import annotations

from abc import ABC


class TraceFormat(ABC):
    """Base class of trace readers."""

    name = ""
