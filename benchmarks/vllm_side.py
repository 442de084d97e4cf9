"""vLLM's side of the differential harness (:mod:`benchmarks.fidelity_vllm`): its real v1 scheduler, offline.

Needs ``pip install "dynlab[vllm-oracle]"`` (vLLM 0.33.0, CPU is enough: no GPU, no weights, no
network). :func:`run_vllm` builds vLLM's ``Scheduler`` (or ``AsyncScheduler``) the way ``EngineCore``
builds it (``vllm/v1/engine/core.py``): a ``VllmConfig`` over a temporary model directory holding
only a small ``config.json`` (``ModelConfig(skip_tokenizer_init=True)``), ``CacheConfig(block_size,
enable_prefix_caching=True)``, ``SchedulerConfig(enable_chunked_prefill=True, ...)``, and a
``KVCacheConfig`` of ``capacity + 1`` blocks (vLLM's block pool keeps block 0 as its null block) with
one ``FullAttentionSpec`` group. Requests carry ``SamplingParams(max_tokens=output_length,
ignore_eos=True)`` and the sha256 block hasher (``get_request_block_hasher(block, sha256)``).

The loop (simulated clock in ms; the same driving rules as dynlab's ``EngineWorker``): add the
requests that have arrived by ``now``; ``schedule()``; if nothing was scheduled, jump to the next
arrival; else the step lasts the linear model's ``beta0 + beta1 x prefill tokens + beta2 x decode
requests`` ms (:class:`dynlab_builtins.latency.Linear`; a request is a decode when it computes 1
token, its last uncomputed one, with at least its prompt computed: dynlab's rule); at its end a fake
``ModelRunnerOutput`` samples one token for every request whose computed tokens reached its tokens,
and ``update_from_output()`` applies it. A request arriving exactly at a step's end joins the next
step. Sampled token ids are ``OUTPUT_BASE + trace line``, never a prompt token (see
:mod:`vllm_traces`).

With ``async_scheduling=True`` the loop runs vLLM's ``AsyncScheduler`` as ``EngineCore.step_with_batch_queue``
does with a batch queue of depth 2: step ``n + 1`` is scheduled (on output placeholders) before step
``n``'s output is applied, then the output of step ``n`` is applied at its end; step ``n + 1`` starts
when step ``n`` ends (the GPU is never idle while work is queued). Which step each request joins and
each token's time are then compared with the synchronous loop (:func:`run_vllm` returns both the
per-request records and the per-step schedule).
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

#: a small Llama-shaped config: the scheduler reads only its lengths and attention shape
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1,
    "vocab_size": 2_000_000, "max_position_embeddings": 65536, "torch_dtype": "float32",
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}


def _model_dir() -> str:
    path = tempfile.mkdtemp(prefix="dynlab-vllm-model-")
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(MODEL_CONFIG, fh)
    return path


def build_scheduler(setup, *, reserve_full_isl: bool = True, async_scheduling: bool = False,
                    max_model_len: int = 65536, speculative=None):
    """vLLM's scheduler for ``setup`` (:class:`vllm_dynlab_side.EngineSetup`), as ``EngineCore`` builds it.
    ``speculative``: ``None``, or a callable ``(target ModelConfig, ParallelConfig) -> SpeculativeConfig``
    (:mod:`fidelity_spec`)."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(model=_model_dir(), skip_tokenizer_init=True, max_model_len=max_model_len,
                        dtype="float32")
    sched = SchedulerConfig(max_num_seqs=setup.max_num_seqs, max_num_batched_tokens=setup.max_num_batched_tokens,
                            max_model_len=max_model_len, enable_chunked_prefill=True,
                            async_scheduling=async_scheduling, scheduler_reserve_full_isl=reserve_full_isl,
                            is_encoder_decoder=False, policy=setup.queue_policy)
    cache = CacheConfig(block_size=setup.block, enable_prefix_caching=True)
    spec = speculative(model, ParallelConfig()) if speculative is not None else None
    lora = None
    if getattr(setup, "max_loras", 0):  # the rows' lora_name (vllm_traces.lora_cases)
        from vllm.config import LoRAConfig

        lora = LoRAConfig(max_loras=setup.max_loras)
    config = VllmConfig(scheduler_config=sched, model_config=model, cache_config=cache, speculative_config=spec,
                        lora_config=lora)
    kv = KVCacheConfig(num_blocks=setup.capacity + 1, kv_cache_tensors=[], kv_cache_groups=kv_cache_groups(setup))
    cache.num_gpu_blocks = setup.capacity + 1
    cls = AsyncScheduler if async_scheduling else Scheduler
    return cls(vllm_config=config, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(config),
               block_size=setup.block, log_stats=False)


