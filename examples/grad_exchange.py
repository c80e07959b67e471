#!/usr/bin/env python3
"""Two ranks train one small model data-parallel: each step they exchange gradients through
ferry (send/recv, zero copy from agent buffers), average them and take the same step, so the
two replicas stay identical. Run: PYTHONPATH=<build>/python FERRYD=<build>/server/ferryd
python3 examples/grad_exchange.py   (starts two agents, then one process per rank).
"""
import subprocess
import sys

import torch

import ferry

STEPS = 5


def rank_main(rank, socket):
    peer = f"rank{1 - rank}"
    torch.manual_seed(0)  # same initial weights on both ranks
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(100 + rank)  # each rank sees its own data
    client = ferry.Client(socket)
    # One flat gradient buffer in agent memory: sent without copies.
    numel = sum(p.numel() for p in model.parameters())
    flat = client.empty((numel,), "float32", like="torch")
    device = "cuda" if torch.cuda.is_available() else "cpu"  # host buffers here either way
    for step in range(STEPS):
        x = torch.randn(16, 32, generator=data)
        y = torch.randn(16, 4, generator=data)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        torch.cat([p.grad.flatten() for p in model.parameters()], out=flat)
        incoming = client.recv_async(peer, f"grad/{step}", like="torch", timeout=30)
        client.send(flat, peer, f"grad/{step}", timeout=30)
        theirs = incoming.result()
        assert theirs.shape == flat.shape and theirs.dtype == torch.float32
        avg = (flat + theirs) / 2
        offset = 0
        for p in model.parameters():
            p.grad.copy_(avg[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        opt.step()
    checksum = sum(float(p.double().sum()) for p in model.parameters())
    print(f"rank{rank} ({device}): {STEPS} steps, parameter checksum {checksum:.12f}", flush=True)


def main():
    with ferry.launch.agents(["rank0", "rank1"], host_pool="256MiB") as nodes:
        procs = [subprocess.Popen([sys.executable, __file__, str(r), nodes[f"rank{r}"].socket],
                                  stdout=subprocess.PIPE, text=True) for r in (0, 1)]
        outs = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            outs.append(out.strip())
            print(out, end="")
        if any(p.returncode != 0 for p in procs):
            print("grad_exchange: a rank failed", file=sys.stderr)
            return 1
        sums = {o.rsplit(" ", 1)[-1] for o in outs}
        if len(sums) != 1:
            print(f"grad_exchange: replicas diverged: {sums}", file=sys.stderr)
            return 1
        print("grad_exchange: replicas identical after every step's gradient exchange")
        return 0


if __name__ == "__main__":
    if len(sys.argv) == 3:
        rank_main(int(sys.argv[1]), sys.argv[2])
    else:
        sys.exit(main())
