"""Notifications as a connector drains them (issue 46): poll_notifications takes every pending
one at once and never waits, each carries the payload its sender gave (notify_payload, at
most 4096 bytes), wait_notification(timeout=0) and notifications(timeout=0) answer at once,
a caller never takes another uid's notifications, and notify sends one alone (no move). Before:
no poll, no payload, no notification without a move, and a timeout of 0 meant "wait the
default 60 s"."""
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import ferry
from test_non_root import NOBODY, _drop_to_nobody

BLOCK = 4096


@pytest.fixture(scope="module")
def kv(a, b):
    """b's exported list "notes-kv" of 8 blocks, and a's own list to pull them into."""
    theirs_mem = torch.arange(8 * BLOCK, dtype=torch.uint8).share_memory_()
    ours_mem = torch.zeros(8 * BLOCK, dtype=torch.uint8).share_memory_()
    theirs = b.prepare_blocks([theirs_mem], BLOCK, name="notes-kv")
    ours = a.prepare_blocks([ours_mem], BLOCK)
    yield theirs, ours
    ours.release()
    theirs.release()


def settled(a, b, kv):
    """Every notification a sent b before this has arrived: a's agent delivers them to b in
    the order their moves ended, and this one is taken last."""
    pulled(a, kv, "settled")
    b.wait_notification("settled", timeout=10)


def pulled(a, kv, notify, notify_payload=b"", block=0):
    """a pulls one block of b's list, notifying b with `notify` and `notify_payload`."""
    _, ours = kv
    a.read_blocks("node-b", "notes-kv", [block], ours, [block], notify=notify,
                  notify_payload=notify_payload, wait=True).wait(10)


def test_an_empty_poll_returns_an_empty_list_at_once(b):
    b.poll_notifications()  # the transfer socket's connection made
    start = time.perf_counter()
    for _ in range(100):
        assert b.poll_notifications("nothing-here/") == []
    per_poll = (time.perf_counter() - start) / 100
    assert per_poll < 0.005, f"an empty poll took {per_poll * 1e6:.0f} us"


def test_poll_takes_every_pending_notification_with_its_payload_once(a, b, kv):
    payloads = [b"", b"req-7 blocks 1,2", bytes(range(256)) * 16]  # the last: 4096 bytes
    for i, payload in enumerate(payloads):
        pulled(a, kv, f"poll/req-{i}", payload, block=i)
    pulled(a, kv, "other/req-9")  # another prefix: left on the board
    settled(a, b, kv)
    got = b.poll_notifications("poll/")
    assert [n.name for n in got] == ["poll/req-0", "poll/req-1", "poll/req-2"]
    assert [n.payload for n in got] == payloads
    assert all(n.from_node == "node-a" and n.blocks == 1 and n.bytes == BLOCK and n.code == 0
               for n in got)
    assert got[0].sequence < got[1].sequence < got[2].sequence
    assert b.poll_notifications("poll/") == []  # taken once
    rest = b.poll_notifications("other/")
    assert [n.name for n in rest] == ["other/req-9"] and rest[0].payload == b""


def test_max_count_takes_the_oldest_and_leaves_the_rest(a, b, kv):
    for i in range(5):
        pulled(a, kv, f"count/{i}", str(i).encode(), block=i)
    settled(a, b, kv)
    first = b.poll_notifications("count/", max_count=2)
    assert [n.payload for n in first] == [b"0", b"1"]
    assert [n.payload for n in b.poll_notifications("count/")] == [b"2", b"3", b"4"]


def test_two_pollers_never_take_the_same_notification(nodes, a, b, kv):
    for i in range(8):
        pulled(a, kv, f"race/{i}", block=i)
    settled(a, b, kv)
    with ferry.Client(nodes["node-b"].socket) as other:
        names = [n.name for n in other.poll_notifications("race/", max_count=3)]
        names += [n.name for n in b.poll_notifications("race/")]
        names += [n.name for n in other.poll_notifications("race/")]
    assert sorted(names) == sorted(f"race/{i}" for i in range(8))


def test_write_blocks_carries_a_payload_too(a, b):
    landing = b.alloc(BLOCK, name="notes-landing")
    src = a.alloc(BLOCK)
    a.write_blocks(src, "node-b", "notes-landing", [(0, 0, BLOCK)], notify="wb/1",
                   notify_payload=b"\x00pushed\xff")
    (n,) = b.poll_notifications("wb/")
    assert n.payload == b"\x00pushed\xff" and n.buffer == "notes-landing"
    del landing


