"""What the stacks of busy ranks cost: py-spy's own CPU, counted with hangd's.

python -m benchmarks.busy_stacks [--ranks R] [--threads T] [--dumps N] [--json]
-> {"dump_cpu_ms", "every_s", "ranks", "share_of_a_core_pct", ...}

A job whose ranks are busy on their GPUs has one rank's stack taken in turn every
``Thresholds.busy_stack_every_s`` (asks.busy_phase_stacks): one ``py-spy dump --nonblocking`` per job
per period, whatever the job's size. This runs R real Python processes with T threads each (torch
ranks run dozens: NCCL's, gloo's, the watchdog's) busy on the CPU, takes N dumps in that turn, and
reports py-spy's CPU per dump (its own process: user + system, from the kernel's accounting) and the
share of one core the schedule costs. The target (BENCHMARKS.md): at most 1% of one core for 8 busy
ranks.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import emit
from hangd.analysis.thresholds import Thresholds

RANK = """import threading, time
def spin():
    while True:
        sum(range(1000)); time.sleep(0.001)
for _ in range(int(__import__('sys').argv[1])):
    threading.Thread(target=spin, daemon=True).start()
while True:
    sum(range(10000))
"""


def _arg(name: str, default: int) -> int:
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def measure(ranks: int = 8, threads: int = 24, dumps: int = 24) -> dict[str, float | int | str]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(threads)]) for _ in range(ranks)]
    try:
        time.sleep(1.0)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        for i in range(dumps):
            subprocess.run([spy, "dump", "--nonblocking", "--json", "--pid", str(procs[i % ranks].pid)],
                           capture_output=True, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / dumps
    every = Thresholds().busy_stack_every_s
    return {"ranks": ranks, "threads_per_rank": threads, "dumps": dumps, "dump_cpu_ms": round(cpu * 1e3, 2),
            "every_s": every, "share_of_a_core_pct": round(cpu / every * 100, 3), "target_pct": 1.0}


def main() -> None:
    emit(measure(_arg("--ranks", 8), _arg("--threads", 24), _arg("--dumps", 24)),
         "py-spy's CPU for the stacks of busy ranks (one dump per job per busy_stack_every_s)")


if __name__ == "__main__":
    main()
