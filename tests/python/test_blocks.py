"""Memory the process allocated itself (register), block lists (prepare_blocks) and handles
(read_blocks / write_blocks) against real agents: bytes land in the process's own pages,
each failure raises the ferry error that names the argument, and nothing is left at the
agent once the memory and the clients are gone."""
import gc
import os
import subprocess
import sys
import threading
import time
from multiprocessing import shared_memory

import numpy as np
import pytest
import torch

import ferry

BLOCK = 32 << 10


def shared_array(nbytes, keep):
    """A numpy uint8 array over POSIX shared memory (kept mapped by `keep`)."""
    shm = shared_memory.SharedMemory(create=True, size=nbytes)
    shm.unlink()
    keep.append(shm)
    return np.ndarray((nbytes,), dtype=np.uint8, buffer=shm.buf)


def wait_for(predicate, seconds=10):
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_numpy_shared_memory_read_blocks_with_notification(a, b):
    keep = []
    src = [shared_array(8 * BLOCK, keep) for _ in range(4)]   # 4 tensors of 8 blocks on b
    dst = [shared_array(8 * BLOCK, keep) for _ in range(4)]   # and on a
    for i, s in enumerate(src):
        s[:] = np.random.default_rng(i).integers(0, 256, s.size, dtype=np.uint8)
    exported = b.prepare_blocks(src, BLOCK, name="np-kv")
    assert len(exported) == 32 and exported.blocks_per_tensor == 8
    mine = a.prepare_blocks(dst, BLOCK)
    remote_ids = [t * 8 + j for t in range(4) for j in (1, 5, 6)]
    local_ids = [t * 8 + j for t in range(4) for j in (0, 1, 2)]
    h = a.read_blocks("node-b", "np-kv", remote_ids, mine, local_ids, notify="np-kv pulled")
    assert h.wait(10) is h and h.done() and h.status() == "succeeded" and h.failed() == []
    assert h.bytes == 12 * BLOCK
    for t in range(4):
        for j, k in zip((1, 5, 6), (0, 1, 2)):
            assert np.array_equal(dst[t][k * BLOCK:(k + 1) * BLOCK], src[t][j * BLOCK:(j + 1) * BLOCK])
    n = b.wait_notification("np-kv pulled", from_node="node-a", timeout=10)
    assert n.blocks == 12 and n.bytes == 12 * BLOCK

    # And pushed back: a's block 0 of tensor 3 into b's block 7 of tensor 0.
    w = a.write_blocks(mine, [24], "node-b", "np-kv", [7])
    w.wait(10)
    assert np.array_equal(src[0][7 * BLOCK:8 * BLOCK], dst[3][:BLOCK])
    mine.release()
    exported.release()
    wait_for(lambda: a.info()["registered_bytes"] == 0 and b.info()["registered_bytes"] == 0)
    assert a.info()["block_lists"] == 0 and b.info()["block_lists"] == 0


