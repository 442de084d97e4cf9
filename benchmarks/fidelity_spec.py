"""Speculative decoding against vLLM 0.33's own scheduler, per request (issue 26 item 6).

The harness of :mod:`fidelity_vllm` with a ``SpeculativeConfig`` (``--method ngram`` by default;
``eagle``/``eagle3``/``mtp`` through :func:`_speculative`, with linear's ``spec_gamma`` drafter term on
both sides and, with ``--legacy-hashes``, vLLM's EAGLE hash lookahead and block drop switched off, which
dynlab does not offer, so that run no longer compares like with like), ``num_speculative_tokens=K``:
vLLM schedules ``1 + K`` tokens per decoding request, reserves ``num_lookahead_tokens`` slots, rolls
rejected drafts back in ``update_from_output``. The fake model output carries the drafts
(``update_draft_token_ids``: ``K`` ids for every request that sampled) and ``1 + a`` sampled ids (a row's
``output_tokens`` when it gives them), ``a`` drawn by dynlab's own :class:`dynlab.engine.spec.Acceptance`
in ``expected`` mode over the real drafts (vLLM's ``-1`` padding drafts are never accepted):
deterministic, the same draws on both sides when both schedule the same drafts. dynlab runs ``sim
--spec-method M --spec-tokens K --spec-acceptance R --spec-draws expected``; both sides at vLLM 0.33's
default admission. Step time on both sides: the linear model, a verify step's drafts priced as prefill
tokens (``beta1`` each, dynlab's rule). The traces: :func:`fidelity_vllm.all_cases` and
:func:`spec_cases` (the hand cases of ``tests/engine/test_spec_vllm_rules.py``). Prints one row per trace.

    python benchmarks/fidelity_spec.py [--method ngram|eagle|eagle3|mtp] [--k 2] [--acceptance 0.7] [--only NAMES]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vllm_side  # noqa: E402
from fidelity_vllm import _check_vllm, compare  # noqa: E402
from vllm_dynlab_side import EngineSetup, run_dynlab  # noqa: E402
from fidelity_vllm import all_cases  # noqa: E402


class _SpecDriver(vllm_side._Driver):
    """vLLM's loop with drafts: every request that sampled gets ``k`` drafts; a verify samples ``1 + a``."""

    def __init__(self, setup, rows, scheduler, k: int, acceptance, gamma: float = 0.0):
        super().__init__(setup, rows, scheduler)
        self.k, self.acceptance, self.gamma = k, acceptance, gamma
        self.state: dict = {}

    def cost(self, req, n: int, before: int) -> tuple:
        """A decoding request verifies ``n - 1`` drafts: priced as a decode plus a chunk of them over the
        context (dynlab's pricing); anything else as :meth:`vllm_side._Driver.cost`."""
        if before >= req.num_prompt_tokens and not req.is_prefill_chunk:
            return n - 1, 1
        return n, 0

    def extra_ms(self, decodes: int) -> float:
        """The drafter: linear's ``spec_gamma`` term (0 for ngram), per draft token of each decoding request."""
        return self.gamma * self.k * decodes

    def apply(self, out, sampling: list, end: float) -> None:
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

        ids = list(out.num_scheduled_tokens)
        sampled = set(sampling)
        tokens = []
        for rid in ids:
            i = int(rid)
            if i not in sampled:
                tokens.append([])
                continue
            s = sum(1 for t in out.scheduled_spec_decode_tokens.get(rid, ()) if t >= 0)  # -1: padding, never accepted
            st = self.state.setdefault(i, _State(i))
            a = self.acceptance.accepted(st, s) if s else 0
            tokens.append(self._tokens(i, 1 + a))
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: k for k, rid in enumerate(ids)},
                                sampled_token_ids=tokens)
        self.sched.update_from_output(out, mro)
        live = [rid for rid in ids if int(rid) in sampled and not self.reqs[int(rid)].is_finished()]
        if live:
            self.sched.update_draft_token_ids(DraftTokenIds(live, [[self.base + int(r)] * self.k for r in live]))
        for rid in ids:
            i = int(rid)
            req = self.reqs[i]
            if self.first_token[i] is None and req.num_output_tokens > 0:
                self.first_token[i] = end
            if self.finish[i] is None and req.is_finished():
                self.finish[i] = end


    def _tokens(self, i: int, n: int) -> list:
        """The ``n`` ids trace line ``i`` samples in this verify: its row's next ``output_tokens`` when given
        (so vLLM hashes the reply a later prompt quotes, as :meth:`vllm_side._Driver._token`), else
        ``OUTPUT_BASE + i``."""
        reply = self.rows[i].get("output_tokens")
        if not reply:
            return [self.base + i] * n
        done = self.reqs[i].num_output_tokens
        return [reply[min(done + j, len(reply) - 1)] for j in range(n)]


