"""ferry's Python package against real agents: numpy and torch round trips (zero copy),
futures, KV blocks with notifications, cancellation, deadlines and bad input."""
import gc
import time

import numpy as np
import pytest
import torch

import ferry


def settle(*clients):
    gc.collect()
    for c in clients:
        p = c.pending()
        assert not (p["sends"] or p["recvs"] or p["arrived"]), p


def test_numpy_recv_before_and_after_send(a, b):
    x = a.empty((16, 8), "float32")
    x[:] = np.arange(128, dtype=np.float32).reshape(16, 8)
    early = b.recv_async("node-a", "np/before")
    time.sleep(0.1)
    a.send(x, "node-b", "np/before")
    y = early.result(10)
    assert y.dtype == np.float32 and y.shape == (16, 8) and np.array_equal(x, y)

    late = a.send_async(x * 2, "node-b", "np/after")  # not in agent memory: staged
    time.sleep(0.2)
    assert [p["tag"] for p in b.pending()["arrived"]] == ["np/after"]
    z = b.recv("node-a", "np/after")
    late.result(10)
    assert np.array_equal(z, x * 2)
    settle(a, b)


def test_zero_copy_both_ends(a, b):
    x = a.empty((1 << 20,), "uint8")
    x[:] = 7
    used = a.info()["host_pool_used_bytes"]
    f = b.recv_async("node-a", "zc")
    a.send(x, "node-b", "zc")
    assert a.info()["host_pool_used_bytes"] == used  # no staging buffer was needed
    y = f.result(10)
    # The received array is a view of the mapped landing buffer, not a copy.
    assert not y.flags.owndata
    y[0] = 9  # writable shared memory
    assert y[0] == 9 and y[1] == 7


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int8", "uint8", "int16",
                                   "int32", "int64", "bool"])
def test_numpy_dtypes_round_trip(a, b, dtype):
    rng = np.random.default_rng(1)
    x = (rng.random((3, 5, 2)) * 100).astype(dtype)
    f = b.recv_async("node-a", f"dt/{dtype}")
    a.send(x, "node-b", f"dt/{dtype}")
    y = f.result(10)
    assert y.dtype == x.dtype and y.shape == x.shape and np.array_equal(x, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64,
                                   torch.int8, torch.uint8, torch.bool, torch.float64])
def test_torch_dtypes_round_trip_through_dlpack(a, b, dtype):
    t = (torch.randn(4, 6) * 10).to(dtype)
    f = b.recv_async("node-a", f"torch/{dtype}", like="torch")
    a.send(t, "node-b", f"torch/{dtype}")
    got = f.result(10)
    assert isinstance(got, torch.Tensor) and got.dtype == dtype and got.shape == t.shape
    assert torch.equal(got, t)


def test_bfloat16_and_float8_travel_with_their_dtype(a, b):
    bits = np.arange(12, dtype=np.uint16).reshape(3, 4)
    f = b.recv_async("node-a", "bf16", like="torch")
    a.send(bits, "node-b", "bf16", dtype="bfloat16")
    got = f.result(10)
    assert got.dtype == torch.bfloat16
    assert np.array_equal(got.view(torch.int16).numpy().astype(np.uint16), bits)
    f = b.recv_async("node-a", "f8")
    a.send(np.arange(10, dtype=np.uint8), "node-b", "f8", dtype="float8_e4m3fn")
    assert np.array_equal(f.result(10), np.arange(10, dtype=np.uint8))


def test_shapes_strides_scalars_and_empty(a, b):
    base = a.empty((6, 4), "int32")
    base[:] = np.arange(24).reshape(6, 4)
    cases = {"transposed": base.T, "every-other-row": base[::2], "scalar": np.array(5.5),
             "empty": np.zeros((0, 3), np.float32), "4d": np.ones((1, 2, 3, 4), np.int16)}
    for tag, x in cases.items():
        f = b.recv_async("node-a", f"shape/{tag}")
        a.send(x, "node-b", f"shape/{tag}")
        y = f.result(10)
        assert y.shape == x.shape and y.dtype == x.dtype and np.array_equal(x, y), tag
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    f = b.recv_async("node-a", "shape/torch-t", like="torch")
    a.send(t, "node-b", "shape/torch-t")
    assert torch.equal(f.result(10), t)


