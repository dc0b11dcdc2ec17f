"""Each /proc read a tick makes, by hangd's reader and by psutil, on one process; and the
thread-name scan that finds torch.distributed threads.

Why it exists: psutil is a test dependency and hangd reads /proc by hand; this says which is
faster for which read. ``python -m benchmarks.procread [--json]``"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil

from benchmarks.common import emit
from hangd.sources.fdwait import FdWaits
from hangd.sources.procfs import ProcSource
from hangd.sources.procparse import _parse_io, _read_bytes, _stat_fields, _status_field

N = 1000
# a process with the thread count of a torch rank (gloo/NCCL, the CUDA driver, data-loader pins)
# a rank reading its DataLoader's queue, fed by eight worker processes (fork), each holding the pipes
LOADER = ("import multiprocessing as mp, time\n"
          "def work(q):\n    time.sleep(1e6)\n"
          "if __name__ == '__main__':\n    q = mp.get_context('fork').Queue()\n"
          "    ws = [mp.get_context('fork').Process(target=work, args=(q,)) for _ in range(8)]\n"
          "    [w.start() for w in ws]\n    print(' '.join(str(w.pid) for w in ws), flush=True)\n"
          "    while True:\n        try:\n            q.get(timeout=60)\n        except Exception:\n            pass\n")
THREADED = "import threading, time\nfor _ in range({n}):\n    threading.Thread(target=time.sleep, args=(1e6,), daemon=True).start()\ntime.sleep(1e6)"


def hand_stat(pid: int) -> Any:
    return _stat_fields(_read_bytes(f"/proc/{pid}/stat") or b"")


def psutil_stat(p: psutil.Process) -> Any:
    # the same facts: state, ppid, CPU times, start time (psutil reads stat once inside oneshot)
    with p.oneshot():
        return p.status(), p.ppid(), p.cpu_times(), p.create_time()


def hand_status(pid: int) -> Any:
    raw = _read_bytes(f"/proc/{pid}/status") or b""
    return _status_field(raw, b"\nvoluntary_ctxt_switches:"), _status_field(raw, b"\nnonvoluntary_ctxt_switches:")


def psutil_status(p: psutil.Process) -> Any:
    return p.num_ctx_switches()


def hand_io(pid: int) -> Any:
    return _parse_io(_read_bytes(f"/proc/{pid}/io") or b"")


def psutil_io(p: psutil.Process) -> Any:
    return p.io_counters()


def hand_all(pid: int) -> None:
    hand_stat(pid)
    hand_status(pid)
    hand_io(pid)


def psutil_all(p: psutil.Process) -> None:
    with p.oneshot():
        p.status()
        p.ppid()
        p.cpu_times()
        p.num_threads()
        p.memory_info()
        p.num_ctx_switches()
        p.io_counters()


def per_call_us(fn: Callable[[Any], Any], arg: Any, n: int = N) -> float:
    for _ in range(50):  # warm the page cache and the interpreter
        fn(arg)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(arg)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main() -> None:
    pid = os.getpid()
    p = psutil.Process(pid)
    out: dict[str, Any] = {"iterations": N, "psutil_version": psutil.__version__}
    for name, h, ps in (("stat", hand_stat, psutil_stat), ("status", hand_status, psutil_status), ("io", hand_io, psutil_io),
                        ("stat_status_io", hand_all, psutil_all)):
        out[f"{name}_hand_us"] = round(per_call_us(h, pid), 1)
        out[f"{name}_psutil_us"] = round(per_call_us(ps, p), 1)
        out[f"{name}_psutil_over_hand"] = round(out[f"{name}_psutil_us"] / out[f"{name}_hand_us"], 2)
    # The scan for torch.distributed threads: one comm file per thread, every DIST_SCAN_EVERY_S for
    # a young python process. psutil has no thread names to offer (threads() gives ids and times).
    src = ProcSource()
    for threads in (16, 64):
        child = subprocess.Popen([sys.executable, "-c", THREADED.format(n=threads)])
        try:
            time.sleep(1.0)
            out[f"dist_scan_{threads}_threads_us"] = round(per_call_us(src._dist_threads, child.pid, 200), 1)
            seen: set[str] = set()
            src._dist_threads(child.pid, seen)  # the first scan of a process reads every thread's name
            out[f"dist_rescan_{threads}_threads_us"] = round(per_call_us(lambda q, s=seen: src._dist_threads(q, s), child.pid, 200), 1)
            out[f"thread_states_{threads}_threads_us"] = round(per_call_us(lambda q: src._thread_states(q, 0), child.pid, 200), 1)
        finally:
            child.kill()
            child.wait()
    # What a rank waits on (its syscall, descriptors, who holds their other ends): read fresh, as on
    # the first tick of a wait or every REFRESH_S after; the ticks between reuse it for one read.
    rank = subprocess.Popen([sys.executable, "-c", LOADER], stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout is not None
        workers = [int(x) for x in rank.stdout.readline().split()]
        time.sleep(0.5)
        fw = FdWaits()
        text = open(f"/proc/{rank.pid}/syscall").read()

        def fresh(pid: int) -> Any:
            fw._tables, fw._tcp, fw._diag, fw._budget = {}, {}, {}, 1 << 20
            fw._watched = [pid, *workers]
            return fw.read(pid, text)

        out["fd_wait_resolve_8_workers_us"] = round(per_call_us(fresh, rank.pid, 100), 1)
        out["fd_wait_syscall_read_us"] = round(per_call_us(lambda q: open(f"/proc/{q}/syscall").read(), rank.pid), 1)
    finally:
        for w in workers:
            os.kill(w, 9)
        rank.kill()
        rank.wait()
    emit(out, f"one process's /proc reads, best of 5 x {N}")


if __name__ == "__main__":
    main()
