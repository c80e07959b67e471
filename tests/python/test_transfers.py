"""One-sided transfers from Python: ranged write/read of named buffers, run of batches,
buffer and policy listing, the package's version (the C++ Client's calls)."""
import re
from pathlib import Path

import numpy as np
import pytest

import ferry


def fill(buf, seed):
    x = buf.numpy()
    x[:] = (np.arange(x.size, dtype=np.uint64) * 31 + seed) % 251
    return x


def test_version_is_the_projects():
    cmake = (Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()
    assert ferry.__version__ == re.search(r"project\(ferry VERSION ([0-9.]+)", cmake).group(1)


def test_ranged_write_and_read_of_a_named_buffer(a, b):
    target = b.alloc(64 << 10, name="py-ranged")
    t = target.numpy()
    t[:] = 0                                                # pool memory may be reused
    src = a.alloc(64 << 10)
    x = fill(src, 1)
    r = a.write(src, "node-b", "py-ranged", length=4096, offset=8192, remote_offset=12288)
    assert (r.state, r.bytes) == ("SUCCEEDED", 4096)
    assert np.array_equal(t[12288:16384], x[8192:12288])
    assert not t[:12288].any() and not t[16384:].any()      # nothing outside the range

    back = a.alloc(64 << 10)
    a.read(back, "node-b", "py-ranged", length=4096, offset=100, remote_offset=12288)
    assert np.array_equal(back.numpy()[100:4196], x[8192:12288])
    a.write(src, "node-b", "py-ranged")                     # length None: the whole buffer
    assert np.array_equal(t, x)


def test_a_range_past_the_buffer_raises_out_of_range_naming_it(a, b):
    small = b.alloc(4096, name="py-small")      # kept: a collected Buffer frees its memory
    src = a.alloc(8192)
    with pytest.raises(ferry.OutOfRange, match="py-small"):
        a.write(src, "node-b", "py-small", length=4096, remote_offset=2048)
    with pytest.raises(ferry.NotFound, match="py-nothing"):
        a.write(src, "node-b", "py-nothing", length=16)
    with pytest.raises(ferry.OutOfRange, match="local_offset"):
        a.write(src, "node-b", "py-small", offset=9000)
    small.free()


def test_run_a_batch_with_per_op_results(a, b):
    target = b.alloc(1 << 20, name="py-batch")
    src = a.alloc(1 << 20)
    x = fill(src, 7)
    block = 16 << 10
    ops = [ferry.Op("write", src, i * block, "node-b", "py-batch", (63 - i) * block, block)
           for i in range(64)]
    r = a.run(ops, include_ops=True)
    assert (r.state, r.ops_total, r.ops_failed, r.bytes) == ("SUCCEEDED", 64, 0, 1 << 20)
    assert [o.index for o in r.ops] == list(range(64))
    assert all(o.code == 0 and o.bytes == block and o.provider for o in r.ops)
    t = target.numpy()
    for i in range(64):
        assert np.array_equal(t[(63 - i) * block:(64 - i) * block], x[i * block:(i + 1) * block])
    # Reads by buffer id, and a registration's offset counts from its own start.
    back = a.alloc(2 * block)
    r = a.run([("read", back.id, 0, "node-b", "py-batch", 0, block),
               ("read", ferry.Registration(back.id, block, offset=block), 0, "node-b",
                "py-batch", block, block)])
    assert r.state == "SUCCEEDED"
    assert np.array_equal(back.numpy(), t[:2 * block])


def test_run_refuses_the_whole_batch_naming_the_op(a, b):
    target = b.alloc(4096, name="py-refused")
    src = a.alloc(4096)
    fill(src, 3)
    ops = [ferry.Op("write", src, 0, "node-b", "py-refused", 0, 4096),
           ferry.Op("write", src, 0, "node-b", "py-refused", 4096, 4096)]
    with pytest.raises(ferry.OutOfRange, match=r"ops\[1\]"):
        a.run(ops)
    with pytest.raises(ferry.InvalidArgument, match="'copy'"):
        a.run([("copy", src, 0, "node-b", "py-refused", 0, 16)])
    target.free()


def test_list_buffers(a):
    named = a.alloc(8192, name="py-listed")
    mine = {buf.id: buf for buf in a.list_buffers()}
    assert named.id in mine
    info = mine[named.id]
    assert (info.name, info.size, info.device, info.registered) == ("py-listed", 8192, "host",
                                                                    False)
    named.free()
    assert named.id not in {buf.id for buf in a.list_buffers()}


def test_policy_listing_and_setting(a):
    before = a.policy()
    assert before.gdr in ("auto", "always", "never") and before.gdr_max_path
    after = a.set_policy(gdr_max_path="PXB")
    try:
        assert after.gdr_max_path == "PXB" and after.generation > before.generation
        assert after.overrides.get("gdr_max_path") == "PXB"
        assert a.policy() == after
        with pytest.raises(ferry.InvalidArgument):
            a.set_policy(gdr="sometimes")
        assert a.policy().generation == after.generation   # the refused one changed nothing
    finally:
        restored = a.set_policy(clear=True)
    assert restored.gdr_max_path == before.gdr_max_path and restored.overrides == {}
