"""Issue 46: block lists over arbitrary entries (prepare_entries) and strided runs
(prepare_strided), so that a decode rank addresses head slices of a prefill rank's blocks
without a copy; pairs of unequal lengths refused naming both; and a move to a peer that
does not answer ends within its timeout, naming the peer."""
import os
import signal
import time

import numpy as np
import pytest
import torch

import ferry

BLOCKS, HEADS, TOKENS, DIM = 16, 4, 16, 32   # a prefill rank's cache: (blocks, heads, tokens, dim)
HEAD_BYTES = TOKENS * DIM * 2                # float16
BLOCK_BYTES = HEADS * HEAD_BYTES


def test_a_tp4_decode_rank_reads_its_head_slice_of_a_tp2_prefill_rank(a, b):
    # Prefill (TP 2) holds 4 heads a block; decode ranks (TP 4) hold 2: rank q's are heads
    # [2q, 2q + 2) of prefill's. Prefill exports one run per decode rank.
    k = torch.randn(BLOCKS, HEADS, TOKENS, DIM, dtype=torch.float16).share_memory_()
    reg = b.register(k, name="tp2-k")
    runs = [(reg, q * 2 * HEAD_BYTES, BLOCK_BYTES, BLOCKS, 2 * HEAD_BYTES) for q in range(2)]
    theirs = b.prepare_strided(runs, name="tp2-kv")
    assert len(theirs) == 2 * BLOCKS
    mine_k = torch.zeros(BLOCKS, 2, TOKENS, DIM, dtype=torch.float16).share_memory_()
    mine = a.prepare_blocks([mine_k], 2 * HEAD_BYTES)
    # Decode rank 1 pulls blocks 3, 7, 8 into its blocks 0, 1, 2.
    a.read_blocks("node-b", "tp2-kv", [BLOCKS + 3, BLOCKS + 7, BLOCKS + 8], mine, [0, 1, 2],
                  verify=True, timeout=10).wait(10)
    for local, remote in ((0, 3), (1, 7), (2, 8)):
        assert torch.equal(mine_k[local], k[remote, 2:4])
    assert not mine_k[3:].any()
    mine.release()
    theirs.release()
    b.deregister(reg)


def test_entries_of_any_length_and_a_tensor_named_twice_is_registered_once(a, b):
    src = torch.arange(4096, dtype=torch.uint8).share_memory_()
    dst = torch.zeros(4096, dtype=torch.uint8).share_memory_()
    theirs = b.prepare_entries([(src, 10, 100), (src, 1000, 7), (src, 2000, 1024)],
                               name="entries-kv")
    assert len(theirs) == 3 and len(theirs.registrations) == 1
    mine = a.prepare_entries([(dst, 0, 7), (dst, 500, 1024), (dst, 3000, 100)])
    a.read_blocks("node-b", "entries-kv", [1, 2, 0], mine, [0, 1, 2], timeout=10).wait(10)
    assert torch.equal(dst[0:7], src[1000:1007])
    assert torch.equal(dst[500:1524], src[2000:3024])
    assert torch.equal(dst[3000:3100], src[10:110])
    assert dst[7:500].sum() == 0
    # Unequal lengths: refused before anything moves, naming both sides and lengths.
    with pytest.raises(ferry.InvalidArgument, match=r"local_ids\[1\], remote_ids\[1\]: local "
                       r"block 1 is 1024 bytes, block 0 of node-b's list 'entries-kv' is 100"):
        a.read_blocks("node-b", "entries-kv", [1, 0], mine, [0, 1], timeout=10)
    mine.release()
    theirs.release()


def test_bad_entries_and_runs_name_the_argument(a):
    t = torch.zeros(1024, dtype=torch.uint8).share_memory_()
    with pytest.raises(ferry.InvalidArgument, match=r"entries\[1\]: its blocks end at byte 1025"):
        a.prepare_entries([(t, 0, 8), (t, 1000, 25)])
    with pytest.raises(ferry.InvalidArgument, match=r"runs\[0\]\.stride: 8 is less than length 16"):
        a.prepare_strided([(t, 0, 8, 4, 16)])
    with pytest.raises(ferry.InvalidArgument, match=r"runs\[0\]: its blocks end at byte 1040"):
        a.prepare_strided([(t, 16, 256, 4, 256)])
    with pytest.raises(ferry.InvalidArgument, match=r"entries\[0\]: must be"):
        a.prepare_entries([(t, 0)])
    assert a.info()["block_lists"] == 0 and a.info()["registered_bytes"] == 0


def test_a_move_to_a_peer_that_does_not_answer_ends_within_its_timeout():
    with ferry.launch.agents(["node-a", "node-b"], host_pool="64MiB") as nodes:
        with ferry.Client(nodes["node-a"].socket) as a, ferry.Client(nodes["node-b"].socket) as b:
            theirs = b.prepare_blocks([b.empty((8, 4096), "uint8", name="hung-k")], 4096,
                                      name="hung-kv")
            mine = a.prepare_blocks([a.empty((8, 4096), "uint8")], 4096)
            pid = nodes["node-b"].process.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                start = time.monotonic()
                # Before: 10 s, "remote_list_name: node-b answered: Deadline Exceeded".
                with pytest.raises(ferry.DeadlineExceeded,
                                   match="node-b did not answer ResolveBlocks within 2 s"):
                    a.read_blocks("node-b", "hung-kv", [0], mine, [0], timeout=2)
                took = time.monotonic() - start
            finally:
                os.kill(pid, signal.SIGCONT)
            assert 2 <= took < 3.5, took
            a.read_blocks("node-b", "hung-kv", [1], mine, [1], timeout=10).wait(10)
            mine.release()
            theirs.release()
