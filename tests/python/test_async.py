"""Futures without a thread per call, blocking calls that Ctrl-C interrupts, and
`timeout=None`, against real agents (issue 10, item 6)."""
import concurrent.futures
import os
import signal
import threading
import time

import numpy as np
import pytest

import ferry


def wait_for(predicate, seconds=5.0):
    """Polls `predicate` until it is true or `seconds` passed; returns its last value."""
    deadline = time.time() + seconds
    while True:
        value = predicate()
        if value or time.time() >= deadline:
            return value
        time.sleep(0.02)


def pending_recv_tags(client):
    return {p["tag"] for p in client.pending()["recvs"]}


def os_threads():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads: line in /proc/self/status")


def settle(*clients):
    for c in clients:
        assert wait_for(lambda: not any(c.pending()[k] for k in ("sends", "recvs", "arrived"))), \
            c.pending()


def test_40_outstanding_receives_all_match(a, b):
    # The reproduction: with 32 threads, only 32 receives reached the agent and the send for
    # tag 39 failed "no matching receive".
    n = 40
    recvs = [b.recv_async("node-a", f"forty/{i}", timeout=30) for i in range(n)]
    assert wait_for(lambda: len(pending_recv_tags(b)) == n), pending_recv_tags(b)
    xs = [np.full(100 + i, i, np.int32) for i in range(n)]
    for i in reversed(range(n)):
        a.send(xs[i], "node-b", f"forty/{i}", timeout=10)
    for i, f in enumerate(recvs):
        assert np.array_equal(f.result(10), xs[i]), i
    settle(a, b)


def test_200_outstanding_calls_hold_no_thread_each(a, b):
    b.recv_async("node-a", "warm-up", timeout=0.05).exception(5)  # the completer thread, gRPC's
    python_before, os_before = threading.active_count(), os_threads()
    n = 200
    recvs = [b.recv_async("node-a", f"two-hundred/{i}", timeout=60) for i in range(n)]
    assert wait_for(lambda: len(pending_recv_tags(b)) == n, 10), len(pending_recv_tags(b))
    assert threading.active_count() <= python_before + 1
    assert os_threads() <= os_before + 8, (os_before, os_threads())
    # Half of them match, half are cancelled; every future resolves.
    for i in range(0, n, 2):
        a.send_async(np.array([i], np.int64), "node-b", f"two-hundred/{i}", timeout=30)
    for i in range(1, n, 2):
        assert recvs[i].cancel()
    for i, f in enumerate(recvs):
        if i % 2 == 0:
            assert f.result(30).tolist() == [i]
        else:
            assert isinstance(f.exception(10), ferry.Cancelled)
    settle(a, b)


def test_cancel_reaches_the_agent(a, b):
    f = b.recv_async("node-a", "cancel/pending", timeout=None)
    assert wait_for(lambda: "cancel/pending" in pending_recv_tags(b))
    assert not f.done()
    assert f.cancel()
    with pytest.raises(ferry.Cancelled):
        f.result(5)
    assert wait_for(lambda: "cancel/pending" not in pending_recv_tags(b))
    assert not f.cancel()  # finished already
    settle(a, b)


def test_future_protocol(a, b):
    f = b.recv_async("node-a", "protocol", timeout=30)
    with pytest.raises(concurrent.futures.TimeoutError):
        f.result(0.1)
    assert not f.done()
    seen = []
    ran = threading.Event()
    f.add_done_callback(lambda fut: (seen.append(fut), ran.set()))
    a.send(np.arange(6, dtype=np.float32), "node-b", "protocol")
    assert ran.wait(5) and seen == [f] and f.done() and f.exception() is None
    assert np.array_equal(f.result(), np.arange(6, dtype=np.float32))
    late = []
    f.add_done_callback(late.append)  # done already: runs at once
    assert late == [f]
    # The other calls' futures give what their blocking forms return.
    w = b.wait_notification_async("protocol/note", timeout=10)
    src = a.alloc(4096)
    kv = b.alloc(4096, name="py-protocol-kv")  # kept: a collected buffer is freed
    blocks = a.write_blocks_async(src, "node-b", "py-protocol-kv", [(0, 0, 128)],
                                  notify="protocol/note", timeout=10)
    assert blocks.result(10)["bytes"] == 128
    note = w.result(10)
    assert isinstance(note, ferry.Notification) and note.bytes == 128 and kv.size == 4096
    # Bad input fails the future, as before.
    bad = a.send_async(np.zeros(3, np.complex64), "node-b", "bad")
    assert isinstance(bad.exception(5), ferry.InvalidArgument)
    settle(a, b)


