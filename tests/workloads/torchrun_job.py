"""A gloo (CPU) job meant to be started by real torchrun, the way users run one:

    python -m torch.distributed.run --nproc-per-node 2 --master-port P torchrun_job.py MODE ...

Every rank first prints ``rank R pid P ready`` (the tests map ranks to pids from it), then:

  train        --steps all_reduce steps with log lines, then a clean exit (exit status 0)
  deadlock     after --steps steps rank --culprit stops calling collectives and waits on an Event
               forever; the other ranks block in the next all_reduce
  slow_reader  --steps training steps, then rank --culprit reads --read-file in --chunk-mb chunks with
               --chunk-sleep between them for --read-s seconds, dropping the file from the page cache
               before every pass so each read goes to the disk; the others wait in dist.barrier();
               then both meet, take a last step and exit cleanly. The reader prints its
               /proc/self/io before and after (``io ...`` lines).
  lone         not for torchrun: one process, world size 1 from the environment, sleeping --sleep s

With --fr-watchdog S every rank dumps its flight recorder (torch's own ``_dump_fr_trace``, gloo
records when TORCH_FR_BUFFER_SIZE is set) where TORCH_FR_DUMP_TEMP_FILE says, once no step has
completed for S seconds: what PyTorch's NCCL watchdog does on a timeout, which gloo lacks.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist

RANK = -1
LAST_STEP = time.monotonic()


def fr_watchdog(timeout: float) -> None:
    while time.monotonic() - LAST_STEP < timeout:
        time.sleep(0.2)
    from torch._C._distributed_c10d import _dump_fr_trace

    prefix = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
    log(f"watchdog: no step for {timeout:.0f} s, dumping the flight recorder to {prefix}{RANK}")
    with open(f"{prefix}{RANK}.tmp", "wb") as f:
        f.write(_dump_fr_trace())
    os.replace(f"{prefix}{RANK}.tmp", f"{prefix}{RANK}")


def log(msg: str) -> None:
    print(f"[rank{RANK}] {time.strftime('%H:%M:%S')} {msg}", flush=True)


def proc_io() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, _, v in (line.partition(": ") for line in f.read().splitlines()) if v}


def train(steps: int, step_sleep: float, x: torch.Tensor, first: int = 0) -> int:
    global LAST_STEP
    for step in range(first, first + steps):
        dist.all_reduce(x)
        LAST_STEP = time.monotonic()
        x.fill_(1.0)
        if (step + 1) % 10 == 0:
            log(f"step {step + 1} loss {1.0 / (step + 1):.4f}")
        time.sleep(step_sleep)
    return first + steps


def slow_read(path: str, seconds: float, chunk: int, pause: float, drop: bool = True) -> int:
    """Read ``path`` in ``chunk``s with ``pause`` between them for ``seconds``, again and again; with
    ``drop`` each pass first drops the file from the page cache (the reads reach the disk)."""
    before, t0, total = proc_io(), time.monotonic(), 0
    log(f"io before read_bytes={before.get('read_bytes')} rchar={before.get('rchar')}")
    fd = os.open(path, os.O_RDONLY)
    try:
        while time.monotonic() - t0 < seconds:
            if drop:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            off = 0
            while time.monotonic() - t0 < seconds:
                b = os.pread(fd, chunk, off)
                if not b:
                    break
                off += len(b)
                total += len(b)
                time.sleep(pause)
    finally:
        os.close(fd)
    after, dt = proc_io(), time.monotonic() - t0
    log(f"io after read_bytes={after.get('read_bytes')} rchar={after.get('rchar')} "
        f"read {total} B in {dt:.1f} s ({total / dt / 1e6:.0f} MB/s; disk read_bytes "
        f"{(after.get('read_bytes', 0) - before.get('read_bytes', 0)) / dt / 1e6:.0f} MB/s)")
    return total


def main() -> None:
    global RANK
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["train", "deadlock", "slow_reader", "lone"])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--culprit", type=int, default=1)
    p.add_argument("--size", type=int, default=1 << 16)
    p.add_argument("--read-file", default="")
    p.add_argument("--read-s", type=float, default=40.0)
    p.add_argument("--chunk-mb", type=float, default=4.0)
    p.add_argument("--chunk-sleep", type=float, default=0.03)
    p.add_argument("--sleep", type=float, default=40.0)
    p.add_argument("--fr-watchdog", type=float, default=0.0, help="dump the flight recorder after this long without a step")
    a = p.parse_args()
    dist.init_process_group("gloo")
    RANK = dist.get_rank()
    log(f"rank {RANK} pid {os.getpid()} ready world {dist.get_world_size()} mode {a.mode}")
    if a.fr_watchdog > 0:
        threading.Thread(target=fr_watchdog, args=(a.fr_watchdog,), daemon=True).start()
    x = torch.ones(a.size)
    if a.mode == "lone":
        time.sleep(a.sleep)
    elif a.mode == "train":
        train(a.steps, a.step_sleep, x)
    elif a.mode == "deadlock":
        train(a.steps, a.step_sleep, x)
        if RANK == a.culprit:
            log(f"culprit: waiting on an event that never comes (t={time.time():.3f})")
            threading.Event().wait()
        log("entering all_reduce")
        dist.all_reduce(x)
    elif a.mode == "slow_reader":
        step = train(a.steps, a.step_sleep, x)
        if RANK == a.culprit:
            log(f"reading {a.read_file} for {a.read_s:.0f} s")
            slow_read(a.read_file, a.read_s, int(a.chunk_mb * (1 << 20)), a.chunk_sleep)
        else:
            log(f"waiting in barrier for rank {a.culprit}")
        dist.barrier()
        train(1, 0.0, x, step)
    log("done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
