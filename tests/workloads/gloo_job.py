"""A real 2+-rank torch job over gloo (CPU), used by the tests.

Modes:
  train      all ranks all_reduce every step and log, for --steps steps (or forever with 0)
  deadlock   after --steps steps, rank --culprit stops calling collectives and waits on an
             Event forever; the others block in the next all_reduce
  skip       rank --culprit skips the collective after --steps steps; every rank dumps its
             flight recorder (pickle and JSON) into --dump-dir, then exits
  size       rank --culprit passes a larger tensor to the collective after --steps steps;
             every rank dumps, then exits
  sleep      rank --culprit sleeps --sleep seconds every step (a straggler)
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import torch
import torch.distributed as dist


def log(msg: str) -> None:
    print(f"[rank{RANK}] {time.strftime('%H:%M:%S')} {msg}", flush=True)


def dump(dump_dir: str) -> None:
    """Dump this rank's flight recorder through torch's API, as pickle and as JSON; also where
    TORCH_FR_DUMP_TEMP_FILE says, as PyTorch's watchdog would (hangd picks it up there)."""
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    pickled = _dump_fr_trace()
    if dump_dir:
        for sub, data in (("pickle", pickled), ("json", _dump_fr_trace_json())):
            os.makedirs(os.path.join(dump_dir, sub), exist_ok=True)
            with open(os.path.join(dump_dir, sub, f"fr_rank_{RANK}"), "wb") as f:
                f.write(data)
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
    if prefix:
        with open(f"{prefix}{RANK}.tmp", "wb") as f:
            f.write(pickled)
        os.replace(f"{prefix}{RANK}.tmp", f"{prefix}{RANK}")


class Watchdog(threading.Thread):
    """Like PyTorch's NCCL watchdog, for gloo: when no step completes for ``timeout`` seconds, dump
    the flight recorder once (the job keeps hanging; nobody signals it)."""

    def __init__(self, timeout: float) -> None:
        super().__init__(daemon=True)
        self.timeout = timeout
        self.last = time.monotonic()

    def run(self) -> None:
        while time.monotonic() - self.last < self.timeout:
            time.sleep(0.5)
        log(f"watchdog: no step for {self.timeout:.0f} s, dumping the flight recorder")
        dump("")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--culprit", type=int, default=1)
    p.add_argument("--size", type=int, default=1 << 16)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--sleep", type=float, default=3.0)
    p.add_argument("--dump-dir", default="")
    p.add_argument("--watchdog", type=float, default=0.0, help="dump the flight recorder after this long without a step")
    a = p.parse_args()
    dist.init_process_group("gloo")
    log(f"phase {a.mode} world {dist.get_world_size()}")
    dog = Watchdog(a.watchdog) if a.watchdog > 0 else None
    if dog is not None:
        dog.start()
    x = torch.ones(a.size)
    step = 0
    while a.steps == 0 or step < a.steps or a.mode in ("deadlock", "sleep"):
        if a.mode == "deadlock" and step >= a.steps and RANK == a.culprit:
            log(f"culprit: waiting on an event that never comes (t={time.time():.3f})")
            threading.Event().wait()
        if a.mode == "sleep" and RANK == a.culprit:
            time.sleep(a.sleep)
        if a.mode in ("skip", "size") and step == a.steps:
            break
        try:
            dist.all_reduce(x)
        except RuntimeError as e:  # a peer died: linger like a rank stuck in teardown
            log(f"collective failed, peer gone: {str(e).splitlines()[0][:120]}")
            threading.Event().wait()
        x.fill_(1.0)
        step += 1
        if dog is not None:
            dog.last = time.monotonic()
        if step % 5 == 0:
            log(f"step {step}")
        time.sleep(a.step_sleep)
    if a.mode == "skip":
        if RANK != a.culprit:
            dist.all_reduce(x, async_op=True)
        time.sleep(0.5)
        dump(a.dump_dir)
        log("dumped")
        time.sleep(1.0)
        os._exit(0)
    if a.mode == "size":
        if RANK == a.culprit:
            # gloo aborts the receiving side on a size mismatch: let the others dump first
            prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE", "")
            others = [f"{prefix}{r}" for r in range(dist.get_world_size()) if r != RANK]
            t_end = time.time() + 30
            while prefix and time.time() < t_end and not all(os.path.exists(p) for p in others):
                time.sleep(0.1)
            time.sleep(0.5 if prefix else 1.5)
        dist.all_reduce(torch.ones(a.size * (2 if RANK == a.culprit else 1)), async_op=True)
        time.sleep(0.2)
        dump(a.dump_dir)
        log("dumped")
        time.sleep(2.0)
        os._exit(0)
    log("done")
    dist.destroy_process_group()


RANK = int(os.environ.get("RANK", "0"))

if __name__ == "__main__":
    sys.exit(main())
