"""The CSV traces of token counts, read whole: BurstGPT (its sessions' turns share their earlier prompt and
answer) and the Azure LLM inference trace (registered by :mod:`dynlab_builtins.trace_formats`;
docs/workloads.md). Each request gets fresh block names at ``--block``; rows are sorted by arrival, as in
:mod:`dynlab_builtins.trace_files`, whose helpers these formats share.
"""
from __future__ import annotations

import calendar
import csv
import itertools
from datetime import datetime
from fractions import Fraction
from types import MappingProxyType

from dynlab.errors import InputError
from dynlab.routing.strategy import NO_ATTRS, Request
from dynlab.traces.format import TraceFormat

from dynlab_builtins.trace_files import _Fresh, _ms, _sorted


class _CsvFormat(TraceFormat):
    """CSV traces of token counts: fresh block names at ``--block``."""

    whole_file = True
    header: tuple = ()

    @classmethod
    def detect(cls, record):
        return False

    @classmethod
    def detect_text(cls, line):
        cols = [c.strip() for c in line.strip().split(",")]
        return all(h in cols for h in cls.header)

    @classmethod
    def header_mismatch(cls, line):
        """The columns of this format's header that ``line`` (a CSV header, not JSON) lacks, or ``None``."""
        if "," not in line or line.lstrip().startswith(("{", "[")):
            return None
        cols = [c.strip() for c in line.strip().split(",")]
        missing = [h for h in cls.header if h not in cols]
        return ", ".join(missing) if missing else None

    def parse(self, record, index):
        raise NotImplementedError

    def rows(self, first, lines, name):
        """``(line number, dict)`` of the CSV, the header checked; columns outside ``used`` go in ``unused``."""
        lineno0, head = first
        if not isinstance(head, str):  # the reader parsed the first line as JSON: not a CSV file
            raise InputError(name, lineno0, f"a JSON line, not the CSV header of a {self.name} trace")
        reader = csv.reader(itertools.chain([head], (line for _, line in lines)))
        cols = [c.strip() for c in next(reader)]
        missing = [h for h in self.header if h not in cols]
        if missing:
            raise InputError(name, lineno0, f"the header lacks column(s) {', '.join(missing)}")
        self.unused = {c for c in cols if c not in self.used and c}
        for values in reader:
            if not values or not any(v.strip() for v in values):
                continue
            lineno = lineno0 + reader.line_num - 1
            if len(values) != len(cols):
                raise InputError(name, lineno, f"{len(values)} values for {len(cols)} columns")
            yield lineno, dict(zip(cols, (v.strip() for v in values)))


def _int_cell(row: dict, col: str, minimum: int = 0) -> int:
    try:
        v = int(row[col])
    except ValueError:
        raise ValueError(f"{col} must be an integer, got {row[col]!r}") from None
    if v < minimum:
        raise ValueError(f"{col} must be >= {minimum}, got {v}")
    return v


class BurstGPTTrace(_CsvFormat):
    """BurstGPT CSV: Timestamp (s), Request tokens, Response tokens (Session ID turns share their history)."""

    name = "burstgpt"
    header = ("Timestamp", "Request tokens", "Response tokens")
    used = header + ("Session ID",)
    attributes = frozenset(("session_id",))  # from the ``Session ID`` column
    #: a row with ``Response tokens`` 0 is a request that failed (vLLM's BurstGPT loader drops them, PR #13063)
    records_failed = True

    def read_all(self, first, lines, name):
        fresh, sessions, out = _Fresh(), {}, []
        self.failed = 0
        for lineno, row in self.rows(first, lines, name):
            try:
                try:
                    t = float(row["Timestamp"]) * 1000.0
                except ValueError:
                    raise ValueError(f"Timestamp must be a number of seconds, got {row['Timestamp']!r}") from None
                _ms(t, "Timestamp")
                inp = _int_cell(row, "Request tokens", 1)
                outp = _int_cell(row, "Response tokens")
            except ValueError as exc:
                raise InputError(name, lineno, str(exc)) from None
            if outp == 0:  # failed: skipped, or kept (--keep-failed) as a prompt without an answer
                self.failed += 1
                if not self.keep_failed:
                    continue
            out.append((t, inp, outp, row.get("Session ID") or None))
        out.sort(key=lambda r: r[0])
        made = []
        for t, inp, outp, sid in out:
            n = inp // self.block
            context = sessions.get(sid, []) if sid is not None else []
            names = context[:n] + fresh.take(max(0, n - len(context)))
            if sid is not None:  # the session's context: this prompt and its answer, in whole blocks
                sessions[sid] = names + fresh.take(max(0, (inp + outp) // self.block - n))
            attrs = {} if sid is None else {"session_id": sid}
            if outp == 0:
                attrs["failed"] = True
            made.append((t, Request(tuple(names), inp, outp, t, 0, attrs=MappingProxyType(attrs) if attrs else NO_ATTRS)))
        return _sorted(made)


class AzureTrace(_CsvFormat):
    """Azure LLM inference trace CSV (AzurePublicDataset): TIMESTAMP (date and time), ContextTokens, GeneratedTokens."""

    name = "azure"
    header = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    used = header

    def read_all(self, first, lines, name):
        fresh, out = _Fresh(), []
        for lineno, row in self.rows(first, lines, name):
            try:
                t = _azure_time(row["TIMESTAMP"])
                inp = _int_cell(row, "ContextTokens", 1)
                outp = _int_cell(row, "GeneratedTokens")
            except ValueError as exc:
                raise InputError(name, lineno, str(exc)) from None
            out.append((t, inp, outp))
        out.sort(key=lambda r: r[0])
        t0 = out[0][0] if out else (0, 0)
        # whole seconds subtracted before the fractions are added, exactly (Fraction): 1 ms reads 1.0
        return _sorted([(float(((s - t0[0]) + (f - t0[1])) * 1000),
                         Request(tuple(fresh.take(inp // self.block)), inp, outp, 0, 0))
                        for (s, f), inp, outp in out])


def _azure_time(text: str) -> tuple:
    """``(whole seconds since the epoch, the fraction as a Fraction)`` of ``2023-11-16 18:15:46.6805900`` (the
    fraction has up to 7 digits), kept apart so that an offset is exact: at the epoch's 1.7e9 s a float resolves
    only 0.24 us, which read a 1 ms offset as 1.0001659."""
    whole, _, frac = text.strip().partition(".")
    try:
        base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
        if frac and not frac.isdigit():
            raise ValueError
        return calendar.timegm(base.timetuple()), Fraction(int(frac), 10 ** len(frac)) if frac else Fraction(0)
    except ValueError:
        raise ValueError(f"TIMESTAMP must be a date and time like 2023-11-16 18:15:46.6805900, got {text!r}") from None
