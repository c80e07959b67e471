#!/usr/bin/env python3
"""What a block costs by how its list describes it (issue 46): a 4096-block pull where the
peer's list is uniform blocks, one strided run, or 4096 arbitrary entries, same bytes.

Two agents on this machine (tcp over loopback). Prefill's cache is one tensor in layout
(blocks, heads, tokens, dim), 4096 blocks of 8 heads x 2 KiB; a decode rank at twice the
TP reads heads [4, 8) of every block (8 KiB a block, 32 MiB in all) into its own uniform
8 KiB blocks. Prefill exports that slice three ways:
  uniform  - a second tensor whose 8 KiB blocks lie back to back (the same bytes, no slice:
             the baseline a list of one extent gives);
  strided  - one run: base 4 heads, stride the whole block, 4096 blocks (prepare_strided);
  entries  - 4096 entries (tensor, offset, 8 KiB), one per block (prepare_entries).
For each: prepare (Python + agent), the first pull (the peer answers ResolveBlocks: 1 or
4096 extents), the time from read_blocks to its handle (Python + agent validation and
planning 4096 ops), and the pull to its end, medians over REPS alternating rounds; and the
Python part of starting a 4096-pair move (index lists to arrays).

Run: PYTHONPATH=<build>/python FERRYD=<build>/server/ferryd python3 bench/block_lists_bench.py
"""
import statistics
import sys
import time

import numpy as np
import torch

import ferry
from ferry.blocks import check_ids

BLOCKS, HEADS = 4096, 8
# One head's bytes in a block: 2 KiB (16 tokens x 64 dims x fp16), and 32 B, where the bytes
# cost next to nothing and what is left is the cost of describing and moving 4096 blocks.
HEAD_BYTES = (2 << 10, 32)
REPS = 9


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main():
    with ferry.launch.agents(["prefill", "decode"], host_pool="64MiB") as nodes:
        p = ferry.Client(nodes["prefill"].socket)
        d = ferry.Client(nodes["decode"].socket)
        for head_bytes in HEAD_BYTES:
            run(p, d, head_bytes)
        p.close()
        d.close()
    return 0


def run(p, d, head_bytes):
    block = HEADS * head_bytes
    piece = block // 2  # a decode rank reads heads [4, 8)
    tag = f"-{head_bytes}"
    cache = torch.randint(0, 255, (BLOCKS * block,), dtype=torch.uint8).share_memory_()
    same = torch.empty(BLOCKS * piece, dtype=torch.uint8).share_memory_()
    same.view(BLOCKS, piece)[:] = cache.view(BLOCKS, block)[:, piece:]
    dst = torch.zeros(BLOCKS * piece, dtype=torch.uint8).share_memory_()
    reg = p.register(cache, name="cache" + tag)
    reg_same = p.register(same, name="same" + tag)
    mine = d.prepare_blocks([dst], piece)
    prepare = {
        "uniform": lambda: p.prepare_blocks([reg_same], piece, name="uniform" + tag),
        "strided": lambda: p.prepare_strided([(reg, piece, block, BLOCKS, piece)],
                                             name="strided" + tag),
        "entries": lambda: p.prepare_entries([(reg, b * block + piece, piece)
                                              for b in range(BLOCKS)], name="entries" + tag),
    }
    ids = list(range(BLOCKS))
    rng = np.random.default_rng(1)
    remote = [int(i) for i in rng.permutation(BLOCKS)]
    lists, figures = {}, {}
    for kind, make in prepare.items():
        took, lists[kind] = timed(make)
        first, _ = timed(lambda: d.read_blocks("prefill", kind + tag, remote, mine, ids,
                                               timeout=30).wait(30))
        figures[kind] = {"prepare": took, "first": first, "start": [], "pull": []}
        expect = cache.view(BLOCKS, block)[remote, piece:].reshape(-1)
        assert torch.equal(dst, expect), kind
        dst.zero_()
    for _ in range(REPS):  # alternating, so that all see the same machine
        for kind in prepare:
            start, h = timed(lambda: d.read_blocks("prefill", kind + tag, remote, mine, ids,
                                                   timeout=30))
            h.wait(30)
            pull, _ = timed(lambda: d.read_blocks("prefill", kind + tag, remote, mine, ids,
                                                  timeout=30, wait=True).wait(0))
            figures[kind]["start"].append(start)
            figures[kind]["pull"].append(pull)
    python_part = statistics.median(
        timed(lambda: (check_ids(remote, "r"), check_ids(ids, "l")))[0] for _ in range(REPS))
    print(f"\n{BLOCKS} blocks of {piece} B ({BLOCKS * piece / 2**20:g} MiB), decode reads "
          f"heads [4, 8) of every prefill block; medians of {REPS}")
    print(f"{'list':8} {'prepare ms':>10} {'first pull ms':>13} {'to handle ms':>12} "
          f"{'us/pair':>8} {'pull ms':>8} {'us/pair':>8}")
    for kind, f in figures.items():
        s, w = statistics.median(f["start"]), statistics.median(f["pull"])
        print(f"{kind:8} {f['prepare'] * 1e3:10.2f} {f['first'] * 1e3:13.2f} {s * 1e3:12.2f} "
              f"{s / BLOCKS * 1e6:8.3f} {w * 1e3:8.2f} {w / BLOCKS * 1e6:8.3f}")
    print(f"of the time to the handle, Python (index lists to arrays): "
          f"{python_part * 1e3:.2f} ms for {BLOCKS} pairs")
    for bl in list(lists.values()) + [mine]:
        bl.release()
    p.deregister(reg)
    p.deregister(reg_same)


if __name__ == "__main__":
    sys.exit(main())
