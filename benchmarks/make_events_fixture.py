"""Write the recorded-KV-event fixtures: dynlab/data/fixtures/kv_events.msgpack and kv_events.jsonl.

A small, hand-countable stream in vLLM's ``KVEventBatch`` layout (framing: see
:mod:`dynlab.routing.events_io` and docs/events.md), hashed with ``--hash dynamo`` at 4 tokens
per block. Worker 0 (dp_rank 0), one batch each:

0. stores prompt A (3 blocks, from the root);
1. stores A's 4th block, parent A[2];
2. stores the same tokens as A[0:2] under LoRA adapter "X" (other names: 2 new blocks);
3. stores A[0:2] again (a second physical copy, as vLLM's pool may hold);
4. removes A[0] once (one copy stays: A[0] is still held);
5. stores a block hashed at 64 tokens (refused: block size);
6. stores a block under a parent it never stored (refused: unknown parent).

Worker 1 (dp_rank 1): stores prompt B (2 blocks), clears everything, stores B[0], removes B[0].

So worker 0 ends holding 6 blocks (A[0..3], 2 LoRA blocks) after 4 applied stores, 1 removal
and 2 refusals; worker 1 holds 0 after 2 stores, 1 removal, 1 clear.

    python benchmarks/make_events_fixture.py [--out dynlab/data/fixtures]
"""
from __future__ import annotations

import argparse
import os

from dynlab import block_hashes
from dynlab.atomic import replace_file
from dynlab.routing.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEventBatch
from dynlab.routing.events_io import frame, json_line

BS = 4


def stream() -> list[KvEventBatch]:
    a_tokens = list(range(100, 116))
    a = block_hashes(a_tokens, BS, scheme="dynamo")
    lora = block_hashes(a_tokens[:8], BS, scheme="dynamo", lora_name="X")
    big = block_hashes(list(range(64)), 64, scheme="dynamo")
    b_tokens = list(range(500, 508))
    b = block_hashes(b_tokens, BS, scheme="dynamo")
    w0 = [
        [BlockStored(0, tuple(a[:3]), None, tuple(a_tokens[:12]), BS)],
        [BlockStored(0, (a[3],), a[2], tuple(a_tokens[12:16]), BS)],
        [BlockStored(0, tuple(lora), None, tuple(a_tokens[:8]), BS, "X")],
        [BlockStored(0, tuple(a[:2]), None, tuple(a_tokens[:8]), BS)],
        [BlockRemoved(0, (a[0],))],
        [BlockStored(0, tuple(big), None, tuple(range(64)), 64)],
        [BlockStored(0, (12345,), 67890, (1, 2, 3, 4), BS)],
    ]
    w1 = [
        [BlockStored(1, tuple(b), None, tuple(b_tokens), BS)],
        [AllBlocksCleared(1)],
        [BlockStored(1, (b[0],), None, tuple(b_tokens[:4]), BS)],
        [BlockRemoved(1, (b[0],))],
    ]
    out = []
    for w, steps in ((0, w0), (1, w1)):
        for seq, events in enumerate(steps):
            out.append(KvEventBatch(1000.0 + 0.01 * seq + w, tuple(events), seq, w))
    out.sort(key=lambda batch: (batch.ts, batch.dp_rank))  # interleaved by time, as a recorder sees them
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "dynlab", "data", "fixtures"))
    args = parser.parse_args()
    batches = stream()

    def write_bin(name):
        with open(name, "wb") as fh:
            fh.write(b"".join(frame(b) for b in batches))

    def write_json(name):
        with open(name, "w", encoding="utf-8") as fh:
            fh.write("".join(json_line(b) + "\n" for b in batches))

    replace_file(os.path.join(args.out, "kv_events.msgpack"), write_bin)
    replace_file(os.path.join(args.out, "kv_events.jsonl"), write_json)
    print(f"wrote {len(batches)} batches to {args.out}/kv_events.msgpack and kv_events.jsonl")


if __name__ == "__main__":
    main()
