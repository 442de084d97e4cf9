"""The traces of the vLLM differential harness (:mod:`benchmarks.fidelity_vllm`), as dynlab token traces.

A :class:`Case` is a trace (rows of the token trace format of docs/commands.md, "Traces": ``timestamp`` in
ms, ``tokens``, ``output_length``) with the engine it runs on
(:class:`vllm_dynlab_side.EngineSetup`). :func:`hand_cases` gives eleven hand-sized ones (issue 24's
three rules among them), :func:`random_cases` seven seeded multi-turn conversation traces over shared
system prompts (200-2,000 requests; ample, tight and overloaded pools; chunked prefill; a
``max_num_seqs`` limit) and two of them again with their replies' ids (``output_tokens``). Prompt token
ids stay below :data:`OUTPUT_BASE`; the fake model of :mod:`vllm_side` samples a row's
``output_tokens`` when it gives them, else ids from :data:`OUTPUT_BASE` up, so a generated token never
equals a prompt token unless the trace says so (a next turn quoting the reply whose ids it gives).
Every request fits its pool: ``input + output - 1 <= capacity * block / 2``, so neither side rejects one.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from vllm_dynlab_side import EngineSetup

#: prompt token ids are below it; the fake model's sampled ids start there
OUTPUT_BASE = 1_000_000


@dataclass
class Case:
    """One trace: ``rows`` (dicts with ``timestamp`` ms, ``tokens``, ``output_length``) on ``setup``."""

    name: str
    setup: EngineSetup
    rows: list = field(default_factory=list)
    what: str = ""

    def write(self, path: str) -> None:
        """Write the rows as a dynlab token trace (JSON lines) to ``path``."""
        with open(path, "w") as fh:
            for row in self.rows:
                fh.write(json.dumps(row) + "\n")


class _Ids:
    """Fresh prompt token ids, never repeated: ``take(n)`` -> ``n`` new ids (ints below OUTPUT_BASE)."""

    def __init__(self, start: int = 1):
        self.next = start

    def take(self, n: int) -> list:
        out = list(range(self.next, self.next + n))
        self.next += n
        if self.next >= OUTPUT_BASE:
            raise ValueError("the trace needs more prompt token ids than OUTPUT_BASE leaves")
        return out


def _row(t: float, tokens: list, out: int) -> dict:
    return {"timestamp": t, "tokens": tokens, "output_length": out}


HAND = dict(beta0=10.0, beta1=1.0, beta2=2.0)  # issue 24's hand cases: integer ms, exact in floats


def _hand(capacity: int, budget: int, max_num_seqs: int = 256) -> EngineSetup:
    """A hand case's engine; vLLM refuses ``max_num_seqs > max_num_batched_tokens``, so it is capped there."""
    return EngineSetup(capacity, budget, min(max_num_seqs, budget), **HAND)


