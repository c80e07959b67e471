#!/usr/bin/env python3
"""Disaggregated prefill -> decode with paged KV caches the processes allocate themselves.

Each process has its own agent and its own paged KV cache: 16 layers x {K, V} tensors of
shape [blocks, 16 tokens, 8 heads, 128] in bf16 (uint16 here), allocated by the process
(torch with share_memory_() when torch is installed, else numpy over shared memory; with
--sim-gpu, on a simulated GPU through ferry.empty(device="cuda:0")) and registered with
ferry as one block list. Prefill exports its list as "kv". For each request it fills the
request's (scattered) blocks in every layer and sends decode the block ids; decode pulls
those blocks of all 32 tensors into blocks of its own with ONE read_blocks call carrying a
notification, verifies every byte, and frees its copy; prefill frees the request's blocks
when the notification arrives and reuses them for the next requests (there is room for
only WAVE requests at once). Several requests are in flight at any time.

Run: PYTHONPATH=<build>/python FERRYD=<build>/server/ferryd python3 \
         examples/disagg_prefill_decode.py [--sim-gpu]
"""
import subprocess
import sys
import time

import numpy as np

import ferry

LAYERS, TOKENS, HEADS, DIM = 16, 16, 8, 128
BLOCK_BYTES = TOKENS * HEADS * DIM * 2           # one block of one tensor: 32 KiB of bf16
NUM_BLOCKS = 64                                   # per tensor, in each process
PER_REQUEST = 16                                  # blocks a request holds
WAVE = NUM_BLOCKS // PER_REQUEST                  # requests that fit at once
REQUESTS = 3 * WAVE                               # so blocks are freed and reused twice
TENSORS = 2 * LAYERS                              # K and V of each layer
_SHARED = []                                      # numpy's shared memory, kept mapped


def kv_cache(c, sim_gpu, name=""):
    """The process's own KV cache: 32 tensors of [NUM_BLOCKS, 16, 8, 128] bf16. `name`: the
    list it will be exported as (ferry buffers are named for it; memory the process
    allocated is named when prepare_blocks registers it)."""
    shape = (NUM_BLOCKS, TOKENS, HEADS, DIM)
    if sim_gpu:
        return [ferry.empty(shape, "bfloat16", device="cuda:0", client=c,
                            name=f"{name}.{t}" if name else "") for t in range(TENSORS)]
    try:
        import torch
        return [torch.empty(shape, dtype=torch.bfloat16).share_memory_() for _ in range(TENSORS)]
    except ImportError:
        from multiprocessing import shared_memory
        caches = []
        for _ in range(TENSORS):
            shm = shared_memory.SharedMemory(create=True, size=NUM_BLOCKS * BLOCK_BYTES)
            shm.unlink()  # the mapping and its descriptor stay; nothing is left in /dev/shm
            _SHARED.append(shm)
            caches.append(np.ndarray(shape, dtype=np.uint16, buffer=shm.buf))
        return caches


def as_bytes(t):
    """A uint8 numpy view of a tensor's bytes (torch bf16 or numpy)."""
    if hasattr(t, "numpy") and type(t).__module__.startswith("torch"):
        import torch
        return t.view(torch.uint8).numpy().reshape(NUM_BLOCKS, BLOCK_BYTES)
    return np.asarray(t).view(np.uint8).reshape(NUM_BLOCKS, BLOCK_BYTES)


def content(req, tensor, j):
    """What prefill computes for block j of a request in one tensor: deterministic bytes."""
    return np.random.default_rng((req, tensor, j)).integers(0, 256, BLOCK_BYTES, dtype=np.uint8)


