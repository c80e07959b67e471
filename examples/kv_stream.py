#!/usr/bin/env python3
"""Prefill -> decode KV-cache stream. The decode process owns a named KV buffer and tells the
prefill process where each block of the request goes (a block table, sent as a tensor). The
prefill process writes each layer's blocks into it with one write_blocks call and a
notification "req-42/layer-N"; the decode process waits per layer and checks the contents,
which must be complete the moment the notification arrives.
Run: PYTHONPATH=<build>/python FERRYD=<build>/server/ferryd python3 examples/kv_stream.py
"""
import subprocess
import sys

import numpy as np

import ferry

LAYERS, BLOCKS, BLOCK_BYTES = 8, 64, 16 << 10
SLOTS = 2 * BLOCKS * LAYERS  # the decode KV buffer has room for twice the request
REQ = "req-42"


def layer_blocks(layer):
    """What prefill computes for a layer: BLOCKS blocks of deterministic bytes."""
    return np.random.default_rng(layer).integers(0, 256, BLOCKS * BLOCK_BYTES, dtype=np.uint8)


def decode(socket):
    c = ferry.Client(socket)
    kv = c.alloc(SLOTS * BLOCK_BYTES, name="kv-cache")
    table = c.empty((LAYERS, BLOCKS), "int64")
    table[:] = np.random.default_rng(7).permutation(SLOTS)[:LAYERS * BLOCKS].reshape(LAYERS, BLOCKS)
    c.send(table, "prefill", f"{REQ}/block-table", timeout=30)
    cache = kv.numpy("uint8")
    for layer in range(LAYERS):
        n = c.wait_notification(f"{REQ}/layer-{layer}", from_node="prefill", timeout=30)
        expect = layer_blocks(layer).reshape(BLOCKS, BLOCK_BYTES)
        for b, slot in enumerate(table[layer]):
            got = cache[slot * BLOCK_BYTES:(slot + 1) * BLOCK_BYTES]
            assert np.array_equal(got, expect[b]), f"layer {layer} block {b} incomplete at notify"
        print(f"decode: layer {layer}: {n.blocks} blocks, {n.bytes} bytes, verified", flush=True)
    print("decode: all layers verified", flush=True)


def prefill(socket):
    c = ferry.Client(socket)
    table = c.recv("decode", f"{REQ}/block-table", dtype="int64", shape=(LAYERS, BLOCKS), timeout=30)
    staging = c.alloc(BLOCKS * BLOCK_BYTES)
    for layer in range(LAYERS):
        staging.numpy("uint8")[:] = layer_blocks(layer)  # "the layer's KV, computed"
        blocks = np.stack([np.arange(BLOCKS) * BLOCK_BYTES, table[layer] * BLOCK_BYTES,
                           np.full(BLOCKS, BLOCK_BYTES)], axis=1)
        c.write_blocks(staging, "decode", "kv-cache", blocks, notify=f"{REQ}/layer-{layer}",
                       timeout=30)
    print(f"prefill: {LAYERS} layers x {BLOCKS} blocks written", flush=True)


def main():
    with ferry.launch.agents(["prefill", "decode"], host_pool="256MiB") as nodes:
        procs = [subprocess.Popen([sys.executable, __file__, role, nodes[role].socket])
                 for role in ("decode", "prefill")]
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=120))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        if any(codes):
            print(f"kv_stream: failed (exit codes {codes})", file=sys.stderr)
            return 1
        print("kv_stream: every layer complete when notified")
        return 0


if __name__ == "__main__":
    if len(sys.argv) == 3:
        {"decode": decode, "prefill": prefill}[sys.argv[1]](sys.argv[2])
    else:
        sys.exit(main())