def kv_cache_groups(setup) -> list:
    """vLLM's ``KVCacheGroupSpec`` list for ``setup``: one ``FullAttentionSpec`` group, or, when ``setup.model``
    names a model with KV cache groups, the groups dynlab gives it (:func:`dynlab.kv.groups.hybrid_pool`, the
    one source of both sides' layouts): ``full_groups`` full-attention groups, then a ``SlidingWindowSpec`` or
    ``ChunkedLocalAttentionSpec`` group per extra group, in dynlab's order (each one layer: only the block
    rules matter here, the pool's size is ``setup.capacity`` on both sides)."""
    import torch
    from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec, FullAttentionSpec, KVCacheGroupSpec,
                                            SlidingWindowSpec)

    shape = dict(block_size=setup.block, num_kv_heads=1, head_size=16, dtype=torch.float32)
    if getattr(setup, "model", None) is None:
        return [KVCacheGroupSpec(["layer"], FullAttentionSpec(**shape))]
    from dynlab.kv.groups import hybrid_pool
    from dynlab.latency.hardware import model_spec

    pool = hybrid_pool(model_spec(setup.model), setup.block)
    groups = [KVCacheGroupSpec([f"full.{i}"], FullAttentionSpec(**shape)) for i in range(pool.full_groups)]
    for i, g in enumerate(pool.groups):
        if g.kind == "sliding_window":
            spec = SlidingWindowSpec(sliding_window=g.window, **shape)
        elif g.kind == "chunked_local":
            spec = ChunkedLocalAttentionSpec(attention_chunk_size=g.window, **shape)
        else:
            raise ValueError(f"{setup.model}: the harness builds no vLLM group for a {g.kind} group")
        groups.append(KVCacheGroupSpec([f"{g.kind}.{i}"], spec))
    return groups


@contextlib.contextmanager
def dynlab_rules(free_to_tail: bool = True, prompt_only: bool = True, first_copy_only: bool = True):
    """Switch vLLM's block pool to dynlab's rules while the block is active (issue 24's rules 2 and 3 and
    duplicate copies; rule 1 is ``reserve_full_isl=False``): every freed block goes to the TAIL of the free
    queue in the order given (``BlockPool.free_blocks`` puts unhashed ones at the head); a block whose
    hash is already cached stays unnamed (``BlockPool._insert_block_hash`` files a second copy under the
    hash); and requests made meanwhile (:func:`_request`) hash their prompt's full blocks only (vLLM's
    hasher also names blocks of generated tokens). For the harness's check that these are the only
    differences; restored on exit. Each flag switches one of the three (False keeps vLLM's)."""
    from vllm.v1.core.block_pool import BlockPool

    free, insert = BlockPool.free_blocks, BlockPool._insert_block_hash

    def to_tail(self, ordered_blocks):
        tail = []
        for block in ordered_blocks:
            if block.is_null:
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                tail.append(block)
        self.free_block_queue.append_n(tail)

    def first_copy(self, key, block, num_tokens):
        if block.block_hash is None and self.cached_block_hash_to_block.get_one_block(key) is not None:
            return
        insert(self, key, block, num_tokens)

    global _PROMPT_ONLY
    BlockPool.free_blocks = to_tail if free_to_tail else free
    BlockPool._insert_block_hash = first_copy if first_copy_only else insert
    _PROMPT_ONLY = prompt_only
    try:
        yield
    finally:
        BlockPool.free_blocks, BlockPool._insert_block_hash, _PROMPT_ONLY = free, insert, False


_PROMPT_ONLY = False