def prefill(socket, sim_gpu):
    c = ferry.Client(socket)
    caches = kv_cache(c, sim_gpu, name="kv")
    views = [as_bytes(t) for t in caches]
    kv = c.prepare_blocks(caches, BLOCK_BYTES, name="kv")   # exported: decode pulls by index
    assert len(kv) == TENSORS * NUM_BLOCKS and kv.blocks_per_tensor == NUM_BLOCKS
    free = list(np.random.default_rng(0).permutation(NUM_BLOCKS))
    held = {}  # request -> its block ids, until decode says it pulled them
    pulled = c.notifications(prefix="req-", timeout=120)
    for req in range(REQUESTS):
        while len(free) < PER_REQUEST:                       # full: wait for a pull
            n = next(pulled)
            done = int(n.name.split("-")[1].split()[0])
            free.extend(held.pop(done))
        ids = [free.pop() for _ in range(PER_REQUEST)]
        held[req] = ids
        for t in range(TENSORS):
            for j, b in enumerate(ids):
                views[t][b] = content(req, t, j)                # "the layer's KV, computed"
        c.send(np.array(ids, dtype=np.int64), "decode", f"req-{req}/blocks", timeout=60)
    while held:
        n = next(pulled)
        held.pop(int(n.name.split("-")[1].split()[0]))
    pulled.close()  # ends the stream now, not in the interpreter's teardown
    print(f"prefill: {REQUESTS} requests of {PER_REQUEST} blocks x {TENSORS} tensors served, "
          f"every block freed on decode's notification", flush=True)


def decode(socket, sim_gpu):
    c = ferry.Client(socket)
    caches = kv_cache(c, sim_gpu)
    views = [as_bytes(t) for t in caches]
    mine = c.prepare_blocks(caches, BLOCK_BYTES)
    free = list(range(NUM_BLOCKS))
    in_flight = {}  # request -> (handle, local ids)
    pulled_bytes, started = 0, time.monotonic()

    def finish(req):
        handle, local = in_flight.pop(req)
        handle.wait(60)
        for t in range(TENSORS):
            for j, b in enumerate(local):
                if not np.array_equal(views[t][b], content(req, t, j)):
                    raise AssertionError(f"request {req} tensor {t} block {j} differs")
        free.extend(local)
        return handle.bytes

    for req in range(REQUESTS):
        remote = c.recv("prefill", f"req-{req}/blocks", dtype="int64", timeout=60)
        if len(free) < PER_REQUEST:
            pulled_bytes += finish(min(in_flight))
        local = [free.pop() for _ in range(PER_REQUEST)]
        # Every layer's K and V in one call: block j of tensor t is t * NUM_BLOCKS + j.
        remote_ids = [t * NUM_BLOCKS + int(b) for t in range(TENSORS) for b in remote]
        local_ids = [t * NUM_BLOCKS + b for t in range(TENSORS) for b in local]
        # Odd requests are also checked by both agents (CRC32C of every block) before the
        # handle completes; the bytes are compared below either way.
        handle = c.read_blocks("prefill", "kv", remote_ids, mine, local_ids,
                               notify=f"req-{req} pulled", verify=req % 2 == 1)
        in_flight[req] = (handle, local)
    while in_flight:
        pulled_bytes += finish(min(in_flight))
    seconds = time.monotonic() - started
    print(f"decode: {REQUESTS} requests pulled and verified, {pulled_bytes >> 20} MiB in "
          f"{seconds:.2f} s, up to {WAVE} in flight", flush=True)


def main(sim_gpu):
    extra = "gpu:\n  backend: sim\n  count: 1\n  pool_size: 96MiB\n" if sim_gpu else ""
    with ferry.launch.agents(["prefill", "decode"], host_pool="256MiB", extra=extra) as nodes:
        args = ["--sim-gpu"] if sim_gpu else []
        procs = [subprocess.Popen([sys.executable, __file__, role, nodes[role].socket] + args)
                 for role in ("decode", "prefill")]
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=180))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        if any(codes):
            print(f"disagg_prefill_decode: failed (exit codes {codes})", file=sys.stderr)
            return 1
        print("disagg_prefill_decode: every request's blocks pulled, verified and freed"
              + (" (simulated GPUs)" if sim_gpu else ""))
        return 0


if __name__ == "__main__":
    sim = "--sim-gpu" in sys.argv
    argv = [a for a in sys.argv[1:] if a != "--sim-gpu"]
    if len(argv) == 2:
        {"decode": decode, "prefill": prefill}[argv[0]](argv[1], sim)
    else:
        sys.exit(main(sim))
