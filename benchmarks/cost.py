"""What one tick costs per watched process, in hangd's own thread, against a plain read of the same
/proc files in the same run.

python -m benchmarks.cost [--json] [--ranks R] [--children C] [--gpus G] [--ticks T] [--interval S]
-> {"watched", "tick_cpu_ms", "plain_read_ms", "ratio", "tick_cpu_us_per_process", ...}

The loop is the daemon's (every source, then the analysis), run in this process so that its CPU
time is measured with ``time.thread_time`` and nothing else (no store, no HTTP). Half an interval
after each tick (a sleep first, as before the tick: both start with cold caches) the same thread
reads stat, status and io of every process the tick watched with bare ``os.open``/``os.read``: the
least any /proc-reading monitor pays. The ratio of the two medians
is what hangd adds over reading, and it does not move with the machine's speed or load, which
is why tests/test_tick_cost.py checks it against ``benchmarks/results/cost-ratio.json``.

Processes are real: R ranks (``python -c sleep`` with a torch.distributed environment), each
with C children that inherit its environment as data-loader workers do. With G > 0, NVML
readings recorded on 2 H200s (tests/data/traces/h200x2-live/nccl_stall) are replayed for G GPUs,
one held by each of the first G ranks, so the analysis does its per-GPU work; NVML's own calls
are not made (no driver here; their cost on H200 is in BENCHMARKS.md).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import emit
from hangd.analysis.engine import Analyzer
from hangd.config import Settings
from hangd.snapshot import GpuProc, GpuSample, Snapshot
from hangd.sources.live import LiveNode

ROOT = Path(__file__).resolve().parent.parent
GPU_TRACE = ROOT / "tests" / "data" / "traces" / "h200x2-live" / "nccl_stall"

RANK_CODE = """import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1e6)"]) for _ in range(int(sys.argv[1]))]
i = 0
while True:
    i += 1
    if int(sys.argv[2]) and i % 10 == 0:
        print("step", i, flush=True)
    time.sleep(0.1)
"""


# Processes are watched by this variable in their environment (and by nothing else of the
# host's: other jobs running beside the measurement would add their own analysis to it).
JOB_ENV = "HANGD_COST_BENCH_JOB"


def spawn(ranks: int, children: int, logdir: Path) -> list[subprocess.Popen[bytes]]:
    """R ranks, each with C children; one rank in four writes a log line a second."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29998", WORLD_SIZE=str(ranks), **{JOB_ENV: "1"})
    out = []
    for r in range(ranks):
        log = open(logdir / f"rank{r}.log", "w")  # noqa: SIM115 - the rank holds it
        out.append(subprocess.Popen([sys.executable, "-c", RANK_CODE, str(children), str(int(r % 4 == 0))],
                                    env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=log, stderr=subprocess.STDOUT))
    return out


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    import psutil  # test and benchmark dependency

    for p in procs:
        try:
            kids = psutil.Process(p.pid).children(recursive=True)
        except psutil.Error:
            kids = []
        for k in kids:
            try:
                k.kill()
            except psutil.Error:
                pass
        p.kill()
        p.wait()


class ReplayedGpus:
    """NVML readings recorded on H200s, replayed for ``count`` GPUs held by ``holders``."""

    name = "nvml"

    def __init__(self, count: int, holders: list[int]) -> None:
        from hangd.trace import TraceReader

        self.frames = [s.gpus for s in TraceReader(GPU_TRACE).snapshots() if s.gpus and any(g.procs for g in s.gpus)]
        self.count, self.holders, self.i = count, holders, 0

    def collect(self, snap: Snapshot) -> None:
        frame = self.frames[self.i % len(self.frames)]
        self.i += 1
        for j in range(self.count):
            g: GpuSample = frame[j % len(frame)]
            pid = self.holders[j % len(self.holders)]
            used = g.procs[0].used if g.procs else None
            util = [dict(u, pid=pid) for u in (g.proc_util or [])[:1]]
            snap.gpus.append(dataclasses.replace(g, index=j, uuid=f"GPU-replayed-{j}", procs=[GpuProc(pid=pid, used=used)],
                                                 proc_util=util or None))


def plain_read(pids: list[int]) -> None:
    """stat, status and io of each pid, read and thrown away: the floor of any /proc monitor."""
    for pid in pids:
        for name in ("stat", "status", "io"):
            try:
                fd = os.open(f"/proc/{pid}/{name}", os.O_RDONLY)
            except OSError:
                continue
            try:
                os.read(fd, 65536)
            except OSError:
                pass
            finally:
                os.close(fd)


def measure(ranks: int, children: int, gpus: int = 0, ticks: int = 20, interval: float = 0.5, warm: int = 4) -> dict:
    import tempfile

    logdir = Path(tempfile.mkdtemp(prefix="hangd-cost-"))
    procs = spawn(ranks, children, logdir)
    try:
        time.sleep(1.5 + 0.02 * ranks * (1 + children))  # the ranks start their children
        settings = Settings(nvml=False, stacks=False, job_env=[JOB_ENV])
        node = LiveNode(settings)
        if gpus:
            node.runner.sources[0] = ReplayedGpus(gpus, [p.pid for p in procs])
        analyzer = Analyzer()
        tick_cpu, plain, wall, watched = [], [], [], []
        for i in range(warm + ticks):
            w0, c0 = time.perf_counter(), time.thread_time()
            snap = node.sample()
            analyzer.step(snap)
            node.request(analyzer.take_requests())
            analyzer.drain()
            c1, w1 = time.thread_time(), time.perf_counter()
            pids = [p.pid for p in snap.procs if not p.gone]
            # the plain read after a sleep of its own, as the tick comes after one: read right after
            # the tick, with the tick's caches still warm, it costs a third less (0.35 ms against
            # 0.55 ms here), and the ratio would count that against hangd
            time.sleep(interval / 2)
            c2 = time.thread_time()
            plain_read(pids)
            c3 = time.thread_time()
            if i >= warm:  # the first ticks read every process's static facts once
                tick_cpu.append(c1 - c0)
                plain.append(c3 - c2)
                wall.append(w1 - w0)
                watched.append(len(pids))
            time.sleep(interval / 2)
        n = statistics.median(watched)
        tc, pr = statistics.median(tick_cpu), statistics.median(plain)
        states: dict[str, int] = {}
        for p in analyzer.processes():
            states[str(p.get("state"))] = states.get(str(p.get("state")), 0) + 1
        return {"ranks": ranks, "children_per_rank": children, "gpus": gpus, "watched": n, "ticks": ticks,
                "tick_cpu_ms": round(tc * 1e3, 3), "plain_read_ms": round(pr * 1e3, 3),
                "ratio": round(tc / pr, 2) if pr > 0 else None,
                "tick_cpu_us_per_process": round(tc / n * 1e6, 1) if n else None,
                "tick_wall_ms_p50": round(statistics.median(wall) * 1e3, 3),
                "tick_wall_ms_max": round(max(wall) * 1e3, 3), "states": states}
    finally:
        stop(procs)


def _arg(name: str, default: float) -> float:
    return float(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def main() -> None:
    r = measure(int(_arg("--ranks", 16)), int(_arg("--children", 3)), int(_arg("--gpus", 0)),
                int(_arg("--ticks", 20)), _arg("--interval", 0.5))
    emit(r, "one tick in hangd's thread against a plain read of the same /proc files")


if __name__ == "__main__":
    main()
