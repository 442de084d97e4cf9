"""How much one command may ask of the machine: every size limit, in one place, with its reasoning.

A size option that allocates per unit (workers, requests, blocks, tokens, document reads, grid
cells) is checked here before anything is allocated; a run over a limit is refused with one line
naming the option, the limit and the memory per unit (the CLI shows it as a usage error, exit 2).

The reasoning, the same for every limit::

    limit = BUDGET_BYTES / bytes per unit, rounded down to one significant digit

- :data:`MACHINE_BYTES`: the machine dynlab is sized for, 24 GiB of memory.
- :data:`BUDGET_BYTES`: one run may use a third of it, 8 GiB: the machine is shared (and ``sweep``
  runs a cell per CPU), and Python's allocator and the OS need room beside it.
- bytes per unit: peaks measured with ``tracemalloc`` on CPython 3.11 (``dynlab sim`` runs of 1,000
  and 4,000 workers; seed workloads of 10,000 requests of 16 blocks; ``run_scenario`` with
  100,000 documents), rounded up to a power of two for headroom. The measured figures are in
  each constant's comment.

Options that need no limit, because nothing is allocated per unit up front: ``--capacity``
(count-based caches grow with what they store; the timed engine's block pool keeps its
never-used blocks as a count, :class:`dynlab.kv.block_pool.BlockPool`), ``--max-num-seqs`` and
``--max-num-batched-tokens`` (caps on a step, not reservations; SGLang's ``--max-running-requests`` and
``--chunked-prefill-size`` are caps too, bounded only as no run can reach more: :data:`MAX_RUNNING_REQUESTS`,
:data:`MAX_CHUNK_TOKENS`), ``--event-delay`` (holds the
events of K requests), ``scenario``/``cliff`` ``--gpu``/``--cpu``/``--tokens`` (numbers of
tokens, never materialised), ``disagg --tokens`` and ``--gbps`` (arithmetic). A trace is
streamed (the ``opt`` policy and ``compare`` hold it in memory, as big as the file the user gave).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

__all__ = ["HORIZON_MS", "past_horizon", "MACHINE_BYTES", "BUDGET_BYTES", "WORKER_BYTES", "SEED_REQUEST_BYTES", "SEED_BLOCK_BYTES",
           "PROMPT_TOKEN_BYTES", "DOC_READ_BYTES", "GRID_CELL_BYTES", "MAX_WORKERS", "MAX_SEED_REQUESTS",
           "LOOPED_REQUEST_BYTES", "MAX_LOOPED_REQUESTS", "MAX_SEED_BLOCKS", "MAX_PROMPT_TOKENS", "MAX_DOC_READS", "MAX_GRID_CELLS", "OUTPUT_TOKEN_BYTES",
           "MAX_OUTPUT_TOKENS", "SPEC_TOKEN_BYTES", "MAX_SPEC_TOKENS", "check_sim", "check_doc_reads", "check_grid_cells", "output_too_long",
           "MAX_RUNNING_REQUESTS", "MAX_CHUNK_TOKENS"]

GIB = 2**30
#: memory of the machine dynlab is sized for
MACHINE_BYTES = 24 * GIB
#: what one run may use: a third of the machine (shared; a sweep runs a cell per CPU)
BUDGET_BYTES = MACHINE_BYTES // 3

#: one worker: its cache, the router's per-worker state, a timed engine with an empty pool
#: (measured 0.84-2.4 KB per worker)
WORKER_BYTES = 4096
#: one request of the synthetic workload before its blocks: its place in the shuffled order
#: (measured about 40 bytes)
SEED_REQUEST_BYTES = 64
#: one request of a trace looped by ``--duration``: its Request and its renamed block names (measured about
#: 830 bytes a request of the bundled Mooncake trace)
LOOPED_REQUEST_BYTES = 1024
#: one block name of the synthetic workload, held by the router's index, the caches, the ideal
#: cache's set, and ``opt``'s look-ahead (measured 110-280 bytes per block)
SEED_BLOCK_BYTES = 512
#: one token of one synthetic request, materialised while its blocks are hashed (measured 56 bytes)
PROMPT_TOKEN_BYTES = 64
#: one document read of ``scenario``/``cliff``: the access sequence, ``opt``'s future index, the
#: output's ``hit_docs`` (measured about 150 bytes per read)
DOC_READ_BYTES = 256
#: one sweep cell: its options, its configuration and its result record (measured about 2 KB
#: for the first two; a result is a few KB)
GRID_CELL_BYTES = 8192
#: one token a timed request will generate: the engine block table and bookkeeping that grow as it
#: decodes (measured about 10 bytes per token: one request of 10,000,000 output tokens on one worker
#: with ``--capacity 1e12``, 136 MB peak RSS against 39 MB for 1,000,000 tokens)
OUTPUT_TOKEN_BYTES = 16


def _one_digit(n: int) -> int:
    """``n`` rounded down to one significant digit: 2,097,152 -> 2,000,000."""
    scale = 10 ** (len(str(n)) - 1)
    return n // scale * scale


#: ``--workers`` at most (2,000,000)
MAX_WORKERS = _one_digit(BUDGET_BYTES // WORKER_BYTES)
#: ``--prefixes`` x ``--reps`` at most (100,000,000 requests)
MAX_SEED_REQUESTS = _one_digit(BUDGET_BYTES // SEED_REQUEST_BYTES)
#: ``--prefixes`` x ``--reps`` x blocks per request at most (10,000,000 block names)
MAX_SEED_BLOCKS = _one_digit(BUDGET_BYTES // SEED_BLOCK_BYTES)
#: requests a ``--duration`` loop of a trace may make (8,000,000)
MAX_LOOPED_REQUESTS = _one_digit(BUDGET_BYTES // LOOPED_REQUEST_BYTES)
#: ``--plen`` + ``--tail`` at most (100,000,000 tokens in one request)
MAX_PROMPT_TOKENS = _one_digit(BUDGET_BYTES // PROMPT_TOKEN_BYTES)
#: ``--docs`` x passes at most (30,000,000 document reads)
MAX_DOC_READS = _one_digit(BUDGET_BYTES // DOC_READ_BYTES)
#: cells of a sweep grid at most (1,000,000)
MAX_GRID_CELLS = _one_digit(BUDGET_BYTES // GRID_CELL_BYTES)
#: a trace's ``output_length`` at most (10,000,000 tokens, one request). The memory rule alone would
#: allow 500,000,000 (8 GiB / 16 B), but one such request takes minutes of CPU (a timed run spends
#: about 0.3 us per output token: 10,000,000 tokens in about 3 s); 10,000,000 is the longest context
#: window of a served model (Llama 4 Scout's 10M tokens), and vLLM refuses a request whose prompt
#: plus output exceeds the model's ``max_model_len``, so no real trace records more.
MAX_OUTPUT_TOKENS = min(10_000_000, _one_digit(BUDGET_BYTES // OUTPUT_TOKEN_BYTES))

#: SGLang's ``--max-running-requests`` at most (100,000,000 requests per worker): a cap, no reservation, bounded at
#: the most requests a generated workload may hold (:data:`MAX_SEED_REQUESTS`: ``--prefixes`` x ``--reps``, a
#: ``--workload`` spec's ``requests``) as the controller's replica bounds are at :data:`MAX_WORKERS`; SGLang 0.5.23
#: caps any value at the pool's tokens // 2 anyway (``resolve_max_num_reqs``, :mod:`dynlab.engine.sglang.defaults`)
MAX_RUNNING_REQUESTS = MAX_SEED_REQUESTS
#: SGLang's ``--chunked-prefill-size`` at most (100,000,000 tokens of one prefill chunk): a cap, no reservation,
#: bounded at the longest prompt dynlab makes (:data:`MAX_PROMPT_TOKENS`: ``--plen`` + ``--tail``); a chunk
#: that long never splits a prompt (``-1`` says no chunking outright)
MAX_CHUNK_TOKENS = MAX_PROMPT_TOKENS


#: one draft position of ``--spec-tokens K``: its per-position rate, running sum and counter per worker
#: (measured about 180 bytes per position: K = 4,000,000 on 2 workers, 748 MB peak RSS against 27 MB at K = 0)
SPEC_TOKEN_BYTES = 256
#: ``--spec-tokens`` at most (10,000,000 draft tokens per step). The memory rule would allow 30,000,000
#: (8 GiB / 256 B), but a draft position past a request's longest output is never verified, and no request
#: outputs more than :data:`MAX_OUTPUT_TOKENS`; a timed run also spends about 4 us per position
#: (10,000,000: about 40 s before the first step). The other bound, K below ``--max-num-batched-tokens``,
#: is vLLM's (:func:`check_sim`).
MAX_SPEC_TOKENS = min(MAX_OUTPUT_TOKENS, _one_digit(BUDGET_BYTES // SPEC_TOKEN_BYTES))


def _over(what: str, asked: int, limit: int, unit: str, per: int) -> ValueError:
    return ValueError(f"{what} asks for {asked:,} {unit}, more than dynlab allows: at most {limit:,} "
                      f"(about {per:,} bytes each within {BUDGET_BYTES // GIB} GiB; see docs/limits.md)")


def check_sim(config) -> None:
    """Raise ``ValueError`` (one line naming the option and its limit) when a
    :class:`dynlab.engine.config.SimConfig` asks for more than :data:`MAX_WORKERS` workers, a ``--duration``
    past the simulated clock's horizon (:data:`HORIZON_MS`, with or without ``--timing``), or a
    synthetic workload (no ``trace``) of more than :data:`MAX_SEED_REQUESTS` requests,
    :data:`MAX_SEED_BLOCKS` block names or :data:`MAX_PROMPT_TOKENS` tokens per request.
    """
    if config.workers > MAX_WORKERS:
        raise _over(f"--workers {config.workers}", config.workers, MAX_WORKERS, "workers", WORKER_BYTES)
    if getattr(config, "pools", ()):  # --pool: the pools' counts summed (SimConfig.fleet_workers)
        n = config.fleet_workers
        if n > MAX_WORKERS:
            raise _over("--pool", n, MAX_WORKERS, "workers", WORKER_BYTES)
    duration = getattr(config, "duration", None)  # seconds of arrivals from the first: past the horizon, refused
    if duration is not None and not duration * 1000.0 <= HORIZON_MS:
        raise past_horizon(duration * 1000.0, f"--duration {duration:g} s of arrivals", "use a shorter --duration")
    _check_spec_tokens(config)
    if config.trace is not None:
        return
    tokens = config.plen + config.tail
    if tokens > MAX_PROMPT_TOKENS:
        raise _over(f"--plen {config.plen} + --tail {config.tail}", tokens, MAX_PROMPT_TOKENS,
                    "tokens per request", PROMPT_TOKEN_BYTES)
    requests = config.prefixes * config.reps
    if requests > MAX_SEED_REQUESTS:
        raise _over(f"--prefixes {config.prefixes} x --reps {config.reps}", requests, MAX_SEED_REQUESTS,
                    "requests", SEED_REQUEST_BYTES)
    blocks = requests * (tokens // config.block)  # full blocks only are named
    if blocks > MAX_SEED_BLOCKS:
        raise _over(f"--prefixes {config.prefixes} x --reps {config.reps} x {tokens // config.block} blocks "
                    "per request", blocks, MAX_SEED_BLOCKS, "block names", SEED_BLOCK_BYTES)


def _check_spec_tokens(config) -> None:
    """``--spec-tokens K``: at most :data:`MAX_SPEC_TOKENS`, and (with ``--timing`` and a method) below
    ``--max-num-batched-tokens``: vLLM 0.33 refuses ``max_num_batched_tokens <= num_lookahead_tokens``
    (``VllmConfig._set_max_num_scheduled_tokens``; the lookahead is K for eagle, eagle3, mtp and draft),
    and a decode schedules ``1 + K`` tokens in one step, so drafts past the budget are never verified
    (ngram too)."""
    k = getattr(config, "spec_tokens", 0)
    if k > MAX_SPEC_TOKENS:
        raise ValueError(f"--spec-tokens {k:,} is more than dynlab allows: at most {MAX_SPEC_TOKENS:,} draft tokens "
                         "per step (no request outputs more; see docs/limits.md)")
    budget = getattr(config, "max_num_batched_tokens", None)
    if k and budget is not None and k >= budget and config.timing and config.spec_method is not None:
        why = ("drafts past the budget are never verified" if config.spec_method == "ngram"
               else f"vLLM refuses a budget <= the {k:,} lookahead slots")
        raise ValueError(f"--spec-tokens {k:,} needs --max-num-batched-tokens above it (got {budget:,}): a decode "
                         f"schedules 1 + K tokens in one step, and {why}")


def output_too_long(n: int) -> str:
    """The message (without ``FILE:LINE``) for a request's ``output_length`` ``n`` over
    :data:`MAX_OUTPUT_TOKENS`; the trace readers raise it for the line."""
    return (f"output_length {n:,} is more than dynlab allows: at most {MAX_OUTPUT_TOKENS:,} tokens per request "
            "(the longest context window of a served model; see docs/limits.md)")


def check_doc_reads(docs: int, passes: Sequence[str]) -> None:
    """Raise ``ValueError`` when ``docs`` documents read in ``len(passes)`` passes exceed
    :data:`MAX_DOC_READS` reads (``scenario`` and ``cliff``)."""
    reads = docs * len(passes)
    if reads > MAX_DOC_READS:
        raise _over(f"--docs {docs} x {len(passes)} passes", reads, MAX_DOC_READS, "document reads",
                    DOC_READ_BYTES)


def check_grid_cells(sizes: Sequence[int], what: Optional[str] = None) -> None:
    """Raise ``ValueError`` when a grid of axes of ``sizes`` values has more than
    :data:`MAX_GRID_CELLS` cells (counted before any cell is built)."""
    cells = math.prod(sizes)
    if cells > MAX_GRID_CELLS:
        what = what or f"the grid ({' x '.join(map(str, sizes))} values)"
        raise _over(what, cells, MAX_GRID_CELLS, "cells", GRID_CELL_BYTES)


#: the latest simulated time (ms) a run may reach: 10^12 ms, about 31.7 years. Up to it the float
#: clock still tells apart times 2^-13 ms (0.12 us) apart (a double's 53-bit mantissa), and sums of
#: millions of per-request times stay far from overflowing; beyond it, a step's few ms vanish into
#: rounding and absurd inputs (``--time-scale 1e308``) end in infinities. The producers of times
#: (arrivals, engine steps, loads, KV transfers) refuse to pass it, naming the option to change.
HORIZON_MS = 1e12


def past_horizon(t: float, what: str, fix: str) -> ValueError:
    """The one-line ``ValueError`` for a time ``t`` (ms) past :data:`HORIZON_MS` (or not a number):
    ``WHAT would reach T ms, past the simulated clock's horizon (1e+12 ms, 31.7 years); FIX``."""
    return ValueError(f"{what} would reach {t:g} ms, past the simulated clock's horizon "
                      f"({HORIZON_MS:g} ms, 31.7 years); {fix}")
