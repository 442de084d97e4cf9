"""A sweep's results: the resumable JSON-lines results file, flattened metrics, CSV and metric paths."""
from __future__ import annotations

import csv
import io
import json
import os
from collections import OrderedDict
from typing import Any, Iterable, Mapping, Optional

from dynlab.errors import DynlabError
from dynlab.sweep.grid import cell_key


def record_line(cell: Mapping[str, Any], result: Mapping[str, Any]) -> str:
    """One results-file line (without the newline): ``{"cell": {...}, "result": {...}}``.

    ``json.dumps`` with default separators, so the ``result`` part is byte for byte what
    ``dynlab sim`` prints.
    """
    return json.dumps({"cell": cell, "result": result})


class ResultsFile:
    """A sweep's JSON-lines results file, one :func:`record_line` per finished cell.

    :meth:`open` takes an exclusive lock (a second sweep on the same file fails),
    reads the records already there, drops an incomplete last line (a sweep killed in
    the middle of a write), and positions for appending; :meth:`append` writes one
    line and flushes it, so an interrupted sweep loses only the cells in flight.
    """

    def __init__(self, path: str):
        self.path = path
        self.records: "OrderedDict[str, tuple[dict, dict]]" = OrderedDict()
        self.dropped_partial = False
        self._fh = None
        self._fh_truncate: Optional[int] = None

    def open(self) -> "ResultsFile":
        """Lock, read and prepare the file for appending (created if absent). Returns ``self``."""
        fh = open(self.path, "a+b")
        try:
            try:
                import fcntl

                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except ImportError:  # not POSIX: no lock
                pass
            except OSError:
                raise DynlabError(f"{self.path} is in use by another sweep") from None
            fh.seek(0)
            data = fh.read()
            self._parse(data)
        except BaseException:
            fh.close()
            raise
        self._fh = fh
        return self

    def _parse(self, data: bytes) -> None:
        end = data.rfind(b"\n") + 1
        if end < len(data):  # a line without its newline: a write was cut short
            self.dropped_partial = True
            self._fh_truncate = end
        else:
            self._fh_truncate = None
        for lineno, raw in enumerate(data[:end].splitlines(), 1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
                cell, result = record["cell"], record["result"]
                if not isinstance(cell, dict) or not isinstance(result, dict):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                raise DynlabError(f"{self.path}:{lineno}: not a sweep record "
                                  '({"cell": {...}, "result": {...}})') from None
            self.records.setdefault(cell_key(cell), (cell, result))

    def scan(self) -> "ResultsFile":
        """Read the records without locking, creating or changing the file (for ``--dry-run``)."""
        if os.path.exists(self.path):
            with open(self.path, "rb") as fh:
                self._parse(fh.read())
        return self

    def done(self) -> set[str]:
        """The keys (:func:`cell_key`) of the cells already in the file."""
        return set(self.records)

    def append(self, cell: Mapping[str, Any], result: Mapping[str, Any]) -> None:
        """Append one record and flush it; a cell already in the file is not written again."""
        key = cell_key(cell)
        if key in self.records:
            return
        if self._fh_truncate is not None:
            self._fh.truncate(self._fh_truncate)
            self._fh_truncate = None
        self._fh.write((record_line(cell, result) + "\n").encode("utf-8"))
        self._fh.flush()
        self.records[key] = (dict(cell), dict(result))

    def close(self) -> None:
        """Release the lock and close the file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()


def flatten(result: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts to dotted keys (``ttft_ms.p99``); lists kept as values."""
    out: dict[str, Any] = {}
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (bool, list, dict)):
        return json.dumps(value)
    return str(value)


def to_csv(records: Iterable[tuple[Mapping, Mapping]]) -> str:
    """CSV text: one row per ``(cell, result)``, the cell's options then the flattened metrics.

    Columns are the union over all rows in first-seen order; a metric named like an
    option (``mode``, ``workers``, ``publish``) repeats its value and is left out.
    Missing and null values are empty; lists and booleans are written as JSON.
    """
    records = list(records)
    cell_cols: dict[str, None] = {}
    metric_cols: dict[str, None] = {}
    rows = []
    for cell, result in records:
        flat = flatten(result)
        cell_cols.update(dict.fromkeys(cell))
        rows.append((cell, flat))
    for _, flat in rows:
        metric_cols.update(dict.fromkeys(k for k in flat if k not in cell_cols))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(list(cell_cols) + list(metric_cols))
    for cell, flat in rows:
        writer.writerow([_csv_value(cell.get(c)) for c in cell_cols] + [_csv_value(flat.get(c)) for c in metric_cols])
    return buf.getvalue()


def metric_value(result: Mapping[str, Any], path: str) -> Optional[float]:
    """The number at dotted ``path`` in ``result`` (``ttft_ms.p99``), or ``None`` when absent or not a number."""
    value: Any = result
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def numeric_paths(results: Iterable[Mapping[str, Any]]) -> list[str]:
    """Dotted paths that hold a number in at least one result, in first-seen order."""
    seen: dict[str, None] = {}
    for r in results:
        for k, v in flatten(r).items():
            if not isinstance(v, bool) and isinstance(v, (int, float)):
                seen.setdefault(k, None)
    return list(seen)