class _State:
    __slots__ = ("id", "spec_state")

    def __init__(self, i):
        self.id, self.spec_state = i, None


def _speculative(method: str, k: int, legacy_hashes: bool = False, hash_rule: str = "lookahead"):
    """``(target ModelConfig, ParallelConfig) -> SpeculativeConfig`` for :func:`vllm_side.build_scheduler`.

    ``ngram`` is built as vLLM builds it. ``eagle``/``eagle3``/``mtp`` need a draft checkpoint that the
    offline harness does not have (``SpeculativeConfig.__post_init__`` loads the draft's ``ModelConfig``
    from ``model``), and the scheduler reads only the method through ``VllmConfig.num_lookahead_tokens``
    (``K``), ``num_prefill_lookahead_tokens`` (1 for an EAGLE-family head), ``num_hash_lookahead_tokens``
    (1: a block's hash covers the token after it) and ``use_eagle_block_drop``: so the config is built as
    ``ngram`` (the draft config is then the target's, what vLLM does for ngram) and its ``method`` set
    afterwards, a fake draft model config with the method's every scheduler-visible property."""
    def build(model, parallel):
        from vllm.config import SpeculativeConfig

        spec = SpeculativeConfig(method="ngram", num_speculative_tokens=k, prompt_lookup_max=2, prompt_lookup_min=1,
                                 target_model_config=model, target_parallel_config=parallel)
        if method != "ngram":
            spec.method = method
            spec.prompt_lookup_max = spec.prompt_lookup_min = 0
            if legacy_hashes:  # vLLM's own switches: no hash lookahead, no trailing-block drop
                spec.disable_lookahead_block_hashes = spec.disable_eagle_block_drop = True
            elif hash_rule == "drop":  # plain hashes, the trailing-block drop (dynlab's --spec-hash-rule drop)
                spec.disable_lookahead_block_hashes = True
        return spec
    return build


def build_spec_scheduler(setup, k: int, method: str = "ngram", legacy_hashes: bool = False, hash_rule: str = "lookahead"):
    """vLLM's ``Scheduler`` for ``setup`` with ``SpeculativeConfig(method, num_speculative_tokens=k)``
    (:func:`vllm_side.build_scheduler` at vLLM 0.33.0's default admission, ``scheduler_reserve_full_isl=True``);
    ``hash_rule`` ``drop``: ``disable_lookahead_block_hashes`` (dynlab's ``--spec-hash-rule drop``)."""
    return vllm_side.build_scheduler(setup, reserve_full_isl=True,
                                     speculative=_speculative(method, k, legacy_hashes, hash_rule))


def run_vllm_spec(setup, rows: list, k: int, rate: float, method: str = "ngram", gamma: float = 0.0,
                  legacy_hashes: bool = False, hash_rule: str = "lookahead") -> list:
    """Per-request records of vLLM's scheduler with ``method`` speculation, ``k`` drafts, constant rate ``rate``."""
    from dynlab.engine.spec import Acceptance, parse_acceptance

    d = _SpecDriver(setup, rows, build_spec_scheduler(setup, k, method, legacy_hashes, hash_rule), k,
                    Acceptance(parse_acceptance(str(rate), k), "expected"), 0.0 if method == "ngram" else gamma)
    vllm_side._run_sync(d)  # vLLM 0.33's own rules, which dynlab's engine follows by default (issue 24)
    return d.records()


def run_dynlab_spec(setup, path: str, k: int, rate: float, method: str = "ngram", gamma: float = 0.0,
                    hash_rule: str = "lookahead") -> list:
    import vllm_dynlab_side as side

    original = side.sim_args

    def spec_args(setup, trace):
        return original(setup, trace) + ["--spec-method", method, "--spec-tokens", str(k),
                                         "--spec-acceptance", str(rate), "--spec-draws", "expected"] + (
            [] if method == "ngram" else ["--latency-opt", f"spec_gamma={gamma!r}"]) + (
            ["--spec-hash-rule", hash_rule] if hash_rule != "lookahead" else [])

    side.sim_args = spec_args
    try:
        return run_dynlab(setup, path, admission="full")[0]
    finally:
        side.sim_args = original


