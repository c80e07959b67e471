#!/usr/bin/env python3
"""One request's KV pull with read_blocks against the same bytes as one op, same run, and
what a read_blocks call costs in Python.

Two agents on this machine (tcp over loopback), each process's KV cache its own numpy over
shared memory, registered through prepare_blocks: 16 layers x {K, V} tensors of 128 blocks
of 32 KiB. One request = 64 scattered blocks of every tensor (2048 blocks, 64 MiB), pulled
with ONE read_blocks call; the baseline pulls the same 64 MiB as one block of a second list
over one contiguous 64 MiB region, and the request pull again with verify=True (both agents
checksum every block). Then: the time from calling read_blocks with 4096 pairs
to holding its handle, and the part of it spent in Python (index checks and conversion)
rather than in the agent (validation, planning 4096 ops; the peer's ResolveBlocks answer is
kept from the first pull). Last, one block at a time: read_blocks then Handle.wait (two
calls to the agent) against read_blocks(wait=True) (one), p50 and p99.

Run: PYTHONPATH=<build>/python FERRYD=<build>/server/ferryd python3 bench/kv_pull_bench.py
"""
import statistics
import sys
import time
from multiprocessing import shared_memory

import numpy as np

import ferry
from ferry.blocks import check_ids

TENSORS, BLOCKS, BLOCK = 32, 128, 32 << 10
PER_REQUEST = 64
REPS = 7
SMALL_REPS = 300
_keep = []


def shared(nbytes):
    shm = shared_memory.SharedMemory(create=True, size=nbytes)
    shm.unlink()
    _keep.append(shm)
    return np.ndarray((nbytes,), dtype=np.uint8, buffer=shm.buf)


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    with ferry.launch.agents(["prefill", "decode"], host_pool="256MiB") as nodes:
        p = ferry.Client(nodes["prefill"].socket)
        d = ferry.Client(nodes["decode"].socket)
        src = [shared(BLOCKS * BLOCK) for _ in range(TENSORS)]
        for i, s in enumerate(src):
            s[:] = i
        dst = [shared(BLOCKS * BLOCK) for _ in range(TENSORS)]
        kv = p.prepare_blocks(src, BLOCK, name="kv")
        mine = d.prepare_blocks(dst, BLOCK)
        whole_src = shared(PER_REQUEST * TENSORS * BLOCK)
        whole_dst = shared(PER_REQUEST * TENSORS * BLOCK)
        one = p.prepare_blocks([whole_src], whole_src.size, name="one-op")
        one_mine = d.prepare_blocks([whole_dst], whole_dst.size)

        rng = np.random.default_rng(1)
        remote = [t * BLOCKS + int(b) for t in range(TENSORS)
                  for b in rng.choice(BLOCKS, PER_REQUEST, replace=False)]
        local = [t * BLOCKS + int(b) for t in range(TENSORS)
                 for b in rng.choice(BLOCKS, PER_REQUEST, replace=False)]
        nbytes = len(remote) * BLOCK

        def pull_blocks():
            d.read_blocks("prefill", "kv", remote, mine, local).wait(60)

        def pull_one():
            d.read_blocks("prefill", "one-op", [0], one_mine, [0]).wait(60)

        def pull_verified():
            d.read_blocks("prefill", "kv", remote, mine, local, verify=True).wait(60)

        pull_blocks(), pull_one()  # connections and kept answers, once
        blocks_s, one_s, verified_s = [], [], []
        for _ in range(REPS):  # alternating, so that all see the same machine
            blocks_s.append(timed(pull_blocks))
            one_s.append(timed(pull_one))
            verified_s.append(timed(pull_verified))
        b, o = statistics.median(blocks_s), statistics.median(one_s)
        v = statistics.median(verified_s)
        print(f"request pull: {len(remote)} blocks of {BLOCK >> 10} KiB "
              f"({nbytes >> 20} MiB) in one read_blocks: median {b * 1e3:.1f} ms "
              f"({nbytes / b / 1e9:.2f} GB/s)")
        print(f"same bytes as one op: median {o * 1e3:.1f} ms ({nbytes / o / 1e9:.2f} GB/s); "
              f"blocks / one op = {o / b:.2f} of its throughput")
        print(f"the request pull with verify=True (CRC32C of every block on both agents): "
              f"median {v * 1e3:.1f} ms, {v / b:.2f} x the unverified pull")

        # A read_blocks call of 4096 pairs: time to the handle, and the Python part of it.
        r4 = [t * BLOCKS + j for t in range(TENSORS) for j in range(BLOCKS)]
        l4 = list(reversed(r4))
        to_handle, python_part = [], []
        for _ in range(REPS):
            start = time.perf_counter()
            h = d.read_blocks("prefill", "kv", r4, mine, l4)
            to_handle.append(time.perf_counter() - start)
            h.wait(60)
            python_part.append(timed(lambda: (check_ids(r4, "r"), check_ids(l4, "l"))))
        th, py = statistics.median(to_handle), statistics.median(python_part)
        print(f"read_blocks call of {len(r4)} pairs: {th * 1e3:.2f} ms to the handle, of which "
              f"{py * 1e3:.2f} ms in Python (index lists to arrays), the rest the agent "
              f"(validation, planning {len(r4)} ops)")
        # One block at a time, as a decode step pulls the newest block of a layer: read_blocks
        # then wait on its handle (two calls to the agent), and read_blocks(wait=True) (one),
        # alternating so that both see the same machine.
        two_calls, one_call = [], []
        for i in range(SMALL_REPS):
            j = (i * 7) % BLOCKS
            two_calls.append(timed(lambda: d.read_blocks("prefill", "kv", [j], mine, [j]).wait(60)))
            one_call.append(timed(lambda: d.read_blocks("prefill", "kv", [j], mine, [j],
                                                        wait=True).wait(0)))
        for label, t in (("read_blocks + Handle.wait", two_calls),
                         ("read_blocks(wait=True)", one_call)):
            t.sort()
            print(f"one {BLOCK >> 10} KiB block, {label} ({SMALL_REPS} in a row): "
                  f"p50 {t[len(t) // 2] * 1e6:.0f} us, p99 {t[len(t) * 99 // 100] * 1e6:.0f} us")
        for bl in (kv, mine, one, one_mine):
            bl.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
