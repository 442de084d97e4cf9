"""DeepSeek-V3's step times op by op: aiconfigurator's per-op latencies beside the roofline's terms.

    pip install -e ".[aiconfigurator]"   # Python 3.11+
    python benchmarks/aic_breakdown.py [--ep 8] [--kernels]

For DeepSeek-V3 on 8 x H200 at tp 8 (``--ep 8``: experts whole over 8 GPUs), one row per step (prefills
of 128-8,192 tokens, decodes of 1-256 requests): aiconfigurator-core's per-op latencies in ms
(``EngineHandle.run_static_per_op`` for a prefill, ``decode_step_per_op`` for a decode; they add up to
the step time ``fidelity_latency.py`` compares) grouped as the MLA module, MoE (router and routed
experts; in a decode also the shared experts, which it overlaps with them), the shared expert's GEMMs,
communication (all-reduces, dispatch) and the rest (add + RMSNorm, embedding, logits); then the
roofline's step (server terms off), its ``max(compute, memory)`` with the non-expert and expert compute
and the memory, its communication with ``layer_us``, and its kernel floors
(:func:`dynlab_builtins.latency_roofline.kernel_floors`). ``--kernels`` prints the two aiconfigurator
tables the floors come from instead: the vLLM MLA module at 1-2,048 tokens and the GEMMs of
DeepSeek-V3's shapes in bf16 and fp8_block at 1-8,192 rows (us). docs/latency.md quotes both.
"""
from __future__ import annotations

import argparse
import logging
import warnings

from dynlab.latency.base import StepBatch
from dynlab.latency.grid import build_latency_model, hardware_for
from dynlab.latency.overheads import SERVER_TERMS_OFF

GROUPS = {"mla_block": "mla", "moe": "moe", "moe_overlap": "moe", "router_gemm": "moe",
          "shared_gate_up_gemm": "shared", "shared_ffn2_gemm": "shared", "shared_act_gate": "shared",
          "moe_pre_dispatch": "comm", "moe_post_dispatch": "comm", "tp_allreduce": "comm"}
GEMM_SHAPES = ((512, 7168), (7168, 256), (2112, 7168), (3072, 1536), (7168, 2048), (4096, 4096))


def _grouped(ops) -> dict:
    out = {}
    for name, ms, *_ in ops:
        key = GROUPS.get(name.replace("context_", "").replace("generation_", ""), "other")
        out[key] = out.get(key, 0.0) + ms
    return out


def breakdown(ep: int) -> None:
    from aiconfigurator_core.sdk.engine import EngineHandle

    moe = {"moe_tp_size": 1, "moe_ep_size": ep} if ep > 1 else {"moe_tp_size": 8, "moe_ep_size": 1}
    aic = EngineHandle.compile("deepseek-ai/DeepSeek-V3", "h200_sxm", "vllm", backend_version="0.24.0", tp_size=8, **moe)
    roof = build_latency_model("roofline", hardware_for("deepseek-v3", "h200", 8, ep=ep), SERVER_TERMS_OFF["roofline"])
    terms = roof._terms  # the roofline's own parts, to show them side by side
    print("| step | aiconfigurator | MLA | MoE | shared | comm | other | roofline | max | [non-expert, expert, memory]"
          " | comm + layer_us | floors | error |\n|" + "---|" * 13)
    rows = [(f"prefill {t:,}", StepBatch((t,), (0,), 0, 0),
             lambda t=t: aic.run_static_per_op(batch_size=1, isl=t, osl=1, prefix=0)[0]) for t in (128, 512, 2048, 8192)]
    rows += [(f"decode {b} x {c:,}", StepBatch((), (), b, b * c), lambda b=b, c=c: aic.decode_step_per_op(b, c, 2))
             for b, c in ((1, 2048), (16, 2048), (64, 2048), (256, 2048), (256, 32768))]
    for label, batch, ops in rows:
        g = _grouped(ops())
        truth = sum(g.values())
        tokens = sum(batch.prefill_tokens) + batch.decode_requests
        pair_ms, _ = terms._attention(batch.prefill_tokens, batch.prefill_context, batch.decode_requests,
                                      batch.decode_context)
        compute, memory, comm = terms.parts(batch)
        floors = terms._floors[tokens > 256]
        step = roof.step_ms(batch)
        print(f"| {label} | {truth:.1f} | " + " | ".join(f"{g.get(k, 0.0):.1f}" for k in ("mla", "moe", "shared", "comm", "other"))
              + f" | {step:.1f} | {max(compute, memory):.1f} | [{terms._token * tokens + pair_ms:.1f}, "
              f"{terms._expert_token * tokens:.1f}, {memory:.1f}] | {comm - floors:.1f} | {floors:.1f} | "
              f"{100 * (step / truth - 1):+.1f} % |")


def kernels() -> None:
    from aiconfigurator_core.sdk import common, operations as ops
    from aiconfigurator_core.sdk.engine import EngineHandle, build_ops_json
    from aiconfigurator_core.sdk.perf_database import get_database

    handle = EngineHandle.for_database(get_database("h200_sxm", "vllm", "0.24.0"))

    def us(op, rows, context, s=None):
        batch = 1 if context else rows
        out = handle.evaluate_ops_json(build_ops_json([op]), batch_size=batch, s=s or rows, x=rows, is_context=context)
        return 1000 * out[0][1]

    tokens = (1, 16, 128, 512, 2048)
    print("MLA module, 16 heads per GPU (us) at", ", ".join(map(str, tokens)), "tokens")
    for quant in ("fp8_block", "bfloat16"):
        for context in (True, False):
            op = ops.MLAModule("mla", 1, context, 16, common.KVCacheQuantMode.bfloat16, common.FMHAQuantMode.bfloat16,
                               getattr(common.GEMMQuantMode, quant), native_num_heads=128)
            cells = [us(op, t, context, s=None if context else 2048) for t in tokens]
            print(f"  {quant:9s} {'prefill' if context else 'decode':7s} " + " ".join(f"{c:7.1f}" for c in cells))
    rows = (1, 16, 128, 512, 2048, 8192)
    print("GEMM N x K (us) at", ", ".join(map(str, rows)), "rows")
    for quant in ("bfloat16", "fp8_block"):
        for n, k in GEMM_SHAPES:
            cells = [us(ops.GEMM("gemm", 1, n, k, getattr(common.GEMMQuantMode, quant)), m, True) for m in rows]
            print(f"  {quant:9s} {n:5d} x {k:5d} " + " ".join(f"{c:7.1f}" for c in cells))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ep", type=int, default=1, choices=(1, 8), help="expert parallelism (1: experts split tp 8)")
    parser.add_argument("--kernels", action="store_true", help="print the MLA module and GEMM tables instead")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    kernels() if args.kernels else breakdown(args.ep)


if __name__ == "__main__":
    main()