def spec_cases() -> list:
    """The hand cases of ``tests/engine/test_spec_vllm_rules.py`` as harness traces (16-token blocks, beta0 = 10,
    beta1 = 1, beta2 = 2 ms; their derivations are there): a cut verify's finish, a full hit padded to
    ``1 + K`` tokens, the whole-sequence check without the lookahead slots, a prompt of whole blocks."""
    from vllm_traces import Case, _hand, _Ids, _row

    ids = _Ids(500_000)  # apart from the other cases' ids
    x, a, b, more, e = ids.take(16), ids.take(30), ids.take(32), ids.take(4), ids.take(33)
    p, q, whole = ids.take(16), ids.take(32), ids.take(32)
    return [
        Case("spec-finish-trim", _hand(4, 8192),
             [_row(0, x, 1), _row(100, a, 2), _row(200, b, 1), _row(300, x + more, 1)],
             "a verify accepting past output_length: its last block is freed unhashed, to the head"),
        Case("spec-full-hit-padding", _hand(16, 8192), [_row(0, e, 1), _row(100, e, 2)],
             "a full hit with one token left is admitted with 1 + K tokens (placeholder drafts)"),
        Case("spec-full-seq-check", _hand(4, 16), [_row(0, p, 20), _row(1, q, 1)],
             "the whole-sequence admission check counts num_tokens, not the lookahead slots"),
        Case("spec-whole-blocks", _hand(64, 8192), [_row(0, whole, 3), _row(100, whole + ids.take(16), 2)],
             "EAGLE: a prompt's last whole block is hashed with the first generated token"),
    ]


#: the hybrid traces' models: gpt-oss (one full-attention and one 128-token sliding-window group), Gemma 3
#: (one full-attention and six 1,024-token sliding-window groups), Llama 4 Scout (one full-attention and three
#: 8,192-token chunked-local groups); all three ship EAGLE-3 heads
HYBRID_MODELS = {"gptoss": "gpt-oss-120b", "gemma3": "gemma-3-27b", "llama4": "llama-4-scout"}


def _groups(model: str) -> int:
    from dynlab.kv.groups import hybrid_pool
    from dynlab.latency.hardware import model_spec

    pool = hybrid_pool(model_spec(model), 16)
    return pool.full_groups + len(pool.groups)