def test_notify_alone_arrives_at_the_list_owners_poll_with_its_payload(a, b, kv):
    a.notify("node-b", "notes-kv", "alone/req-3", b"heartbeat\x00lease=30")
    got = b.poll_notifications("alone/")  # delivered when notify returned: no settling
    assert [(n.name, n.payload, n.from_node, n.list, n.blocks, n.bytes, n.code)
            for n in got] == [("alone/req-3", b"heartbeat\x00lease=30", "node-a", "notes-kv",
                               0, 0, 0)]
    with pytest.raises(ferry.NotFound, match="no-such-list"):
        a.notify("node-b", "no-such-list", "alone/req-4")
    with pytest.raises(ferry.InvalidArgument, match="payload"):
        a.notify("node-b", "notes-kv", "alone/req-5", b"x" * 4097)
    assert b.poll_notifications("alone/") == []


def test_a_payload_over_4096_bytes_is_refused_naming_the_argument(a, b, kv):
    _, ours = kv
    with pytest.raises(ferry.InvalidArgument, match="notify_payload: 4097 bytes"):
        a.read_blocks("node-b", "notes-kv", [0], ours, [0], notify="big",
                      notify_payload=b"x" * 4097)
    src = a.alloc(BLOCK)
    with pytest.raises(ferry.InvalidArgument, match="notify_payload: 4097 bytes"):
        a.write_blocks(src, "node-b", "notes-kv", [(0, 0, BLOCK)], notify="big",
                       notify_payload=b"x" * 4097)
    with pytest.raises(ferry.InvalidArgument, match="notify_payload: .*name one"):
        a.read_blocks("node-b", "notes-kv", [0], ours, [0], notify_payload=b"lost")
    assert b.poll_notifications("big") == []


def test_wait_notification_with_timeout_0_polls(a, b, kv):
    start = time.monotonic()
    with pytest.raises(ferry.DeadlineExceeded, match="'zero/1' is here"):
        b.wait_notification("zero/1", timeout=0)
    assert time.monotonic() - start < 1.0  # was 60 s
    pulled(a, kv, "zero/1", b"p")
    settled(a, b, kv)
    n = b.wait_notification("zero/1", timeout=0)
    assert n.name == "zero/1" and n.payload == b"p"


def test_notifications_with_timeout_0_ends_at_once(a, b, kv):
    start = time.monotonic()
    assert list(b.notifications("stream0/", timeout=0)) == []
    assert time.monotonic() - start < 1.0  # was: until closed
    pulled(a, kv, "stream0/1")
    pulled(a, kv, "stream0/2")
    settled(a, b, kv)
    assert [n.name for n in b.notifications("stream0/", timeout=0)] == ["stream0/1", "stream0/2"]


CHILD = textwrap.dedent("""
    import sys
    import ferry
    c = ferry.Client(sys.argv[1])
    print("before", [n.name for n in c.poll_notifications()])
    try:
        c.wait_notification("uid/root-note", timeout=0)
        print("waited: took root's")
    except ferry.DeadlineExceeded:
        print("waited: none")
    mine = c.alloc(4096, name="nobody-landing")
    src = c.alloc(4096)
    c.write_blocks(src, c.node, "nobody-landing", [(0, 0, 4096)], notify="uid/nobody-taken",
                   notify_payload=b"mine")
    c.write_blocks(src, c.node, "nobody-landing", [(0, 0, 4096)], notify="uid/nobody-left")
    print("after", [(n.name, n.payload) for n in c.poll_notifications("uid/nobody-taken")])
""")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the child drops to uid 65534")
def test_a_poll_never_returns_another_uids_notifications():
    with ferry.launch.agents(["node-n"], host_pool="64MiB", local_mode="0666") as agents:
        agent = agents["node-n"]
        os.chmod(os.path.dirname(agent.socket), 0o755)  # nobody must reach the socket
        with ferry.Client(agent.socket) as root:
            landing = root.alloc(4096, name="root-landing")
            src = root.alloc(4096)
            root.write_blocks(src, root.node, "root-landing", [(0, 0, 4096)],
                              notify="uid/root-note", notify_payload=b"root's")
            run = subprocess.run([sys.executable, "-c", CHILD, agent.socket],
                                 preexec_fn=_drop_to_nobody, capture_output=True, text=True,
                                 timeout=60)
            assert run.returncode == 0, run.stderr
            lines = run.stdout.splitlines()
            assert lines == ["before []", "waited: none",
                             "after [('uid/nobody-taken', b'mine')]"], run.stdout + run.stderr
            # root's is still there for root, and nobody's untaken one is not root's.
            got = root.poll_notifications()
            assert [(n.name, n.payload) for n in got] == [("uid/root-note", b"root's")]
            assert root.pending()["notifications"] == 1  # nobody's, which root lists all of
            del landing
