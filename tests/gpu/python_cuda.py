"""CUDA torch tensors through ferry's Python send / recv / register, on a real GPU: two agents
with gpu.backend cuda; a CUDA tensor outside agent memory is registered by CUDA IPC and sent
from there (no host staging buffer), and lands in a CUDA tensor given as recv's out=.

    PYTHONPATH=<build>/python FERRYD=<build>/server/ferryd python3 tests/gpu/python_cuda.py

Exit status 0: passed; 77: skipped (the reason is printed: no torch with CUDA, no GPU, no
ferry module); anything else: failed. The simulated-GPU twin runs in make test
(tests/python/test_gpu_tensors.py).
"""
import sys


def skip(why):
    print(f"python CUDA tensors: skipped ({why})")
    sys.exit(77)


try:
    import torch
except ImportError:
    skip("torch is not installed")
if not torch.cuda.is_available():
    skip(f"torch {torch.__version__} sees no CUDA GPU")
try:
    import ferry
    from ferry import launch
except ImportError as e:
    skip(f"the ferry module is not importable: {e} (build the ferry_python target)")

GPU = "gpu:\n  backend: cuda\n  pool_size: 256MiB\n"


def main():
    with launch.agents(["node-a", "node-b"], host_pool="256MiB", extra=GPU) as agents:
        a = ferry.Client(agents["node-a"].socket)
        b = ferry.Client(agents["node-b"].socket)
        x = torch.randn(1024, 1024, device="cuda:0")  # 4 MiB, torch's own memory
        torch.cuda.synchronize()  # the agent reads it from another process: written first

        def staged(*args, **kwargs):
            raise AssertionError("the CUDA tensor was copied through a host staging buffer")
        a.alloc = staged  # a send from GPU memory allocates no host buffer
        out = torch.zeros_like(x)
        done = a.send_async(x, "node-b", "cuda/x")
        got = b.recv("node-a", "cuda/x", out=out, timeout=60)
        done.result(60)
        assert got is out and torch.equal(out, x), "the received tensor differs"
        # The registrations the calls made for themselves ended with them.
        assert a.info()["registered_bytes"] == 0 and b.info()["registered_bytes"] == 0

        # register(): a CUDA tensor by CUDA IPC, on its own device.
        reg = a.register(x, name="cuda-x")
        assert reg.device == "cuda:0" and reg.length == x.numel() * 4 and reg.owned
        # And a ferry GPU buffer's torch view travels from its buffer, as on a simulated GPU.
        y = ferry.empty((256, 256), "float32", device="cuda:0", like="torch", client=b)
        y.fill_(7.0)
        torch.cuda.synchronize()
        done = b.send_async(y, "node-a", "cuda/y")
        back = a.recv("node-b", "cuda/y", like="torch", timeout=60)
        done.result(60)
        assert torch.equal(back.cpu() if back.is_cuda else back, y.cpu())
        a.deregister(reg)
    print("python CUDA tensors: ok (send from a CUDA IPC registration, recv into a CUDA "
          "tensor, register, a ferry GPU buffer's torch view)")


if __name__ == "__main__":
    main()
