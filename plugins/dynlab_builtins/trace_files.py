"""Trace formats people have, read whole: ShareGPT JSON, aiperf input files, and (in
:mod:`dynlab_builtins.trace_csv`) BurstGPT CSV and the Azure LLM inference trace CSV (registered by
:mod:`dynlab_builtins.trace_formats`; docs/workloads.md).

Text (ShareGPT, aiperf) becomes tokens through ``--tokenizer`` or dynlab's approximation
(:mod:`dynlab.traces.text`) and is hashed at ``--block``. The CSV traces give token counts only: each
request gets fresh block names (``input_length // block`` full blocks, no prefix shared), except the
turns of a BurstGPT session (``Session ID``, carried as the request attribute ``session_id``), which share
their session's earlier prompt and answer
(the turn's leading ``min(input, previous input + previous output)`` tokens, in whole blocks). Rows
are sorted by arrival (stable); a trace whose first arrival is not at 0 keeps its times as given.
"""
from __future__ import annotations

import itertools
import json
import math
from typing import Optional

from dynlab.errors import InputError
from dynlab.routing.strategy import Request
from dynlab.slots import quick_replacer
from dynlab.traces.format import TraceFormat
from dynlab.traces.replies import request_names

#: fresh block names start here (above any hash of a small trace's own ids)
_FRESH = 1 << 48


def json_rows(first: tuple, lines, name: str):
    """``(line number, object)`` of a JSON-lines file: ``first`` already decoded, then each non-blank line."""
    yield first
    for lineno, line in lines:
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(name, lineno, f"not JSON: {exc.msg}") from None
        except RecursionError:
            raise InputError(name, lineno, "not JSON a request can be: nested too deeply") from None


def json_array(first: tuple, lines, name: str):
    """``(line number, element)`` of a file holding one JSON array (ShareGPT's layout), each element
    decoded in turn so its line is known."""
    lineno0, head = first
    text = head + "".join(line for _, line in lines)
    dec = json.JSONDecoder()
    pos = text.index("[") + 1
    line_at = lambda p: lineno0 + text.count("\n", 0, p)  # noqa: E731
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            raise InputError(name, line_at(pos), "not JSON: the array is not closed (expected ']')")
        if text[pos] == "]":
            return
        try:
            value, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise InputError(name, line_at(exc.pos), f"not JSON: {exc.msg}") from None
        except RecursionError:
            raise InputError(name, line_at(pos), "not JSON a request can be: nested too deeply") from None
        yield line_at(pos), value
        pos = end


def _count(v, what: str, minimum: int = 0) -> int:
    if type(v) is not int or v < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {v!r}")
    return v


