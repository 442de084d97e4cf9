"""Built-in trace formats, registered through the dynlab entry-point group: ``mooncake`` and ``tokens`` (JSON
lines, streamed), and the formats read whole (:mod:`dynlab_builtins.trace_files`: ``sharegpt``, ``aiperf``,
``aiperf-mooncake``; :mod:`dynlab_builtins.trace_csv`: ``burstgpt``, ``azure``)."""
from __future__ import annotations

import math

from dynlab import hookimpl
from dynlab.routing.strategy import Request, make_request
from dynlab.traces.format import ATTRIBUTES, TraceFormat

#: the request attributes (``Request.attrs``) the JSON lines formats carry: all the standard ones
_ATTRIBUTES = frozenset(ATTRIBUTES)


def _number(record: dict, key: str, required: bool = True, default=None):
    if key not in record:
        if required:
            raise ValueError(f"missing field {key!r}")
        return default
    v = record[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"field {key!r} must be a number, got {v!r}")
    if not math.isfinite(v):
        raise ValueError(f"field {key!r} must be a finite number, got {v!r}")
    if v < 0:
        raise ValueError(f"field {key!r} must not be negative, got {v!r}")
    return v


def _length(record: dict, key: str, minimum: int) -> int:
    """A token count: absent is 0 (unknown); present, an int (JSON's 1200.0 and true are not) >= ``minimum``."""
    if key not in record:
        return 0
    v = record[key]
    if type(v) is not int:
        raise ValueError(f"field {key!r} must be an integer, got {v!r}")
    if v < minimum:
        raise ValueError(f"field {key!r} must be >= {minimum}, got {v!r}")
    return v


_INT = {int}


def _int_list(record: dict, key: str) -> list:
    if key not in record:
        raise ValueError(f"missing field {key!r}")
    v = record[key]
    if not isinstance(v, list):
        raise ValueError(f"field {key!r} must be a list of ints")
    if v and set(map(type, v)) != {int}:
        for i, h in enumerate(v):
            if type(h) is not int:
                raise ValueError(f"{key}[{i}] must be an int, got {h!r}")
    return v


def _extra_keys(record: dict) -> tuple:
    """``(lora_name, cache_salt)`` of a record (vLLM's extra keys; ``None`` when absent or empty)."""
    lora, salt = record.get("lora_name"), record.get("cache_salt")
    for key, v in (("lora_name", lora), ("cache_salt", salt)):
        if v is not None and not isinstance(v, str):
            raise ValueError(f"field {key!r} must be a string, got {v!r}")
    return lora or None, salt or None


def _keyed_names(hashes: list, lora, salt) -> tuple:
    """A trace's own block names made distinct per (lora_name, cache_salt): names are already
    prefix-chained, so both keys go into every name (the salt, on block 0 only in vLLM, reaches
    every later block through the chain there)."""
    import hashlib

    tag = repr((lora, salt)).encode("utf-8")
    blake2b = hashlib.blake2b
    return tuple(int.from_bytes(blake2b(repr(h).encode() + b"|" + tag, digest_size=8).digest(), "big")
                 for h in hashes)


