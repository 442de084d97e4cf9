"""A reply's token ids in a token trace (``output_tokens``): checked, and its blocks named like the prompt's.

vLLM 0.33.0 hashes every full block of a request, generated tokens included, with the chain its
prompt blocks use (``vllm/v1/core/kv_cache_utils.py``: the block hasher runs over the request's
``all_token_ids``). So a multi-turn conversation's next turn, whose prompt quotes the previous reply,
finds that reply's blocks in the prefix cache. A token trace that gives a row's ``output_tokens``
lets dynlab do the same: :func:`reply_names` continues the prompt's chain
(:func:`dynlab.routing.hashing.block_hashes`) over the reply, so a reply block's name equals the name
the same tokens get in a later prompt. Without ``output_tokens`` the blocks of generated tokens get
names of their own request only (:mod:`dynlab.kv.output_blocks`).

Only the full blocks of the first ``input + output - 1`` tokens are named: the last generated token's
KV is never computed (it is sampled by the request's last step), so its block is never cached, in
vLLM or here.
"""
from __future__ import annotations

from typing import Optional, Sequence

from dynlab.routing.hashing import block_hashes, lookahead_names

__all__ = ["check_output_tokens", "reply_names", "request_names"]

#: the token id range of each hash scheme (``--hash``): dynlab's signed 64-bit, Dynamo's u32
_RANGE = {"dynlab": (-(2**63), 2**63 - 1), "dynamo": (0, 2**32 - 1)}


def check_output_tokens(record: dict, scheme: str = "dynlab") -> tuple[Optional[list], Optional[int]]:
    """``(output_tokens or None, output_length or None)`` of a token-trace row ``record`` (a dict).

    ``output_tokens`` absent: ``(None, None)`` (the row's ``output_length`` rules, as before). Given, it
    must be a list of ints in the hash scheme's token range (``scheme``: ``dynlab`` signed 64-bit,
    ``dynamo`` unsigned 32-bit); ``output_length`` may then be omitted (it is ``len(output_tokens)``),
    and when given must equal that length. Raises ``ValueError`` with a one-line message (the reader
    adds ``FILE:LINE``).
    """
    if "output_tokens" not in record:
        return None, None
    out = record["output_tokens"]
    if not isinstance(out, list):
        raise ValueError(f"field 'output_tokens' must be a list of ints (the reply's token ids), got {out!r:.40}")
    lo, hi = _RANGE.get(scheme, _RANGE["dynlab"])
    for i, t in enumerate(out):
        if type(t) is not int:
            raise ValueError(f"output_tokens[{i}] must be an int, got {t!r:.40}")
        if not lo <= t <= hi:
            raise ValueError(f"output_tokens[{i}] is outside the token range of --hash {scheme} ({lo}..{hi}): {t}")
    if "output_length" in record:
        n = record["output_length"]
        if type(n) is int and n != len(out):
            raise ValueError(f"output_tokens holds {len(out)} ids, but output_length is {n}: give one per "
                             "generated token (or leave output_length out)")
    return out, len(out)


def reply_names(tokens: Sequence[int], output_tokens: Sequence[int], block: int, *, scheme: str = "dynlab",
                lora_name: Optional[str] = None, cache_salt: Optional[str] = None,
                lookahead: int = 0) -> tuple[list, tuple]:
    """``(prompt names, reply names)``: :func:`~dynlab.routing.hashing.block_hashes` of ``tokens`` (the
    prompt; ``len(tokens) // block`` names) and, continuing the same chain, the names of the full blocks
    past them among the first ``len(tokens) + len(output_tokens) - 1`` tokens of prompt + reply
    (``block`` tokens per block; a block may hold the prompt's last tokens and the reply's first).

    So ``prompt names + reply names == block_hashes(tokens + output_tokens[:-1])``: the names the
    same tokens get as a later request's prompt. ``lookahead`` (vLLM's ``num_hash_lookahead_tokens``,
    :func:`~dynlab.routing.hashing.lookahead_names`): each name covers that many tokens after its block
    too, and the prompt keeps ``(len(tokens) - lookahead) // block`` of them. Raises what ``block_hashes`` raises.
    """
    seq = list(tokens) + list(output_tokens[:-1])
    names = block_hashes(seq, block, scheme=scheme, lora_name=lora_name, cache_salt=cache_salt)
    if lookahead:  # EAGLE's hash lookahead: a block named with the tokens after it (the prompt's last: the reply's)
        names = lookahead_names(names, seq + list(output_tokens[-1:]), block, lookahead)
    n = max(0, (len(tokens) - lookahead) // block)
    return names[:n], tuple(names[n:])


def request_names(tokens: Sequence[int], output_tokens: Optional[Sequence[int]], block: int, *,
                  scheme: str = "dynlab", lora_name: Optional[str] = None, cache_salt: Optional[str] = None,
                  lookahead: int = 0) -> tuple[tuple, Optional[tuple]]:
    """``(prompt names, reply names or None)`` of a request whose prompt is ``tokens`` and whose reply's
    token ids are ``output_tokens`` (``None`` or empty: not known), as every token-reading trace names them.

    With a reply: :func:`reply_names` (the prompt's chain continued over it). Without: ``None`` for the
    reply and :func:`~dynlab.routing.hashing.block_hashes` of ``tokens`` (``len(tokens) // block``
    names), each covering the ``lookahead`` tokens after its block when ``lookahead`` > 0
    (:func:`~dynlab.routing.hashing.lookahead_names`, EAGLE's hash lookahead). Raises what
    ``block_hashes`` raises.
    """
    if output_tokens:
        names, replied = reply_names(tokens, output_tokens, block, scheme=scheme, lora_name=lora_name,
                                     cache_salt=cache_salt, lookahead=lookahead)
        return tuple(names), replied
    names = block_hashes(tokens, block, scheme=scheme, lora_name=lora_name, cache_salt=cache_salt)
    if lookahead:  # EAGLE's hash lookahead: a block named with the tokens after it
        names = lookahead_names(names, tokens, block, lookahead)
    return tuple(names), None