def test_recv_into_named_buffer_checks_dtype_and_shape(a, b):
    home = b.alloc(1 << 16, name="py-landing")
    out = home.numpy("float32", (8, 8), offset=4096)
    x = np.full((8, 8), 3.0, np.float32)
    f = b.recv_async("node-a", "into", out=out)
    a.send(x, "node-b", "into")
    assert f.result(10) is out and np.array_equal(out, x)
    # A sender whose dtype differs from `out`: both sides get INVALID_ARGUMENT, `out` untouched.
    f = b.recv_async("node-a", "into-bad", out=out)
    time.sleep(0.1)
    with pytest.raises(ferry.InvalidArgument, match="meta.dtype") as sent:
        a.send(np.zeros((8, 8), np.int32), "node-b", "into-bad")
    # In the user's words (which send, which node), not the agents' call names.
    assert "send of 'into-bad' to node-b: node-b answered: meta.dtype" in sent.value.message
    assert "Match" not in sent.value.message
    with pytest.raises(ferry.InvalidArgument) as err:
        f.result(10)
    assert err.value.code == 3 and "expects float32" in err.value.message
    assert np.array_equal(out, x)
    # An unnamed buffer cannot be a landing buffer.
    with pytest.raises(ferry.FailedPrecondition):
        b.recv("node-a", "x", out=b.empty((4,), "float32"))


def test_many_concurrent_tags_with_futures(a, b):
    n = 48
    xs = [np.full(1000 + i, i, np.int64) for i in range(n)]
    recvs = {i: b.recv_async("node-a", f"many/{i}") for i in range(0, n, 2)}
    sends = [a.send_async(xs[i], "node-b", f"many/{i}") for i in reversed(range(n))]
    recvs.update({i: b.recv_async("node-a", f"many/{i}") for i in range(1, n, 2)})
    for s in sends:
        s.result(30)
    for i, f in recvs.items():
        assert np.array_equal(f.result(30), xs[i]), i
    settle(a, b)


def test_large_tensor(a, b):
    x = a.empty((64, 1 << 20), "uint8")  # 64 MiB
    x[:] = np.arange(64, dtype=np.uint8)[:, None]
    f = b.recv_async("node-a", "large", like="torch", timeout=60)
    a.send(x, "node-b", "large", timeout=60)
    got = f.result(60)
    assert got.shape == (64, 1 << 20) and torch.equal(got, torch.from_numpy(x))


def test_write_blocks_notifies_only_after_the_last_block(a, b):
    kv = b.alloc(4 << 20, name="py-kv")
    src = a.alloc(2 << 20)
    cache = kv.numpy()
    for layer in range(3):
        src.numpy()[:] = np.random.default_rng(layer).integers(0, 255, 2 << 20, dtype=np.uint8)
        blocks = [(i * 4096, (511 - i) * 4096 * 2, 4096) for i in range(512)]  # scattered
        waiter = b.wait_notification_async(f"req-1/layer-{layer}", timeout=30)
        time.sleep(0.05)
        assert not waiter.done()
        a.write_blocks(src, "node-b", "py-kv", blocks, notify=f"req-1/layer-{layer}")
        n = waiter.result(30)
        assert n.from_node == "node-a" and n.blocks == 512 and n.bytes == 512 * 4096
        for lo, ro, ln in blocks:
            assert np.array_equal(cache[ro:ro + ln], src.numpy()[lo:lo + ln])
    # Notifications wait on the board until taken; the stream takes them in order.
    for i in range(3):
        a.write_blocks(src, "node-b", "py-kv", np.array([[0, 0, 64]]), notify=f"req-2/layer-{i}")
    got = [n.name for n in b.notifications("req-2/", timeout=5, max_count=3)]
    assert got == ["req-2/layer-0", "req-2/layer-1", "req-2/layer-2"]