def test_torch_tensors_after_share_memory(a, b):
    k = torch.arange(4 * BLOCK // 2, dtype=torch.int16).share_memory_()
    v = torch.zeros(4 * BLOCK // 2, dtype=torch.int16).share_memory_()
    theirs = b.prepare_blocks([k], BLOCK, name="torch-kv")
    reg = a.register(v)
    assert reg.owned and reg.length == v.numel() * 2
    again = a.register(v)
    assert again.id == reg.id and not again.owned  # the same range: the same registration
    ours = a.prepare_blocks([reg], BLOCK)
    a.read_blocks("node-b", "torch-kv", [3, 0], ours, [0, 3]).wait(10)
    assert torch.equal(v[:BLOCK // 2], k[3 * BLOCK // 2:])
    assert torch.equal(v[3 * BLOCK // 2:], k[:BLOCK // 2])
    ours.release()
    a.deregister(reg)
    theirs.release()


def test_verify_fails_the_pairs_whose_blocks_differ(a, b):
    keep = []
    src, dst = shared_array(4 * BLOCK, keep), shared_array(4 * BLOCK, keep)
    src[:] = np.random.default_rng(5).integers(0, 256, src.size, dtype=np.uint8)
    theirs = b.prepare_blocks([src], BLOCK, name="verify-kv")
    # The same memory twice: blocks 3 and 7 are the same bytes.
    ours = a.prepare_blocks([dst, dst], BLOCK)
    h = a.read_blocks("node-b", "verify-kv", [2, 3], ours, [0, 1], verify=True).wait(10)
    assert h.status() == "succeeded"
    assert np.array_equal(dst[:2 * BLOCK], src[2 * BLOCK:])
    # Two pairs into block 3's memory: it cannot hold both sources, and the check says which
    # failed (the same block index twice is refused before anything moves).
    h = a.read_blocks("node-b", "verify-kv", [0, 1, 2], ours, [3, 7, 2], verify=True)
    with pytest.raises(ferry.DataLoss, match="verify: the blocks differ"):
        h.wait(10)
    failed = h.failed()
    assert 1 <= len(failed) <= 2 and all(i in (0, 1) and code == 15 for i, code, _ in failed)
    ours.release()
    theirs.release()


def test_wait_moves_in_one_call_and_a_failure_raises_from_the_handle(a, b):
    keep = []
    src, dst = shared_array(4 * BLOCK, keep), shared_array(4 * BLOCK, keep)
    src[:] = np.random.default_rng(6).integers(0, 256, src.size, dtype=np.uint8)
    theirs = b.prepare_blocks([src], BLOCK, name="wait-kv")
    ours = a.prepare_blocks([dst, dst], BLOCK)     # blocks 4-7 are 0-3's memory again
    for j in range(4):  # one block at a time, as a decode step pulls a layer's newest block
        h = a.read_blocks("node-b", "wait-kv", [j], ours, [3 - j], wait=True)
        # Ended when it returns: its result came with the answer.
        assert h._result is not None and h._result["state"] == "succeeded"
        assert h.done() and h.wait(0) is h and h.result()["bytes"] == BLOCK
    assert np.array_equal(dst[:BLOCK], src[3 * BLOCK:])
    assert np.array_equal(dst[3 * BLOCK:], src[:BLOCK])
    w = a.write_blocks(ours, [0], "node-b", "wait-kv", [1], wait=True)
    assert w.status() == "succeeded"
    assert np.array_equal(src[BLOCK:2 * BLOCK], dst[:BLOCK])
    # A move that fails the check ends failed: the handle says so, and wait() raises.
    h = a.read_blocks("node-b", "wait-kv", [0, 1], ours, [2, 6], verify=True, wait=True)
    assert h.status() == "failed"
    with pytest.raises(ferry.DataLoss):
        h.wait(0)
    # Refused before it starts: raised by the call itself, naming the argument.
    with pytest.raises(ferry.InvalidArgument, match="remote_ids"):
        a.read_blocks("node-b", "wait-kv", [9], ours, [0], wait=True)
    ours.release()
    theirs.release()


def test_a_move_with_wait_takes_the_agents_transfer_socket(nodes, a, b):
    """One round trip without gRPC (server/api/transfer_socket.h): the new client's move opens
    a connection of its own, which the agent counts and closes once the client is gone."""
    keep = []
    src, dst = shared_array(2 * BLOCK, keep), shared_array(2 * BLOCK, keep)
    src[:] = np.random.default_rng(8).integers(0, 256, src.size, dtype=np.uint8)
    theirs = b.prepare_blocks([src], BLOCK, name="socket-kv")
    before = a.info()["transfer_socket_clients"]
    with ferry.Client(nodes["node-a"].socket) as c:
        ours = c.prepare_blocks([dst], BLOCK)
        assert c.info()["transfer_socket_clients"] == before  # nothing moved yet
        assert c.read_blocks("node-b", "socket-kv", [1], ours, [0], wait=True).status() == \
            "succeeded"
        assert np.array_equal(dst[:BLOCK], src[BLOCK:])
        assert c.info()["transfer_socket_clients"] == before + 1
        ours.release()
    del c, ours  # the session, and its connections, go with the last reference to it
    gc.collect()
    wait_for(lambda: a.info()["transfer_socket_clients"] == before)
    theirs.release()


def test_private_memory_is_refused_with_how_to_share_it(a):
    with pytest.raises(ferry.FailedPrecondition, match="share_memory_"):
        a.register(np.zeros(1 << 20, dtype=np.uint8))
    with pytest.raises(ferry.FailedPrecondition, match="private"):
        a.register(torch.zeros(1 << 18))
    with pytest.raises(ferry.InvalidArgument, match="contiguous"):
        a.register(np.zeros((64, 64))[:, ::2])


def test_bad_indices_and_unknown_lists_name_the_argument(a, b):
    keep = []
    theirs = b.prepare_blocks([shared_array(4 * BLOCK, keep)], BLOCK, name="bad-kv")
    ours = a.prepare_blocks([shared_array(4 * BLOCK, keep)], BLOCK)
    with pytest.raises(ferry.InvalidArgument, match=r"local_ids\[0\]"):
        a.read_blocks("node-b", "bad-kv", [0], ours, [4])
    with pytest.raises(ferry.InvalidArgument, match=r"remote_ids\[1\]"):
        a.read_blocks("node-b", "bad-kv", [0, 9], ours, [0, 1])
    with pytest.raises(ferry.InvalidArgument, match="remote_ids"):
        a.read_blocks("node-b", "bad-kv", [0, 1], ours, [0])
    with pytest.raises(ferry.InvalidArgument, match="local_ids"):
        a.read_blocks("node-b", "bad-kv", [0], ours, [-1])
    with pytest.raises(ferry.NotFound, match="nope"):
        a.read_blocks("node-b", "nope", [0], ours, [0])
    # Two blocks landing in one: a pull into local block 3 twice, a push into remote block 2
    # twice. Reading one block twice, or pushing one block to two, is fine.
    with pytest.raises(ferry.InvalidArgument, match=r"local_ids\[1\]: block 3 is local_ids\[0\]"):
        a.read_blocks("node-b", "bad-kv", [0, 1], ours, [3, 3])
    with pytest.raises(ferry.InvalidArgument, match=r"remote_ids\[2\]: block 2 is remote_ids\[0\]"):
        a.write_blocks(ours, [0, 1, 3], "node-b", "bad-kv", [2, 0, 2])
    a.read_blocks("node-b", "bad-kv", [1, 1], ours, [0, 1], wait=True)
    a.write_blocks(ours, [1, 1], "node-b", "bad-kv", [0, 3], wait=True)
    # A named list over an unnamed registration: peers could not reach it.
    reg = a.register(shared_array(BLOCK, keep))
    with pytest.raises(ferry.InvalidArgument, match="no name"):
        a.prepare_blocks([reg], BLOCK, name="unreachable")
    # Deregistered under the list: the pair fails, by index, and nothing moves.
    dead = a.prepare_blocks([reg], BLOCK)
    a.deregister(reg)
    with pytest.raises(ferry.NotFound, match=r"pairs\[0\]"):
        a.read_blocks("node-b", "bad-kv", [0], dead, [0])
    for bl in (theirs, ours, dead):
        bl.release()


def test_thousands_of_handles_and_no_thread_per_call(a, b):
    keep = []
    theirs = b.prepare_blocks([shared_array(64 * 4096, keep)], 4096, name="many-kv")
    ours = a.prepare_blocks([shared_array(64 * 4096, keep)], 4096)
    threads_before = threading.active_count()
    agent_threads = a.info()["threads"]
    handles = [a.read_blocks("node-b", "many-kv", [i % 64], ours, [(i * 7) % 64])
               for i in range(2000)]
    assert threading.active_count() == threads_before
    for h in handles:
        h.wait(30)
    assert all(h.status() == "succeeded" for h in handles)
    # The agent grew no thread per handle either (a few pool threads may come and go).
    assert a.info()["threads"] <= agent_threads + 8
    theirs.release()
    ours.release()


def test_empty_on_a_simulated_gpu(a, b):
    x = ferry.empty((8, 4096), "float32", device="cuda:0", client=a)
    x[:] = 3.0
    bl = a.prepare_blocks([a.register(x)], 4096 * 4)
    assert bl.blocks == 8
    y = b.empty((8, 4096), "float32", name="gpu-dst")
    y[:] = 0
    theirs = b.prepare_blocks([y], 4096 * 4, name="gpu-dst-kv")
    x[2] = 2.0
    a.write_blocks(bl, [2, 5], "node-b", "gpu-dst-kv", [0, 7]).wait(10)
    assert (y[0] == 2.0).all() and (y[7] == 3.0).all() and (y[1:7] == 0).all()
    bl.release()
    theirs.release()


def test_client_exit_drops_registrations_and_lists(nodes, a):
    code = """
import sys, numpy as np, ferry
from multiprocessing import shared_memory
c = ferry.Client(sys.argv[1])
shm = shared_memory.SharedMemory(create=True, size=1 << 20); shm.unlink()
arr = np.ndarray((1 << 20,), dtype=np.uint8, buffer=shm.buf)
c.prepare_blocks([arr], 4096, name="exit-kv")
assert c.info()["registered_bytes"] == 1 << 20
import os; os._exit(0)
"""
    subprocess.run([sys.executable, "-c", code, nodes["node-a"].socket], check=True,
                   env=dict(os.environ), timeout=60)
    wait_for(lambda: a.info()["registered_bytes"] == 0 and a.info()["block_lists"] == 0)
