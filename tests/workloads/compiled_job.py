"""A gloo (CPU) training job the way third-party code is written, for real torchrun:

    python -m torch.distributed.run --nproc-per-node 2 --master-port P compiled_job.py MODE --steps N

A ``torch.utils.data.DataLoader`` with worker processes (children of every rank that inherit its
RANK, WORLD_SIZE and MASTER_* environment) feeds a model wrapped in ``torch.compile`` (inductor on
the CPU: minutes of compiling with no collective, on a small machine), and every step all-reduces
the gradients. Every rank prints ``rank R pid P ready`` first and ``compiled`` after the first step.

  train     --steps steps, then a clean exit
  deadlock  after --steps steps rank --culprit stops calling collectives and waits on an Event
            forever (its DataLoader workers stay alive); the other ranks block in the next all_reduce
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Numbers(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.001)  # a worker reads and decodes a sample
        return torch.full((64,), float(i % 7))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("train", "deadlock"))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--culprit", type=int, default=1)
    ap.add_argument("--step-sleep", type=float, default=0.05)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"rank {rank} pid {os.getpid()} ready", flush=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 1))
    step_fn = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(Numbers(), batch_size=16, num_workers=2, persistent_workers=True)
    for step, x in enumerate(loader):
        loss = step_fn(x).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        if step == 0:
            print(f"[rank{rank}] compiled", flush=True)
        if (step + 1) % 20 == 0:
            print(f"[rank{rank}] step {step + 1} loss {loss.item():.4f}", flush=True)
        if step + 1 >= a.steps:
            break
        time.sleep(a.step_sleep)
    if a.mode == "deadlock":
        if rank == a.culprit:
            print(f"[rank{rank}] waiting for an event nobody sets", flush=True)
            threading.Event().wait()
        x = torch.ones(1)
        dist.all_reduce(x)  # blocks: the culprit never joins
    print(f"[rank{rank}] done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