def hand_cases() -> list[Case]:
    """The eleven hand-sized cases (linear model beta0=10, beta1=1, beta2=2 ms; 16-token blocks)."""
    ids = _Ids()
    r1, r2 = ids.take(32), ids.take(64)
    a, b = ids.take(16), ids.take(16)
    p0, p1, p2 = ids.take(48), ids.take(24), ids.take(16)
    dup, big, tail = ids.take(32), ids.take(64), ids.take(16)
    shared = ids.take(48)
    ask, said, more = ids.take(32), ids.take(32), ids.take(16)
    cases = [
        Case("rule1-full-isl", _hand(5, 32),
             [_row(0, r1, 40), _row(0, r2, 1)],
             "issue 24 rule 1: R1 32+40, R2 64+1 at 0, capacity 5, budget 32"),
        Case("rule3-resume", _hand(5, 16),
             [_row(0, a, 45), _row(0, b, 20)],
             "issue 24 rule 3: A 16+45, B 16+20 at 0, capacity 5, budget 16"),
        Case("rule2-free-order", _hand(5, 64),
             [_row(0, p0, 1), _row(100, p1, 1), _row(200, p2, 1), _row(300, p0 + ids.take(16), 1)],
             "issue 24 rule 2: a partial block freed to the head keeps a cached block one allocation longer"),
        Case("duplicate-copies", _hand(6, 64),
             [_row(0, dup, 1), _row(0, dup, 1), _row(100, big, 1), _row(200, dup + tail, 1)],
             "two identical prompts together; a later request hits after the first copy is evicted"),
        Case("shared-prefix-ample", _hand(64, 8192),
             [_row(0, shared + ids.take(10), 8), _row(30, shared + ids.take(20), 5),
              _row(45, shared + ids.take(3), 12)],
             "three prompts sharing 48 tokens, no memory pressure"),
        Case("chunked-prefill", _hand(32, 24),
             [_row(0, ids.take(20), 30), _row(15, ids.take(100), 5), _row(40, ids.take(7), 4)],
             "a 100-token prompt chunked at a 24-token budget beside decodes"),
        Case("max-num-seqs", _hand(32, 8192, 2),
             [_row(0, ids.take(20), 5), _row(0, ids.take(20), 10), _row(0, ids.take(20), 3),
              _row(0, ids.take(20), 8)],
             "four requests at 0, two sequence slots"),
        Case("step-boundary-arrivals", _hand(16, 8192),
             [_row(0, ids.take(16), 3), _row(26, ids.take(16), 3), _row(27, ids.take(5), 2),
              _row(62, ids.take(9), 2)],
             "arrivals exactly at a step's end (they join the next step) and inside a step"),
        Case("overload-cascade", _hand(8, 32),
             [_row(0, ids.take(30), 20) for _ in range(5)],
             "five 30+20 requests at 0 in 8 blocks: chains of preemptions"),
        Case("reply-next-turn", _hand(16, 8192),
             [dict(_row(0, ask, 32), output_tokens=said), _row(1000, ask + said + more, 4)],
             "issue 24 item 2: turn 2 quotes turn 1's 32-token reply (output_tokens): it hits 3 blocks"),
    ]
    p = ids.take(32)  # taken last: the cases above keep their ids
    cases.append(Case("duplicate-outlives", _hand(6, 64),
                      [_row(0, p, 1), _row(0, p, 4), _row(0, ids.take(16), 2), _row(200, ids.take(64), 1),
                       _row(300, p + ids.take(16), 1)],
                      "issue 24 item 3: the original copy is evicted first, the duplicate keeps the name"))
    return cases


def priority_cases(scale: float = 1.0) -> list[Case]:
    """The cases of vLLM's ``policy="priority"`` (dynlab's ``--queue-policy priority``; issue 42): four hand
    cases (lower ``priority`` first) and three seeded conversation traces whose rows carry a priority 0-2."""
    ids = _Ids(600_000)  # (apart from the other cases' ids: a case's own pool is fresh anyway)
    prio = dict(queue_policy="priority")
    cases = [
        Case("priority-max-seqs", EngineSetup(64, 256, 1, **HAND, **prio),
             [_prio(_row(0, ids.take(16), 10), 1), _prio(_row(30, ids.take(16), 2), 0)],
             "vllm #40004: L (priority 1) runs, H (0) arrives at 30 and waits at max_num_seqs 1 (TTFT 130)"),
        Case("priority-kv-full", EngineSetup(3, 256, 256, **HAND, **prio),
             [_prio(_row(0, ids.take(16), 20), 1), _prio(_row(1, ids.take(16), 20), 0)],
             "3 blocks: the older but less important request is preempted, after its decode was scheduled"),
        Case("priority-self-preempt", EngineSetup(7, 256, 256, **HAND, **prio),
             [_prio(_row(0, ids.take(39), 8), 2), _prio(_row(20, ids.take(32), 11), 2),
              _prio(_row(20, ids.take(25), 25), 2)],
             "equal priorities: the first of two equal latest arrivals is its own victim; the loop goes on "
             "with the one after it"),
        Case("priority-async-stale", EngineSetup(7, 256, 4, **HAND, **prio),
             [_prio(_row(0, ids.take(31), 10), 1), _prio(_row(0, ids.take(38), 3), 2),
              _prio(_row(0, ids.take(12), 2), 1), _prio(_row(0, ids.take(13), 8), 0)],
             "async scheduling: a request preempted while its last step is in flight finishes in the waiting "
             "queue, which gives it up"),
    ]
    specs = [  # name, seed, requests, conversations/s, capacity, budget, max_num_seqs, what
        ("conv-priority-overloaded", 3, 1000, 3.0, 500, 8192, 256, "conv-overloaded, priorities 0-2"),
        ("conv-priority-max-seqs", 5, 500, 1.5, 2000, 8192, 4, "conv-max-seqs, priorities 0-2"),
        ("conv-priority-chunked", 7, 1000, 3.0, 400, 512, 32, "conv-overloaded-chunked, priorities 0-2"),
    ]
    for name, seed, n, rate, cap, budget, seqs, what in specs:
        rng = random.Random(seed * 7919)
        rows = [_prio(r, rng.randint(0, 2)) for r in _fit(conversations(seed, max(int(n * scale), 1), rate), cap)]
        cases.append(Case(name, EngineSetup(cap, budget, seqs, **prio), rows, what))
    return cases


