#!/usr/bin/env python3
"""One request's KV pull through ferry.vllm.FerryConnector, against the same bytes as one
op in the same run, and what the connector costs an engine step in Python (issue 46).

Geometry (a Llama-3-8B-like model): 32 layers, 8 KV heads of 128 dims, bfloat16, blocks of
16 tokens, so one block of one layer's K (or V) is 8 x 16 x 128 x 2 B = 32 KiB at TP 1. One
request is a 2048-token prompt, 128 blocks: 32 layers x {K, V} x 128 blocks = 8192 blocks,
256 MiB. Prefill holds them in 128 blocks picked at random out of its 160, decode pulls them
into 128 others of its 160.

Two agents on this machine (tcp over loopback, as tests/vllm starts them). Each engine is
its scheduler-side FerryConnector and one worker-side FerryConnector per TP rank, all in
this process, each rank with its own HND caches (torch CPU tensors after share_memory_(),
handed over as vLLM's permuted view; the ranks share the process's ferry client, where in
vLLM each rank is a process with its own), called in the order
vLLM's scheduler and model runner call them (tests/vllm/engine.py names the source):
prefill's request_finished hands out kv_transfer_params, decode's scheduler takes them
(on_new_request, get_num_new_matched_tokens, update_state_after_alloc,
build_connector_meta); then engine steps, each rank: bind_connector_metadata,
start_load_kv, wait_for_save, get_finished, get_block_ids_with_load_errors,
clear_connector_metadata, and a 1 ms sleep for the forward. Ranks run one after another
here; in vLLM each is its own process.

Per configuration (TP 1 -> 1 and TP 2 -> 4), ROUNDS rounds after one warm-up round (the
first pull, whose peer answers ResolveBlocks, is reported apart), alternating:
  pull     - from the step that starts the pull to the step whose get_finished reports it
             on every decode rank (every byte checked once, after the warm-up);
  one op   - Client.read of one registered 256 MiB region, the same bytes in one op;
  Python   - per step, the time inside connector calls on the slowest rank (what an engine
             step waits for): the step that starts the pull, the steps while it moves, the
             step that reports it; and prefill's steps (notification polls).
Then the cost of an empty poll_notifications (a prefill rank's own prefix).
Medians over the rounds and their spread (min..max).

Run: PYTHONPATH=<build>/python FERRYD=<build>/server/ferryd \\
     python3 bench/vllm_connector_bench.py [--rounds 3] [--json FILE]
"""
import argparse
import collections
import json
import os
import statistics
import sys
import time
import types

import numpy as np
import torch

import ferry
import ferry.launch
import ferry.vllm
from ferry.vllm import FerryConnector, KVConnectorRole

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "vllm"))
from engine import vllm_config  # noqa: E402  (the harness's stand-in config)

LAYERS, KV_HEADS, HEAD_SIZE, BLOCK_TOKENS = 32, 8, 128, 16
DTYPE = torch.bfloat16
NUM_BLOCKS, REQUEST_BLOCKS = 160, 128
FORWARD_S = 0.001
POLLS = 10000
CONFIGS = ((1, 1), (2, 4))
IN_READ_BLOCKS = [0.0]  # seconds inside Client.read_blocks since a rank's step began


def config(engine_id, tp, rank, socket):
    """The harness's stand-in VllmConfig (tests/vllm/engine.py), at the bench's geometry."""
    return vllm_config(engine_id, tp, rank, socket, layers=LAYERS, kv_heads=KV_HEADS,
                       head_size=HEAD_SIZE, block_size=BLOCK_TOKENS, dtype="bfloat16",
                       model="bench/llama-3-8b-like")