def _prompt_blocks_only(hasher):
    def hash_prompt_blocks(request):
        start = len(request.block_hashes)
        new = hasher(request)
        keep = max(request.num_prompt_tokens // _BLOCK[0] - start, 0)
        return new[:keep]
    return hash_prompt_blocks


_BLOCK = [16]


def _request(index: int, row: dict, block: int, hash_lookahead: int = 0):
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    if not _HASHER:
        init_none_hash(sha256)
    if hash_lookahead not in _HASHER:  # EngineCore passes vllm_config.num_hash_lookahead_tokens (EAGLE: 1)
        _HASHER[hash_lookahead] = get_request_block_hasher(block, sha256, hash_lookahead)
    if block != _BLOCK[0]:
        raise ValueError(f"the harness hashes {_BLOCK[0]}-token blocks, not {block}")
    params = SamplingParams(max_tokens=_out_len(row), ignore_eos=True)
    hasher = _prompt_blocks_only(_HASHER[hash_lookahead]) if _PROMPT_ONLY else _HASHER[hash_lookahead]
    lora = None
    if row.get("lora_name"):  # vLLM's LoRARequest: a positive int id per name (the scheduler counts those)
        from vllm.lora.request import LoRARequest

        name = row["lora_name"]
        lora = LoRARequest(name, _LORA_IDS.setdefault(name, len(_LORA_IDS) + 1), "/nonexistent/" + name)
    return Request(request_id=str(index), prompt_token_ids=list(row["tokens"]), sampling_params=params,
                   pooling_params=None, arrival_time=float(row["timestamp"]), block_hasher=hasher,
                   priority=int(row.get("priority", 0)), lora_request=lora)


_HASHER: dict = {}  # hash lookahead tokens -> vLLM's request block hasher
_LORA_IDS: dict = {}  # lora_name -> its LoRARequest's int id


def _out_len(row: dict) -> int:
    """Tokens ``row`` generates: its ``output_length``, or its ``output_tokens``' count, at least 1."""
    n = row.get("output_length")
    if n is None and row.get("output_tokens") is not None:
        n = len(row["output_tokens"])
    return max(int(n or 1), 1)


class _Driver:
    """One run of vLLM's scheduler in simulated time (see the module docstring); times in ms."""

    def __init__(self, setup, rows: list, scheduler):
        from vllm_traces import OUTPUT_BASE

        self.setup, self.rows, self.sched, self.base = setup, rows, scheduler, OUTPUT_BASE
        self.reqs: list = [None] * len(rows)
        self.first_scheduled = [None] * len(rows)
        self.hits = [None] * len(rows)
        self.first_token = [None] * len(rows)
        self.finish = [None] * len(rows)
        self.steps: list = []  # (start ms, end ms, {trace line: tokens scheduled})
        self.next = 0

    def arrive(self, now: float) -> None:
        rows = self.rows
        while self.next < len(rows) and rows[self.next]["timestamp"] <= now:
            req = _request(self.next, rows[self.next], self.setup.block,
                           getattr(self.sched, "num_hash_lookahead_tokens", 0))
            self.reqs[self.next] = req
            self.sched.add_request(req)
            self.next += 1

    def schedule(self, start: float):
        """``schedule()`` once; ``(output, step ms, trace lines that sample a token)``."""
        out = self.sched.schedule()
        s = self.setup
        prefill = decodes = 0
        sampling = []
        for rid, n in out.num_scheduled_tokens.items():
            req = self.sched.requests[rid]
            i = int(rid)
            before = req.num_computed_tokens - n
            if self.first_scheduled[i] is None:
                self.first_scheduled[i], self.hits[i] = start, before
            if not req.is_prefill_chunk:
                sampling.append(i)
            p, d = self.cost(req, n, before)
            prefill += p
            decodes += d
        ms = s.beta0 + s.beta1 * prefill + s.beta2 * decodes if out.num_scheduled_tokens else 0.0
        return out, ms + self.extra_ms(decodes), sampling

    def cost(self, req, n: int, before: int) -> tuple:
        """``(prefill tokens, decode requests)`` that ``req``, scheduled ``n`` tokens with ``before`` computed,
        adds to the step's linear price: a decode is one token past the prompt, anything else a chunk."""
        if n == 1 and before >= req.num_prompt_tokens and not req.is_prefill_chunk:
            return 0, 1
        return n, 0

    def extra_ms(self, decodes: int) -> float:
        """Step time beyond the linear model's (ms); none here."""
        return 0.0

    def apply(self, out, sampling: list, end: float) -> None:
        """``update_from_output()`` at ``end`` with one sampled token for each of ``sampling``."""
        from vllm.v1.outputs import ModelRunnerOutput

        ids = list(out.num_scheduled_tokens)
        sampled = set(sampling)
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: k for k, rid in enumerate(ids)},
                                sampled_token_ids=[[self._token(int(rid))] if int(rid) in sampled else []
                                                   for rid in ids])
        self.sched.update_from_output(out, mro)
        for rid in ids:
            i = int(rid)
            req = self.reqs[i]
            if self.first_token[i] is None and req.num_output_tokens > 0:
                self.first_token[i] = end
            if self.finish[i] is None and req.is_finished():
                self.finish[i] = end

    def _token(self, i: int) -> int:
        """The id trace line ``i`` samples next: its row's ``output_tokens`` in order when given (so vLLM
        hashes the reply a later prompt quotes), else ``OUTPUT_BASE + i``."""
        reply = self.rows[i].get("output_tokens")
        if reply:
            return reply[min(self.reqs[i].num_output_tokens, len(reply) - 1)]
        return self.base + i

    def records(self) -> list[dict]:
        out = []
        for i, row in enumerate(self.rows):
            req = self.reqs[i]
            out.append({"id": i, "worker": 0, "arrival_ms": float(row["timestamp"]),
                        "first_scheduled_ms": self.first_scheduled[i], "first_token_ms": self.first_token[i],
                        "finish_ms": self.finish[i], "input_length": len(row["tokens"]),
                        "output_length": _out_len(row), "hit_tokens": self.hits[i],
                        "preemptions": req.num_preemptions if req is not None else 0, "rejected": False})
        return out