def lora_cases(scale: float = 1.0) -> list[Case]:
    """The cases of vLLM's LoRA rule (``LoRAConfig.max_loras``; dynlab's ``--max-loras``; issue 42 item 4): two hand
    cases and three seeded conversation traces whose conversations each name one adapter (zipf over 8 or 16)."""
    ids = _Ids(800_000)
    lora = lambda row, name: {**row, "lora_name": name} if name else row  # noqa: E731
    cases = [
        Case("lora-third-waits", EngineSetup(64, 256, 256, **HAND, max_loras=2),
             [lora(_row(0, ids.take(16), 4), "a"), lora(_row(0, ids.take(16), 4), "b"),
              lora(_row(0, ids.take(16), 2), "c")],
             "max_loras 2: a and b run (TTFT 42), c is skipped until both finish at 84 (TTFT 110)"),
        Case("lora-skip-order", EngineSetup(64, 256, 256, **HAND, max_loras=1),
             [lora(_row(0, ids.take(16), 3), "a"), lora(_row(1, ids.take(16), 3), "b"),
              lora(_row(2, ids.take(16), 3), "a"), _row(3, ids.take(16), 3), lora(_row(4, ids.take(16), 2), "b"),
              lora(_row(5, ids.take(16), 2), "c")],
             "max_loras 1: skipped requests keep their places; a later request of a running adapter, or of none, "
             "goes on"),
    ]
    specs = [  # name, seed, requests, conversations/s, capacity, budget, max_num_seqs, max_loras, adapters
        ("conv-lora-2-of-8", 11, 500, 1.5, 2000, 8192, 256, 2, 8),
        ("conv-lora-4-of-16", 12, 1000, 3.0, 800, 8192, 256, 4, 16),
        ("conv-lora-chunked", 13, 1000, 3.0, 600, 512, 32, 2, 8),
    ]
    for name, seed, n, rate, cap, budget, seqs, k, count in specs:
        rows = _fit(conversations(seed, max(int(n * scale), 1), rate, adapters=count), cap)
        cases.append(Case(name, EngineSetup(cap, budget, seqs, max_loras=k), rows,
                          f"max_loras {k}, {count} adapters of zipf popularity, one per conversation"))
    return cases


def _prio(row: dict, priority: int) -> dict:
    row["priority"] = priority
    return row


