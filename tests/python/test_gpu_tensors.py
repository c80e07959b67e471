"""GPU tensors through send / recv / register without a host copy, on simulated GPUs (the
agents of conftest.py have one each). The real-CUDA path (a CUDA torch tensor registered by
CUDA IPC) runs in tests/gpu/run.sh.

Before, send of a tensor from ferry.empty(..., device="cuda:0") failed
"INVALID_ARGUMENT: meta.device: 'host' but buffer 2 is on cuda:0" (the client said "host").
"""
import numpy as np
import pytest

import ferry


def no_staging(client, monkeypatch):
    """Makes any host staging copy fail the test: a send from agent memory allocates nothing."""
    def staged(*args, **kwargs):
        raise AssertionError("the send copied the tensor through a staging buffer")
    monkeypatch.setattr(client, "alloc", staged)


def test_send_of_a_simulated_gpu_tensor_goes_from_its_buffer(a, b, monkeypatch):
    x = ferry.empty((64, 1024), "float32", device="cuda:0", client=a)
    x[:] = np.arange(x.size, dtype=np.float32).reshape(x.shape)
    no_staging(a, monkeypatch)
    done = a.send_async(x, "node-b", "gpu/x")
    y = b.recv("node-a", "gpu/x", timeout=20)
    done.result(20)
    assert y.shape == (64, 1024) and (y == x).all()


def test_send_of_a_simulated_gpu_torch_tensor_and_a_slice_of_it(a, b, monkeypatch):
    torch = pytest.importorskip("torch")
    t = ferry.empty((16, 256), "float16", device="cuda:0", like="torch", client=a)
    t.copy_(torch.arange(t.numel(), dtype=torch.float16).reshape(t.shape))
    no_staging(a, monkeypatch)
    for tag, part in (("gpu/t", t), ("gpu/rows", t[4:8])):
        done = a.send_async(part, "node-b", tag)
        got = b.recv("node-a", tag, like="torch", timeout=20)
        done.result(20)
        assert torch.equal(got, part)


def test_recv_into_a_simulated_gpu_buffer_lands_there(a, b):
    out = ferry.empty((32, 512), "int32", device="cuda:0", name="gpu-landing", client=b)
    out[:] = -1
    x = a.empty((32, 512), "int32")
    x[:] = np.arange(x.size, dtype=np.int32).reshape(x.shape)
    done = a.send_async(x, "node-b", "gpu/land")
    got = b.recv("node-a", "gpu/land", out=out, timeout=20)
    done.result(20)
    assert got is out and (out == x).all()
    landing = [i for i in b.list_buffers() if i.name == "gpu-landing"]
    assert landing and landing[0].device == "cuda:0"


def test_register_of_a_simulated_gpu_tensor_is_its_buffer(a):
    x = ferry.empty((4, 4096), "uint8", device="cuda:0", client=a)
    reg = a.register(x[1:])
    assert reg.device == "cuda:0" and reg.offset == 4096 and reg.length == 3 * 4096
    assert not reg.owned  # nothing new registered: the buffer itself
