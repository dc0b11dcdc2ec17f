"""One process's stat + status + io, read N times: hangd's /proc reader against psutil's.

Why it exists: psutil was a runtime dependency, yet hangd/sources/procfs.py reads /proc by hand.
This measures whether psutil would be the faster way to read what a tick needs.
``python -m benchmarks.procread [--json]``"""

from __future__ import annotations

import os
import time

import psutil

from benchmarks.common import emit
from hangd.sources.procfs import _read, parse_kv, parse_stat

N = 1000


def hand(pid: int) -> None:
    parse_stat(_read(f"/proc/{pid}/stat") or "")
    for line in (_read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt", "VmSwap")):
            line.partition(":")
    parse_kv(_read(f"/proc/{pid}/io") or "")


def with_psutil(p: psutil.Process) -> None:
    # the same facts: state, ppid, CPU times, threads, RSS (stat); context switches, swap (status); I/O
    with p.oneshot():
        p.status()
        p.ppid()
        p.cpu_times()
        p.num_threads()
        p.memory_info()
        p.num_ctx_switches()
        p.io_counters()


def per_call_us(fn, arg) -> float:  # type: ignore[no-untyped-def]
    for _ in range(50):  # warm the page cache and the interpreter
        fn(arg)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(N):
            fn(arg)
        best = min(best, (time.perf_counter() - t0) / N * 1e6)
    return best


def main() -> None:
    pid = os.getpid()
    h = per_call_us(hand, pid)
    p = per_call_us(with_psutil, psutil.Process(pid))
    emit({"iterations": N, "hand_us_per_read": h, "psutil_us_per_read": p, "psutil_over_hand": p / h,
          "psutil_version": psutil.__version__}, f"one process's stat+status+io, best of 5 x {N}")


if __name__ == "__main__":
    main()