def test_futures_outlive_their_client(nodes, a):
    f = ferry.Client(nodes["node-b"].socket).recv_async("node-a", "orphan", timeout=30)
    import gc
    gc.collect()
    a.send(np.ones(4, np.float32), "node-b", "orphan", timeout=10)
    assert np.array_equal(f.result(10), np.ones(4, np.float32))


@pytest.fixture
def sigint_in():
    """sigint_in(seconds): SIGINT to this process after `seconds`, from another thread."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timers = []

    def arm(seconds):
        t = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
        timers.append(t)
        t.start()

    yield arm
    for t in timers:
        t.cancel()
        t.join()
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_interrupts_a_blocking_recv(a, b, sigint_in):
    sigint_in(0.3)
    t0 = time.time()
    with pytest.raises(KeyboardInterrupt):
        b.recv("node-a", "sigint/recv", timeout=30)
    assert 0.25 < time.time() - t0 < 1.0
    # The receive was cancelled at the agent, not left behind.
    assert wait_for(lambda: "sigint/recv" not in pending_recv_tags(b))
    settle(a, b)


@pytest.mark.parametrize("call", ["send", "wait_notification", "recv-no-limit"])
def test_ctrl_c_interrupts_other_blocking_calls(a, b, sigint_in, call):
    sigint_in(0.3)
    t0 = time.time()
    with pytest.raises(KeyboardInterrupt):
        if call == "send":
            a.send(np.zeros(8, np.float32), "node-b", "sigint/send", timeout=30)
        elif call == "wait_notification":
            b.wait_notification("sigint/note", timeout=30)
        else:
            b.recv("node-a", "sigint/none", timeout=None)
    assert time.time() - t0 < 1.0
    settle(a, b)


def test_ctrl_c_interrupts_a_notification_stream(a, b, sigint_in):
    sigint_in(0.3)
    t0 = time.time()
    stream = b.notifications("sigint/stream/")  # no timeout: until closed
    with pytest.raises(KeyboardInterrupt):
        next(stream)
    assert time.time() - t0 < 1.0
    # A fresh stream still gets what arrives.
    src = a.alloc(4096)
    kv = b.alloc(4096, name="py-stream-kv")
    a.write_blocks(src, "node-b", "py-stream-kv", [(0, 0, 64)], notify="sigint/stream/1")
    got = [n.name for n in b.notifications("sigint/stream/", timeout=5, max_count=1)]
    assert got == ["sigint/stream/1"] and kv.size == 4096


def test_timeout_none_waits_without_limit(a, b):
    x = np.arange(32, dtype=np.int16)
    later = threading.Timer(0.5, a.send, (x, "node-b", "none/recv"), {"timeout": 10})
    t0 = time.time()
    later.start()
    try:
        y = b.recv("node-a", "none/recv", timeout=None)
    finally:
        later.join()
    assert time.time() - t0 >= 0.45 and np.array_equal(y, x)
    # The async form and the notification waits take None too.
    f = b.recv_async("node-a", "none/async", timeout=None)
    s = a.send_async(x, "node-b", "none/async", timeout=10)
    assert np.array_equal(f.result(10), x) and s.result(10)["bytes"] == x.nbytes
    w = b.wait_notification_async("none/note", timeout=None)
    src = a.alloc(4096)
    kv = b.alloc(4096, name="py-none-kv")  # kept: a collected buffer is freed
    a.write_blocks(src, "node-b", "py-none-kv", [(0, 0, 64)], notify="none/note", timeout=10)
    assert w.result(10).bytes == 64 and kv.size == 4096
    settle(a, b)


def test_send_and_write_blocks_take_timeout_none(a, b):
    x = np.arange(8, dtype=np.float32)
    f = b.recv_async("node-a", "none/send", timeout=10)
    try:
        assert a.send(x, "node-b", "none/send", timeout=None)["bytes"] == x.nbytes
        assert np.array_equal(f.result(10), x)
        src = a.alloc(4096)
        kv = b.alloc(4096, name="py-none-send-kv")
        assert a.write_blocks(src, "node-b", "py-none-send-kv", [(0, 0, 64)],
                              timeout=None)["bytes"] == 64 and kv.size == 4096
    finally:
        f.cancel()
        f.exception(10)
    settle(a, b)