def _ms(v, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{what} must be a finite number of ms >= 0, got {v!r}")
    return v


#: ``dataclasses.replace(request, timestamp=, index=)``, faster
_placed = quick_replacer(Request, ("timestamp", "index"))
#: ``dataclasses.replace(request, attrs=)``, faster
_with_attrs = quick_replacer(Request, ("attrs",))


def _sorted(rows: list) -> list:
    """``(time or None, Request)`` -> requests in time order (stable), ``index`` renumbered (every other
    field, ``attrs`` among them, kept)."""
    if rows and rows[0][0] is not None:
        rows = sorted(rows, key=lambda r: r[0])
    return [_placed(r, t, i) for i, (t, r) in enumerate(rows)]


class _Fresh:
    """Fresh block names, never repeated within a trace."""

    def __init__(self):
        self.next = itertools.count(_FRESH)

    def take(self, n: int) -> list:
        return [next(self.next) for _ in range(n)]


class _TextFormat(TraceFormat):
    """Formats of text: tokens from ``--tokenizer`` or the approximation, hashed at ``--block``."""

    whole_file = True
    reads_text = True
    hashes_tokens = True

    def parse(self, record, index):  # whole-file formats read in read_all
        raise NotImplementedError

    def _setup(self):
        from dynlab.traces.text import tokenizer_for

        self.encode = tokenizer_for(self.tokenizer).encode
        self.unused = set()
        # answer tokens of unknown text: ids no tokenizer gives (--hash dynamo's tokens are u32: from its top down)
        self.fresh = itertools.count(2**32 - 1, -1) if self.hash_scheme == "dynamo" else itertools.count(1 << 62)

    def request(self, tokens: list, out: int, t, reply: Optional[list] = None) -> tuple:
        """``(t, Request)`` of the prompt ``tokens`` (ids) generating ``out`` tokens; ``reply``: the reply's
        token ids when known (``len(reply) == out``), its full blocks named by the prompt's chain
        (:func:`dynlab.traces.replies.reply_names`), so a later turn quoting them hits them."""
        if not tokens:
            raise ValueError("the prompt is empty: a request needs at least one token")
        names, replied = request_names(tokens, reply, self.block, scheme=self.hash_scheme,
                                       lookahead=self.hash_lookahead)
        return t, Request(names, len(tokens), out, t, 0, output_hashes=replied)


def _text(v, what: str) -> str:
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return "\n".join(v)
    if not isinstance(v, str):
        raise ValueError(f"{what} must be text, got {v!r}")
    return v


class ShareGPTTrace(_TextFormat):
    """ShareGPT JSON: an array of {"conversations": [{"from": "human"|"gpt", "value": text}]}; each human turn is a request."""

    name = "sharegpt"
    _ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
              "bing": "assistant", "assistant": "assistant", "system": "system"}

    @classmethod
    def detect(cls, record):
        return isinstance(record, dict) and isinstance(record.get("conversations"), list)

    @classmethod
    def detect_text(cls, line):
        return line.lstrip().startswith("[")

    def read_all(self, first, lines, name):
        self._setup()
        rows_in = json_array(first, lines, name) if isinstance(first[1], str) else json_rows(first, lines, name)
        out = []
        for lineno, conv in rows_in:
            try:
                out.extend(self._conversation(conv))
            except ValueError as exc:
                raise InputError(name, lineno, str(exc)) from None
        return _sorted(out)

    def _conversation(self, conv) -> list:
        if not isinstance(conv, dict) or not isinstance(conv.get("conversations"), list):
            raise ValueError("expected a conversation: an object with a 'conversations' list")
        self.unused.update(k for k in conv if k not in ("conversations", "id"))  # id: ShareGPT's own, ignored
        turns, history, rows = conv["conversations"], "", []
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict) or "value" not in turn:
                raise ValueError(f"conversations[{i}] must be an object with 'from' and 'value'")
            self.unused.update(k for k in turn if k not in ("from", "value"))
            role = self._ROLES.get(str(turn.get("from", "")).lower())
            if role is None:
                raise ValueError(f"conversations[{i}]: unknown 'from' {turn.get('from')!r} (human, gpt, system)")
            text = _text(turn["value"], f"conversations[{i}].value")
            history = history + ("\n" if history else "") + text
            if role == "user":
                rows.append(self._turn(history, turns[i + 1] if i + 1 < len(turns) else None, i + 1))
        return rows

    def _turn(self, history: str, reply, at: int) -> tuple:
        """The request of a human turn whose conversation so far is ``history``, answered by ``reply`` (the
        next turn, ``conversations[at]``, when it is the assistant's): the reply's tokens are those the text
        ``history + "\\n" + reply`` holds past the prompt's, as the next turn's prompt holds them."""
        prompt = self.encode(history)
        if not isinstance(reply, dict) or self._ROLES.get(str(reply.get("from", "")).lower()) != "assistant":
            return self.request(prompt, 0, None)
        text = _text(reply.get("value", ""), f"conversations[{at}].value")
        answer = self.encode(history + "\n" + text)[len(prompt):] if text else []
        return self.request(prompt, len(answer), None, answer)