class MooncakeTrace(TraceFormat):
    """Mooncake JSONL: timestamp (ms), input_length, output_length, prefix-chained hash_ids of 512-token blocks.

    ``input_length`` and ``output_length`` are token counts: ints (``1200.0`` is refused), ``input_length``
    >= 1; ``output_length`` 0 or absent means unknown (the count-based replay does not use it; the timed
    engine generates one token, as every request does). Absent ``input_length`` is 0: not checked.
    A row is refused (``ValueError``, reported as ``FILE:LINE``) when its ``hash_ids`` are empty (a
    request with no prompt), name a block twice (a prefix chain names each block once) or, when it gives ``input_length``, when it does not hold
    ``ceil(input_length / block_tokens)`` ids (one per 512-token block, the last one partial). Every
    row of the bundled conversation trace (12031 rows) satisfies both rules.
    Rows may carry the request attributes ``priority`` (an int), ``tenant``, ``user``, ``lora_name``,
    ``session_id`` (strings) (``Request.attrs``; a row with ``session_id`` is detected as ``aiperf-mooncake``'s,
    which carries it too, unless ``--trace-format mooncake`` is given).
    """

    name = "mooncake"
    block_tokens = 512
    fields = frozenset(("timestamp", "input_length", "output_length", "hash_ids", "lora_name", "cache_salt"))
    attributes = _ATTRIBUTES

    @classmethod
    def detect(cls, record):
        # aiperf's rows with sessions or delays are aiperf-mooncake's (their timing is kept there)
        return isinstance(record, dict) and "hash_ids" in record and "session_id" not in record \
            and "delay" not in record

    def parse(self, record, index):
        hashes = record.get("hash_ids")
        # _int_list's checks, inlined on the common case (a list of ints): one call less per row
        if type(hashes) is not list or (hashes and set(map(type, hashes)) != _INT):
            hashes = _int_list(record, "hash_ids")
        n = len(hashes)
        if not n:
            raise ValueError("hash_ids is empty: a request needs a prompt (at least one block)")
        get = record.get
        inp, out, ts = get("input_length", 0), get("output_length", 0), get("timestamp")
        if type(inp) is not int or type(out) is not int or (ts is not None and type(ts) is not int and (
                type(ts) is not float or not math.isfinite(ts))) or inp < 1 or out < 0 or (ts is not None and ts < 0):
            inp = _length(record, "input_length", 1)
            out = _length(record, "output_length", 0)
            ts = _number(record, "timestamp", False, None)
        if len(set(hashes)) != n:
            first = {}
            for i, h in enumerate(hashes):
                if h in first:
                    raise ValueError(f"hash_ids[{i}] repeats hash_ids[{first[h]}] ({h}): "
                                     "a prefix chain names each block once")
                first[h] = i
        if "input_length" in record:
            need = math.ceil(inp / self.block_tokens)
            if n != need:
                raise ValueError(f"hash_ids holds {n} ids, but input_length {inp} needs ceil({inp}/"
                                 f"{self.block_tokens}) = {need} (one per {self.block_tokens}-token block)")
        if "lora_name" in record or "cache_salt" in record:  # rows may carry vLLM's extra keys
            lora, salt = _extra_keys(record)
            if lora is not None or salt is not None:
                return Request(_keyed_names(hashes, lora, salt), inp, out, ts, index)
        return make_request(tuple(hashes), inp, out, ts, index)  # Request(...), faster: the replay's hot path


class TokenTrace(TraceFormat):
    """Token JSONL: {"tokens": [ints]} per line (optional timestamp, output_length, lora_name, cache_salt), hashed at --block.

    A row whose ``tokens`` list is empty (a request with no prompt) is refused (``ValueError``, ``FILE:LINE``),
    as is an ``output_length`` that is not an int >= 0 (0 or absent: unknown, as in Mooncake rows).
    A row may give its reply's token ids, ``output_tokens`` (a list of ints; ``output_length`` may then be
    left out, and when given must equal its length): the reply's full blocks are then named by the
    prompt's chain (:func:`dynlab.traces.replies.reply_names`), so a later prompt quoting the reply hits them.
    Rows may carry the request attributes ``priority`` (an int), ``tenant``, ``user``, ``lora_name``,
    ``session_id`` (strings) (``Request.attrs``).
    """

    name = "tokens"
    hashes_tokens = True
    fields = frozenset(("tokens", "timestamp", "output_length", "output_tokens", "lora_name", "cache_salt"))
    attributes = _ATTRIBUTES

    @classmethod
    def detect(cls, record):
        return isinstance(record, dict) and "tokens" in record

    def parse(self, record, index):
        from dynlab.traces.replies import check_output_tokens, request_names

        tokens = record.get("tokens")
        if "tokens" not in record:
            raise ValueError("missing field 'tokens'")
        if not isinstance(tokens, list):
            raise ValueError("field 'tokens' must be a list of ints")
        if not tokens:
            raise ValueError("field 'tokens' is empty: a request needs a prompt (at least one token)")
        lora, salt = _extra_keys(record)
        out_len = _length(record, "output_length", 0)
        reply, n = check_output_tokens(record, self.hash_scheme) if "output_tokens" in record else (None, None)
        ts = _number(record, "timestamp", False, None)
        hashes, replied = request_names(tokens, reply, self.block, scheme=self.hash_scheme, lora_name=lora,
                                        cache_salt=salt, lookahead=self.hash_lookahead)
        return Request(hashes, input_length=len(tokens), output_length=out_len if n is None else n,
                       timestamp=ts, index=index, output_hashes=replied)


@hookimpl
def dynlab_register_trace_formats(register):
    from dynlab_builtins.trace_csv import AzureTrace, BurstGPTTrace
    from dynlab_builtins.trace_files import AiperfMooncakeTrace, AiperfTrace, ShareGPTTrace

    for cls in (MooncakeTrace, TokenTrace, ShareGPTTrace, AiperfTrace, AiperfMooncakeTrace, BurstGPTTrace,
                AzureTrace):
        register(cls)