def _fit_groups(rows: list, capacity: int, model: str, k: int = 8) -> list:
    """``rows`` whose whole sequence (``input + output - 1`` tokens, plus ``2 K`` for a last verify's drafts and
    lookahead slots) takes at most half the pool in every group at once (what a one-chunk prefill holds)."""
    n = _groups(model)
    return [r for r in rows if n * -(-(len(r["tokens"]) + r["output_length"] - 1 + 2 * k) // 16) <= capacity // 2]


def hybrid_cases(scale: float = 1.0) -> list:
    """Speculative decoding on models with KV cache groups (issue 43 item 2): hand cases on gpt-oss's two groups
    (128-token window, 16-token blocks: the window drops a block every 16 tokens once 127 are computed) and
    Gemma 3's seven, and seeded conversations on both, ample and tight pools, one with a 256-token budget."""
    from vllm_traces import HAND, Case, _Ids, _row, conversations

    ids = _Ids(700_000)
    gpt, gemma = HYBRID_MODELS["gptoss"], HYBRID_MODELS["gemma3"]

    def hand(capacity: int, budget: int, model: str, seqs: int = 256, tp: int = 1):
        return EngineSetup(capacity, budget, min(seqs, budget), **HAND, model=model, tp=tp)

    long, shared, tail = ids.take(200), ids.take(300), ids.take(40)
    g_long, l_long = ids.take(1100), ids.take(9000)
    cases = [
        Case("swa-decode-window", hand(64, 8192, gpt), [_row(0, long, 60)],
             "gpt-oss: 200 + 60 tokens alone: the window frees a block as decoding passes each 16 tokens"),
        Case("swa-prefix-hit", hand(256, 8192, gpt), [_row(0, shared, 4), _row(1000, shared + tail, 3)],
             "gpt-oss: a second turn hits the first's 300 tokens: the full group's prefix and the window's "
             "blocks before it, the names covering the token after each block"),
        Case("swa-whole-blocks", hand(256, 8192, gpt), [_row(0, shared[:256], 3), _row(1000, shared[:256], 2)],
             "gpt-oss: a prompt of whole blocks sent twice: the hit stops a block short of the last"),
        Case("swa-tight", hand(40, 8192, gpt), [_row(0, ids.take(150), 40), _row(5, ids.take(150), 40),
                                               _row(10, ids.take(100), 30)],
             "gpt-oss: three requests in 40 blocks of two groups: preemptions, the lookahead slots in both"),
        Case("swa-chunked", hand(128, 48, gpt), [_row(0, ids.take(400), 20), _row(30, ids.take(60), 30)],
             "gpt-oss: a 400-token prompt chunked at 48 tokens beside a verifying decode"),
        Case("gemma-long-window", hand(1024, 8192, gemma), [_row(0, g_long, 40), _row(2000, g_long + tail, 5)],
             "Gemma 3: 1,100 tokens past its 1,024-token windows in six groups, then a hit on them"),
        Case("llama4-chunk", hand(4096, 8192, HYBRID_MODELS["llama4"], tp=4), [_row(0, l_long, 30),
                                                                       _row(20000, l_long + tail, 4)],
             "Llama 4 Scout: 9,000 tokens past its 8,192-token attention chunk in three groups, then a hit"),
    ]
    specs = [  # name, model, seed, requests, conversations/s, capacity, budget, max_num_seqs, what
        ("conv-gptoss-ample", gpt, 11, 200, 0.5, 8192, 8192, 256, "gpt-oss, ample pool"),
        ("conv-gptoss-tight", gpt, 12, 500, 1.0, 1200, 8192, 256, "gpt-oss, tight pool: evictions, preemptions"),
        ("conv-gptoss-overloaded", gpt, 16, 500, 3.0, 700, 8192, 256, "gpt-oss, overloaded pool: preemptions"),
        ("conv-gptoss-chunked", gpt, 13, 300, 1.0, 1600, 256, 64, "gpt-oss, 256-token budget, 64 seqs"),
        ("conv-gemma3-ample", gemma, 14, 150, 0.5, 16384, 8192, 256, "Gemma 3, ample pool"),
        ("conv-gemma3-tight", gemma, 15, 300, 1.0, 3000, 8192, 256, "Gemma 3, tight pool"),
        ("conv-gemma3-overloaded", gemma, 17, 300, 3.0, 2000, 1024, 64, "Gemma 3, overloaded, 1,024-token budget"),
    ]
    for name, model, seed, n, rate, cap, budget, seqs, what in specs:
        rows = _fit_groups(conversations(seed, max(int(n * scale), 1), rate), cap, model)
        cases.append(Case(name, EngineSetup(cap, budget, seqs, model=model), rows, what))
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=2, help="draft tokens per step")
    ap.add_argument("--acceptance", type=float, default=0.7, help="constant acceptance rate per draft token")
    ap.add_argument("--method", default="ngram", choices=["ngram", "eagle", "eagle3", "mtp"],
                    help="SpeculativeConfig.method (eagle/eagle3/mtp: see _speculative)")
    ap.add_argument("--gamma", type=float, default=0.5,
                    help="linear's spec_gamma (ms per draft token per decode) on both sides, eagle/eagle3/mtp")
    ap.add_argument("--legacy-hashes", action="store_true",
                    help="eagle/eagle3/mtp with vLLM's disable_lookahead_block_hashes and disable_eagle_block_drop")
    ap.add_argument("--hash-rule", default="lookahead", choices=["lookahead", "drop"],
                    help="eagle/eagle3/mtp: drop = vLLM's disable_lookahead_block_hashes, dynlab's --spec-hash-rule drop "
                         "(traces on chunked-local models left out: vLLM refuses the drop there)")
    ap.add_argument("--only", default=None, help="comma list of trace names (default: all)")
    args = ap.parse_args()
    _check_vllm()
    cases = all_cases() + spec_cases() + hybrid_cases()
    if args.only:
        cases = [c for c in cases if c.name in args.only.split(",")]
    if args.hash_rule == "drop":
        cases = [c for c in cases if c.setup.model != HYBRID_MODELS["llama4"]]
    gamma = "" if args.method == "ngram" else f", spec_gamma {args.gamma} ms"
    rule = " (legacy hashes)" if args.legacy_hashes else " (hash rule drop)" if args.hash_rule == "drop" else ""
    print(f"K = {args.k}, acceptance {args.acceptance} per token (expected draws){gamma}, "
          f"vLLM 0.33 {args.method}{rule} at its defaults")
    print(f"{'trace':<22} {'requests':>8} {'identical':>9} {'TTFT':>5} {'E2E':>5} {'preempt':>7} {'hits':>5} "
          f"{'worst E2E ms':>12} {'preemptions d/v':>15}")
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            path = os.path.join(tmp, f"{case.name}.jsonl")
            case.write(path)
            ours = run_dynlab_spec(case.setup, path, args.k, args.acceptance, args.method, args.gamma, args.hash_rule)
            theirs = run_vllm_spec(case.setup, case.rows, args.k, args.acceptance, args.method, args.gamma,
                                   args.legacy_hashes, args.hash_rule)
            c = compare(ours, theirs)
            same = c["identical"]
            print(f"{case.name:<22} {c['requests']:>8} {same['all']:>9} {same['ttft']:>5} {same['e2e']:>5} "
                  f"{same['preemptions']:>7} {same['hit_tokens']:>5} {c['worst_ms']['e2e']:>12.3f} "
                  f"{'%d/%d' % tuple(c['preemptions']):>15}", flush=True)

if __name__ == "__main__":
    main()