class AiperfTrace(_TextFormat):
    """aiperf input files: single_turn {"text", ...} and multi_turn {"session_id", "turns": [...]} rows; timestamp and delay (ms) kept."""

    name = "aiperf"
    attributes = frozenset(("session_id",))  # a multi_turn row's, carried by each of its turns
    _TURN_KEYS = ("text", "texts", "output_length", "timestamp", "delay", "role")

    @classmethod
    def detect(cls, record):
        return isinstance(record, dict) and ("text" in record or "texts" in record or
                                             isinstance(record.get("turns"), list))

    def read_all(self, first, lines, name):
        self._setup()
        out, clock, timed = [], 0.0, False
        for lineno, row in json_rows(first, lines, name):
            try:
                if not isinstance(row, dict):
                    raise ValueError("expected a JSON object")
                turns = row.get("turns") if "turns" in row else [row]
                if not isinstance(turns, list) or not turns:
                    raise ValueError("'turns' must be a non-empty list of turns")
                self.unused.update(k for k in row if k not in self._TURN_KEYS + ("session_id", "turns"))
                made, clock, stamped = self._session(turns, clock, "turns" in row)
                attrs = self.attrs_of(row)
                if attrs:
                    made = [(t, _with_attrs(r, attrs)) for t, r in made]
                timed = timed or stamped
                out.extend(made)
            except ValueError as exc:
                raise InputError(name, lineno, str(exc)) from None
        if not timed:
            out = [(None, r) for _, r in out]
        return _sorted(out)

    def _session(self, turns: list, clock: float, session: bool = True) -> tuple:
        """A session's requests ``(time, Request)``: turn k's prompt is the earlier turns and answers and its
        text. A turn arrives at its ``timestamp``, else ``delay`` ms after the previous turn (the previous
        row's, for a session's first turn; open loop: after its arrival, not its answer).

        aiperf's file holds no answer text (aiperf sends each turn with the answers the server gave): an answer
        is ``output_length`` placeholder ids no tokenizer gives, in the history and, for the turns of a
        ``session`` (a ``turns`` row), as the turn's reply tokens, so the next turn hits its blocks."""
        system, rows, history, stamped = [], [], [], False
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise ValueError(f"turns[{i}] must be an object")
            self.unused.update(k for k in turn if k not in self._TURN_KEYS)
            text = _text(turn.get("text", turn.get("texts", "")), f"turns[{i}].text")
            if i == 0 and turn.get("role") == "system" and not ({"timestamp", "delay", "output_length"} & set(turn)):
                system = self.encode(text)  # aiperf hoists a leading system turn onto every turn
                history = list(system)
                continue
            if "timestamp" in turn:
                clock, stamped = _ms(turn["timestamp"], "timestamp"), True
            elif "delay" in turn:
                clock, stamped = clock + _ms(turn["delay"], "delay"), True
            out = _count(turn.get("output_length", 0), "output_length")
            prompt = history + self.encode(text)
            answer = [next(self.fresh) for _ in range(out)]
            rows.append(self.request(prompt, out, clock, answer if session else None))
            history = prompt + answer  # the answer joins the history
        return rows, clock, stamped


class AiperfMooncakeTrace(TraceFormat):
    """aiperf's mooncake_trace JSONL with sessions: hash_ids of 512-token blocks, session_id, timestamp or delay (ms)."""

    name = "aiperf-mooncake"
    block_tokens = 512
    whole_file = True
    attributes = frozenset(("session_id", "priority", "tenant", "user"))
    _KEYS = ("session_id", "timestamp", "delay", "input_length", "output_length", "hash_ids")

    @classmethod
    def detect(cls, record):
        return isinstance(record, dict) and ("session_id" in record or "delay" in record) and (
            "hash_ids" in record or "input_length" in record)

    def parse(self, record, index):
        raise NotImplementedError

    def read_all(self, first, lines, name):
        self.unused, fresh = set(), _Fresh()
        out, last, sessions, timed = [], 0.0, {}, False
        for lineno, row in json_rows(first, lines, name):
            try:
                if not isinstance(row, dict):
                    raise ValueError("expected a JSON object")
                self.unused.update(k for k in row if k not in self._KEYS and k not in self.attributes)
                inp = _count(row.get("input_length", 0), "input_length")
                hashes = row.get("hash_ids")
                if hashes is None:
                    if inp < 1:
                        raise ValueError("a row needs hash_ids or an input_length >= 1 (a request needs a prompt)")
                    hashes = fresh.take(math.ceil(inp / self.block_tokens))
                elif not isinstance(hashes, list) or not hashes or any(type(h) is not int for h in hashes):
                    raise ValueError("hash_ids must be a non-empty list of ints")
                sid = row.get("session_id")
                if "timestamp" in row:
                    t, timed = _ms(row["timestamp"], "timestamp"), True
                else:  # delay after the session's previous turn (the previous row's without a session)
                    t = sessions.get(sid, last) + _ms(row.get("delay", 0), "delay")
                    timed = timed or "delay" in row
                sessions[sid], last = t, t
                out.append((t, Request(tuple(hashes), inp or len(hashes) * self.block_tokens,
                                       _count(row.get("output_length", 0), "output_length"), t, 0,
                                       attrs=self.attrs_of(row))))
            except ValueError as exc:
                raise InputError(name, lineno, str(exc)) from None
        if not timed:
            out = [(None, r) for _, r in out]
        return _sorted(out)