def test_cancel_running_recv_and_send_futures(a, b):
    f = b.recv_async("node-a", "cancel/recv")
    time.sleep(0.2)
    assert f.cancel()
    with pytest.raises((ferry.Cancelled, Exception)):
        f.result(10)
    time.sleep(0.3)
    assert b.pending()["recvs"] == []
    x = a.empty((256,), "float32")
    s = a.send_async(x, "node-b", "cancel/send")
    time.sleep(0.3)
    assert [p["tag"] for p in b.pending()["arrived"]] == ["cancel/send"]
    assert s.cancel()
    deadline = time.time() + 5
    while b.pending()["arrived"] and time.time() < deadline:
        time.sleep(0.05)
    assert b.pending()["arrived"] == []  # the peer learned
    # Explicit cancel by (peer, tag) from another thread.
    f = b.recv_async("node-a", "cancel/explicit")
    time.sleep(0.2)
    assert b.cancel("node-a", "cancel/explicit")["recvs"] == 1
    with pytest.raises(ferry.Cancelled):
        f.result(10)
    settle(a, b)


def test_deadlines(a, b):
    t0 = time.time()
    with pytest.raises(ferry.DeadlineExceeded) as err:
        b.recv("node-a", "never", timeout=0.3)
    assert isinstance(err.value, TimeoutError) and err.value.code_name == "DEADLINE_EXCEEDED"
    assert time.time() - t0 < 3
    with pytest.raises(ferry.DeadlineExceeded, match="no matching receive"):
        a.send(np.zeros(4, np.float32), "node-b", "nobody-listens", timeout=0.3)
    with pytest.raises(ferry.DeadlineExceeded):
        b.wait_notification("never", timeout=0.2)
    settle(a, b)


def test_bad_input(a, b):
    with pytest.raises(ferry.InvalidArgument, match="unknown dtype 'complex64'"):
        a.send(np.zeros(3, np.complex64), "node-b", "bad")
    with pytest.raises(ferry.InvalidArgument, match="unknown dtype 'float128'"):
        a.empty((3,), "float128")
    with pytest.raises(ferry.NotFound, match="node-z"):
        a.send(np.zeros(3, np.float32), "node-z", "bad")
    # Tag reuse while pending.
    first = a.send_async(np.zeros(4, np.float32), "node-b", "reuse", timeout=10)
    time.sleep(0.2)
    with pytest.raises(ferry.AlreadyExists, match="'reuse'"):
        a.send(np.zeros(4, np.float32), "node-b", "reuse")
    b.recv("node-a", "reuse")
    first.result(10)
    # Shape the receiver does not expect.
    f = b.recv_async("node-a", "shape-bad", shape=(2, 2))
    time.sleep(0.1)
    with pytest.raises(ferry.InvalidArgument, match="meta.shape"):
        a.send(np.zeros(5, np.float32), "node-b", "shape-bad")
    with pytest.raises(ferry.InvalidArgument):
        f.result(10)
    # Remote buffer too small: refused before anything moved, the waiter learns.
    small = b.alloc(1024, name="py-small")
    small.numpy()[:] = 1
    src = a.alloc(4096)
    with pytest.raises(ferry.OutOfRange) as err:
        a.write_blocks(src, "node-b", "py-small", [(0, 0, 512), (0, 1000, 512)], notify="bad-kv")
    assert err.value.code == 11 and "blocks[1].remote_offset" in err.value.message
    with pytest.raises(ferry.OutOfRange, match="did not land"):
        b.wait_notification("bad-kv", timeout=5)
    assert (small.numpy() == 1).all()
    settle(a, b)


def test_received_buffers_are_released(a, b):
    gc.collect()
    used = b.info()["host_pool_used_bytes"]
    for i in range(5):
        f = b.recv_async("node-a", f"rel/{i}")
        a.send(np.ones(1 << 18, np.float32), "node-b", f"rel/{i}")
        y = f.result(10)
        assert float(y.sum()) == 1 << 18
    del y, f  # the last view (and its future) keep the last landing buffer
    gc.collect()
    assert b.info()["host_pool_used_bytes"] == used