class Engine:
    """A scheduler-side connector and `tp` worker-side ones, each rank with its caches."""

    def __init__(self, engine_id, tp, socket, fill):
        self.tp, self.heads = tp, KV_HEADS // tp
        self.scheduler = FerryConnector(config(engine_id, tp, 0, socket),
                                        KVConnectorRole.SCHEDULER)
        self.workers, self.caches = [], []
        self.reported = collections.Counter()
        for rank in range(tp):
            layers = []
            for _ in range(LAYERS):  # HND: (K/V, block, head, token, dim)
                t = torch.empty(2, NUM_BLOCKS, self.heads, BLOCK_TOKENS, HEAD_SIZE,
                                dtype=DTYPE).share_memory_()
                bits = t.view(torch.int16)
                bits.copy_(torch.randint(-32768, 32767, bits.shape, dtype=torch.int16)
                           if fill else torch.zeros_like(bits))
                layers.append(t)
            w = FerryConnector(config(engine_id, tp, rank, socket), KVConnectorRole.WORKER)
            w.register_kv_caches({f"model.layers.{i}.self_attn": t.permute(0, 1, 3, 2, 4)
                                  for i, t in enumerate(layers)})
            self._time_read_blocks(w.connector_worker)
            self.workers.append(w)
            self.caches.append(layers)
        self.scheduler.set_xfer_handshake_metadata(
            {r: w.get_handshake_metadata() for r, w in enumerate(self.workers)})

    @staticmethod
    def _time_read_blocks(worker):
        """Counts the seconds spent inside Client.read_blocks (ferry's Python and the agent
        validating and planning the move) apart from the connector's own, in
        IN_READ_BLOCKS. The ranks of a process share one client (ferry.vllm.client), kept
        from one configuration to the next: it is wrapped once."""
        client = worker.client
        if getattr(client, "_bench_timed", False):
            return
        client._bench_timed = True
        inner = client.read_blocks

        def timed_read_blocks(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                IN_READ_BLOCKS[0] += time.perf_counter() - start

        client.read_blocks = timed_read_blocks

    def step(self, meta, finished_req_ids):
        """Every rank's connector calls of one engine step, in the model runner's order;
        returns (requests every rank finished sending, ... receiving, load errors, the
        (seconds inside connector calls, of which inside read_blocks) of every rank)."""
        errors, ranks = set(), []
        for w in self.workers:
            start = time.perf_counter()
            IN_READ_BLOCKS[0] = 0.0
            w.bind_connector_metadata(meta)
            w.start_load_kv(None)
            w.wait_for_save()
            s, r = w.get_finished(finished_req_ids)
            errors |= w.get_block_ids_with_load_errors()
            w.clear_connector_metadata()
            ranks.append((time.perf_counter() - start, IN_READ_BLOCKS[0]))
            self.reported.update(("s", rid) for rid in s or ())
            self.reported.update(("r", rid) for rid in r or ())
        # KVOutputAggregator: a request is finished once every rank said so, in any step.
        done = {key for key, n in self.reported.items() if n == self.tp}
        for key in done:
            del self.reported[key]
        sending = {rid for kind, rid in done if kind == "s"}
        recving = {rid for kind, rid in done if kind == "r"}
        self.scheduler.update_connector_output(types.SimpleNamespace(
            finished_sending=sending, finished_recving=recving))
        return sending, recving, errors, ranks

    def close(self):
        for w in self.workers:
            w.shutdown()


def request(rid, params, status="RUNNING"):
    return types.SimpleNamespace(
        request_id=rid, prompt_token_ids=list(range(REQUEST_BLOCKS * BLOCK_TOKENS)),
        kv_transfer_params=params, status=types.SimpleNamespace(name=status))


class Blocks:
    """KVCacheBlocks' face: the request's blocks, all newly allocated (no prefix hit)."""

    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (list(self.ids),)

    def get_unhashed_block_ids(self):
        return list(self.ids)


def one_request(prefill, decode, rid, p_blocks, d_blocks):
    """Prefill finishes `rid`, the proxy hands its params to decode, decode pulls; both
    engines step until decode has it and prefill freed it. Returns the figures."""
    done, params = prefill.scheduler.request_finished(
        request(rid, {"do_remote_decode": True}, "FINISHED_LENGTH_CAPPED"), [list(p_blocks)])
    assert done and params, "prefill did not keep the request's blocks"
    p_meta = prefill.scheduler.build_connector_meta(None)
    p_finished = {rid}  # scheduler_output.finished_req_ids of prefill's next step

    r = request("d-" + rid, dict(params))
    decode.scheduler.on_new_request(r)
    ext, load_async = decode.scheduler.get_num_new_matched_tokens(r, 0)
    assert load_async and ext == len(r.prompt_token_ids), (ext, load_async)
    decode.scheduler.update_state_after_alloc(r, Blocks(d_blocks), ext)
    d_meta = decode.scheduler.build_connector_meta(None)

    steps, start = [], time.perf_counter()
    pulled = freed = None
    prefill_steps = []
    while pulled is None or freed is None:
        if pulled is None:
            _, recving, errors, ranks = decode.step(d_meta, set())
            assert not errors, f"load errors: {len(errors)} blocks"
            steps.append(ranks)
            if r.request_id in recving:
                pulled = time.perf_counter() - start
        d_meta = decode.scheduler.build_connector_meta(None)
        sending, _, _, ranks = prefill.step(p_meta, p_finished)
        prefill_steps.append(max(ranks)[0])
        p_meta, p_finished = prefill.scheduler.build_connector_meta(None), set()
        if rid in sending:
            freed = time.perf_counter() - start
        assert time.perf_counter() - start < 60, "the request did not complete in 60 s"
        time.sleep(FORWARD_S)
    slowest = [max(ranks)[0] for ranks in steps]
    return dict(pull=pulled, freed=freed, steps=len(steps), start_step=slowest[0],
                start_read_blocks=max(steps[0])[1],
                start_all_ranks=sum(t for t, _ in steps[0]),
                moving_step=statistics.median(slowest[1:-1]) if len(steps) > 2 else 0.0,
                last_step=slowest[-1], prefill_step=statistics.median(prefill_steps))


def verify(prefill, decode, p_blocks, d_blocks):
    """Every pulled element equals prefill's, head by head (global head = rank x heads +
    local head on both sides)."""
    pb, db = torch.tensor(p_blocks), torch.tensor(d_blocks)
    for d, layers in enumerate(decode.caches):
        first = d * decode.heads
        p, h0 = divmod(first, prefill.heads)
        for layer, got in enumerate(layers):
            want = prefill.caches[p][layer][:, pb, h0:h0 + decode.heads]
            if not torch.equal(got[:, db].view(torch.int16), want.view(torch.int16)):
                raise AssertionError(f"decode rank {d} layer {layer}: pulled bytes differ")


def spread(values, scale=1e3, fmt="{:.1f}"):
    m = statistics.median(values)
    return (f"{fmt.format(m * scale)} ({fmt.format(min(values) * scale)}.."
            f"{fmt.format(max(values) * scale)})")


def run_config(nodes, P, D, rounds, rng):
    ps, ds = nodes["prefill-node"].socket, nodes["decode-node"].socket
    prefill = Engine(f"P{P}", P, ps, fill=True)
    decode = Engine(f"D{D}", D, ds, fill=False)
    nbytes = LAYERS * 2 * REQUEST_BLOCKS * KV_HEADS * BLOCK_TOKENS * HEAD_SIZE * 2
    # The same bytes as one op: one region each side, one Client.read.
    pc, dc = ferry.Client(ps), ferry.Client(ds)
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8).share_memory_()
    dst = torch.zeros(nbytes, dtype=torch.uint8).share_memory_()
    src_reg, dst_reg = pc.register(src, name="one-op"), dc.register(dst)

    def one_op():
        start = time.perf_counter()
        dc.read(dst_reg, "prefill-node", "one-op", nbytes)
        return time.perf_counter() - start

    rows = []
    for i in range(rounds + 1):
        p_blocks = sorted(int(b) for b in rng.choice(NUM_BLOCKS, REQUEST_BLOCKS, replace=False))
        d_blocks = [int(b) for b in rng.choice(NUM_BLOCKS, REQUEST_BLOCKS, replace=False)]
        for layers in decode.caches:
            for t in layers:
                t.zero_()
        row = one_request(prefill, decode, f"req-{P}-{D}-{i}", p_blocks, d_blocks)
        verify(prefill, decode, p_blocks, d_blocks)
        row["one_op"] = one_op()
        rows.append(row)
    assert torch.equal(src, dst), "the one-op read's bytes differ"
    first, rows = rows[0], rows[1:]

    def med(key):
        return statistics.median(r[key] for r in rows)

    label = f"TP {P} -> {D}"
    pairs = LAYERS * 2 * REQUEST_BLOCKS * max(1, P // D)
    print(f"\n{label}: each decode rank pulls {KV_HEADS // D} heads of {LAYERS} layers x K,V x "
          f"{REQUEST_BLOCKS} blocks ({pairs} pairs of {nbytes // D // pairs >> 10} KiB, "
          f"{nbytes // D >> 20} MiB) from {max(1, P // D)} prefill rank(s); "
          f"{nbytes >> 20} MiB in all. Median (min..max) of {rounds} rounds, ms")
    def line(what, key, digits=1, tail=""):
        values = [r[key] for r in rows]
        print(f"  {what:46} {spread(values, fmt='{:.%df}' % digits)}{tail}")

    print(f"  {'first pull (the peer resolves the list)':46} {first['pull'] * 1e3:.1f}")
    line("pull, starting step to reporting step", "pull",
         tail=f" = {nbytes / med('pull') / 1e9:.2f} GB/s, {med('steps'):.0f} decode steps")
    line("same bytes as one op (Client.read)", "one_op",
         tail=f" = {nbytes / med('one_op') / 1e9:.2f} GB/s")
    print(f"  {'pull / one op':46} {med('pull') / med('one_op'):.2f} x the time")
    line("prefill's blocks freed after", "freed")
    print("  Python in connector calls per engine step, the slowest rank:")
    line("  decode, the step starting the pull", "start_step", 2)
    line("    of it in Client.read_blocks", "start_read_blocks", 2,
         " (ferry's Python, the agent validating and planning)")
    if D > 1:
        line(f"    the same step on all {D} ranks in turn", "start_all_ranks", 2,
             " (here one process; in vLLM a process per rank)")
    line("  decode, a step while the pull moves", "moving_step", 3)
    line("  decode, the step reporting it", "last_step", 3)
    line("  prefill, a step (notification polls)", "prefill_step", 3)
    print(f"  {'the starting step / one op':46} {med('start_step') / med('one_op'):.3f}")

    # An empty poll, as a prefill rank makes it every step.
    w = prefill.workers[0].connector_worker
    w.client.poll_notifications(w.prefix)
    polls = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(POLLS):
            w.client.poll_notifications(w.prefix)
        polls.append((time.perf_counter() - start) / POLLS)
    print(f"  {'empty poll_notifications, us a call':46} {spread(polls, 1e6)} (3 x {POLLS})")

    pc.deregister(src_reg)
    dc.deregister(dst_reg)
    pc.close()
    dc.close()
    prefill.close()
    decode.close()
    return dict(config=label, prefill_tp=P, decode_tp=D, bytes=nbytes, pairs_per_rank=pairs,
                first_pull_s=first["pull"], rounds=rows, empty_poll_s=polls)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    rng = np.random.default_rng(46)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "?")
    print(f"machine: {cpu}, {os.cpu_count()} cores, {os.uname().release}; "
          f"ferry.vllm from {os.path.dirname(ferry.vllm.__file__)}")
    print(f"ferry.vllm.FerryConnector pull bench: {LAYERS} layers, {KV_HEADS} KV heads x "
          f"{HEAD_SIZE} x bfloat16, blocks of {BLOCK_TOKENS} tokens (32 KiB per K or V block "
          f"at TP 1), {REQUEST_BLOCKS} blocks a request; {FORWARD_S * 1e3:g} ms forward a "
          f"step; two agents, tcp over loopback")
    out = []
    with ferry.launch.agents(["prefill-node", "decode-node"], host_pool="64MiB") as nodes:
        for P, D in CONFIGS:
            out.append(run_config(nodes, P, D, args.rounds, rng))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