def _run_sync(d: _Driver) -> None:
    now = 0.0
    rows = d.rows
    while True:
        d.arrive(now)
        if not d.sched.has_requests():
            if d.next >= len(rows):
                return
            now = max(now, float(rows[d.next]["timestamp"]))
            continue
        out, ms, sampling = d.schedule(now)
        if not out.num_scheduled_tokens:  # nothing schedulable: only an arrival can change that
            d.apply(out, sampling, now)
            if not d.sched.get_num_unfinished_requests():  # it told the finished ones: empty now
                continue
            if d.next >= len(rows):
                raise RuntimeError("vLLM's scheduler has requests but schedules nothing, and none is left to arrive")
            now = max(now, float(rows[d.next]["timestamp"]))
            continue
        end = now + ms
        d.steps.append((now, end, {int(r): n for r, n in out.num_scheduled_tokens.items()}))
        d.apply(out, sampling, end)
        now = end


def _run_async(d: _Driver, depth: int = 2) -> None:
    """``EngineCore.step_with_batch_queue`` with a batch queue of ``depth`` in simulated time."""
    from collections import deque

    queue: deque = deque()
    now = gpu_free = 0.0
    rows = d.rows
    while True:
        d.arrive(now)
        if d.sched.has_requests():
            out, ms, sampling = d.schedule(max(now, gpu_free))
            executed = bool(out.num_scheduled_tokens)
            start = max(now, gpu_free)
            end = start + ms
            gpu_free = end
            if executed:
                d.steps.append((start, end, {int(r): n for r, n in out.num_scheduled_tokens.items()}))
            queue.appendleft((out, sampling, end))
            if len(queue) < depth and (executed or d.sched.has_requests()):
                continue
        elif not queue:
            if d.next >= len(rows):
                return
            now = max(now, float(rows[d.next]["timestamp"]))
            continue
        out, sampling, end = queue.pop()
        now = max(now, end)
        d.apply(out, sampling, now)


def run_vllm(setup, rows: list, *, reserve_full_isl: bool = True, async_scheduling: bool = False,
             as_dynlab=False) -> tuple:
    """``(records in trace order, steps, wall seconds of the loop)`` of vLLM's scheduler on ``rows``.

    ``records``: the keys of :data:`vllm_dynlab_side.KEYS`; ``hit_tokens`` is the request's
    ``num_computed_tokens`` before its first scheduled chunk (its first admission's prefix hit).
    ``steps``: ``(start ms, end ms, {trace line: tokens scheduled})`` per executed step.
    Rows must be in time order. ``as_dynlab``: inside :func:`dynlab_rules` (with ``reserve_full_isl=False``
    that is dynlab's engine's every rule); a dict passes its flags to :func:`dynlab_rules`.
    """
    sched = build_scheduler(setup, reserve_full_isl=reserve_full_isl, async_scheduling=async_scheduling)
    d = _Driver(setup, rows, sched)
    if as_dynlab is False:
        rules = contextlib.nullcontext()
    else:
        rules = dynlab_rules(**(as_dynlab if isinstance(as_dynlab, dict) else {}))
    with rules:
        start = time.perf_counter()
        (_run_async if async_scheduling else _run_sync)(d)
        wall = time.perf_counter() - start
    return d.records(), d.steps, wall