def conversations(seed: int, requests: int, rate: float, systems: int = 4, system_len=(200, 1500),
                  user_len=(20, 300), reply_len=(10, 200), turns=(1, 6), think_ms=(500.0, 5000.0),
                  replies: bool = False, adapters: int = 0) -> list:
    """Seeded multi-turn conversations over ``systems`` shared system prompts: token-trace rows in time order.

    Conversations start as a Poisson process of ``rate`` per second; each has a uniform number of
    ``turns``; turn ``k``'s prompt is the system prompt, then every earlier user message and reply
    (fresh ids standing for the reply's text), then its own user message; its ``output_length`` is
    that reply's length. The next turn arrives ``think_ms`` (uniform) after the previous one was sent
    (not after its reply: an open loop, so a trace is fixed before any engine runs). Lengths in tokens,
    drawn uniformly from the ranges given; stops at ``requests`` rows. ``replies``: each row also gives the
    reply's ids as ``output_tokens`` (the ids the next turn quotes; vLLM's fake model samples them), so
    both sides name the reply's blocks by the prompt's chain and the next turn hits them; the rows are
    otherwise the same. ``adapters``: each conversation names one of that many LoRA adapters (``lora-k``, zipf:
    ``k`` weighs ``1/(k+1)``), drawn from an RNG of its own, in its rows' ``lora_name`` (0: none; the rows are
    otherwise the same).
    """
    rng = random.Random(seed)
    pick = random.Random(seed * 7919 + 1)
    weights = [1.0 / (k + 1) for k in range(adapters)]
    ids = _Ids()
    prompts = [ids.take(rng.randint(*system_len)) for _ in range(systems)]
    rows, t = [], 0.0
    while len(rows) < requests:
        t += rng.expovariate(rate) * 1000.0
        context, at = list(prompts[rng.randrange(systems)]), t
        adapter = f"lora-{pick.choices(range(adapters), weights)[0]}" if adapters else None
        for _ in range(rng.randint(*turns)):
            context += ids.take(rng.randint(*user_len))
            reply = rng.randint(*reply_len)
            rows.append(_row(round(at, 3), list(context), reply))
            if adapter:
                rows[-1]["lora_name"] = adapter
            said = ids.take(reply)
            if replies:
                rows[-1]["output_tokens"] = said
            context += said
            at += rng.uniform(*think_ms)
    rows.sort(key=lambda r: r["timestamp"])  # stable: same-time rows keep their order
    return rows[:requests]


def _fit(rows: list, capacity: int, block: int = 16) -> list:
    """``rows`` without those that would take more than half the pool (``input + output - 1`` tokens)."""
    return [r for r in rows if len(r["tokens"]) + r["output_length"] - 1 <= capacity * block // 2]


def random_cases(scale: float = 1.0) -> list[Case]:
    """The seven seeded conversation traces, and two of them again with their replies' ids
    (``output_tokens``); ``scale`` multiplies their request counts (tests use less)."""
    specs = [  # name, seed, requests, conversations/s, capacity, budget, max_num_seqs, what
        ("conv-ample", 1, 200, 0.5, 4096, 8192, 256, "ample pool: nothing is evicted"),
        ("conv-tight", 2, 500, 1.0, 800, 8192, 256, "tight pool: evictions, few preemptions"),
        ("conv-overloaded", 3, 1000, 3.0, 500, 8192, 256, "overloaded pool: preemptions"),
        ("conv-chunked", 4, 500, 1.0, 1200, 256, 256, "chunked prefill: 256-token budget"),
        ("conv-max-seqs", 5, 500, 1.5, 2000, 8192, 4, "max_num_seqs 4"),
        ("conv-tight-2000", 6, 2000, 1.0, 700, 2048, 64, "2,000 requests, tight pool, 2,048-token budget"),
        ("conv-overloaded-chunked", 7, 1000, 3.0, 400, 512, 32, "overloaded, 512-token budget, 32 seqs"),
    ]
    specs += [  # the same conversations, their replies' ids given (output_tokens): next turns hit the reply
        ("conv-replies-tight", 2, 500, 1.0, 800, 8192, 256, "conv-tight with output_tokens", True),
        ("conv-replies-overloaded", 3, 1000, 3.0, 500, 8192, 256, "conv-overloaded with output_tokens", True),
    ]
    cases = []
    for name, seed, n, rate, cap, budget, seqs, what, *replies in specs:
        n = max(int(n * scale), 1)
        rows = _fit(conversations(seed, n, rate, replies=bool(replies)), cap)
        cases.append(Case(name, EngineSetup(cap, budget, seqs), rows, what))
    return cases
