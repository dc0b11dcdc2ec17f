"""What hangd costs: CPU (core fraction), peak RSS and tick time while `hangd serve` watches
10, 100 and 500 real processes at 1 Hz, next to a plain read of the same processes' stat,
status and io once a second in the same run (``cpu_over_plain_read``: hangd's CPU over that floor,
which moves little with the machine's load; the figures themselves do).

python -m benchmarks.overhead [--json] [--seconds S] [--sizes 10,100,500] [--gpus G]
-> {"cpu_core_fraction", "rss_bytes", "tick_seconds_p50", "tick_seconds_p99", "watched_processes", "gpus", "runs": [...]}
The headline numbers are those of the largest size. Processes are real (`python -c sleep`, one in
ten writing a log line a second) with a torch.distributed environment, so hangd watches them all;
hangd is told to watch processes by a variable of their own (``HANGD_JOB_ENV``), so that other
jobs on the same host are not in the figures. On a host without GPUs the NVML part is absent, or,
with ``--gpus G``, replayed from readings recorded on H200s for G GPUs held by the first G
processes (``benchmarks.replayed_serve``): the GPU side of the analysis, the store and the API
then do their per-GPU work; NVML's own calls cost ~0.9 ms per tick for 2 H200s
(tests/data/traces/h200x2-live/nvml-h200.json)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from benchmarks.common import emit
from benchmarks.cost import plain_read

ROOT = Path(__file__).resolve().parent.parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _quantile(text: str, q: float) -> float | None:
    """A quantile from the hangd_tick_duration_seconds histogram (linear within a bucket, as Prometheus does)."""
    buckets = [(float(le), float(v)) for le, v in re.findall(r'hangd_tick_duration_seconds_bucket\{le="([^"]+)"\} ([\d.e+]+)', text)
               if le != "+Inf"]
    total = re.search(r"hangd_tick_duration_seconds_count ([\d.e+]+)", text)
    if not buckets or not total or float(total.group(1)) == 0:
        return None
    n = float(total.group(1))
    rank = q * n
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            return prev_le + (le - prev_le) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 1.0)
        prev_le, prev_c = le, c
    return buckets[-1][0]


@dataclass
class Running:
    serve: subprocess.Popen[bytes]
    procs: list[subprocess.Popen[bytes]]
    url: str


# a variable of this run's own: two benchmarks running at once must not watch each other's processes
JOB_ENV = f"HANGD_OVERHEAD_BENCH_JOB_{os.getpid()}"


def started(n: int, gpus: int = 0) -> Running:
    """N processes with a torch.distributed environment (one in ten writing a log line a second)
    and a ``hangd serve`` at 1 Hz that watches them all, warmed up; with ``gpus``, that many
    replayed GPUs held by the first processes."""
    tmp = Path(tempfile.mkdtemp(prefix="hangd-bench-"))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29999", WORLD_SIZE=str(n), **{JOB_ENV: "1"})
    procs = []
    for i in range(n):
        code = ("import time,sys\nwhile True:\n print('tick', flush=True); time.sleep(1)" if i % 10 == 0
                else "import time; time.sleep(1e6)")
        out = open(tmp / f"p{i}.log", "w")  # noqa: SIM115 - the process holds it
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=dict(env, RANK=str(i)), stdout=out,
                                      stderr=subprocess.STDOUT))
    port = _port()
    serve_env = dict(os.environ, HANGD_JOB_ENV=JOB_ENV)
    entry = ["hangd"]
    if gpus:
        entry = ["benchmarks.replayed_serve"]
        serve_env.update(HANGD_BENCH_GPUS=str(gpus), HANGD_BENCH_GPU_PIDS=",".join(str(p.pid) for p in procs[:gpus]))
    serve = subprocess.Popen([sys.executable, "-m", *entry, "serve", "--listen", f"127.0.0.1:{port}", "--interval", "1",
                              "--db", f"sqlite:///{tmp / 'h.db'}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=serve_env)
    url = f"http://127.0.0.1:{port}"
    t_end = time.time() + 60
    while time.time() < t_end:
        try:
            if len(httpx.get(url + "/processes", timeout=5).json()) >= n:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    time.sleep(5)  # warm: every process seen, static facts read
    return Running(serve, procs, url)


def stopped(run: Running) -> None:
    run.serve.terminate()
    run.serve.wait(20)
    for x in run.procs:
        x.kill()
    for x in run.procs:
        x.wait()


def run(n: int, seconds: float, gpus: int = 0) -> dict:
    r = started(n, gpus)
    try:
        p = psutil.Process(r.serve.pid)
        pids = [int(x["pid"]) for x in httpx.get(r.url + "/processes", timeout=10).json()]
        c0, t0 = p.cpu_times(), time.monotonic()
        rss, plain = 0, 0.0
        while time.monotonic() - t0 < seconds:
            rss = max(rss, p.memory_info().rss)
            # the same files a plain /proc monitor would read for the same processes, in this
            # process, once a second like hangd: the floor hangd's own figure is compared with
            p0 = time.thread_time()
            plain_read(pids)
            plain += time.thread_time() - p0
            time.sleep(1)
        c1, t1 = p.cpu_times(), time.monotonic()
        metrics = httpx.get(r.url + "/metrics", timeout=10).text
        watched = len(httpx.get(r.url + "/processes", timeout=10).json())
        cpu = ((c1.user + c1.system) - (c0.user + c0.system)) / (t1 - t0)
        plain_frac = plain / (t1 - t0)
        return {"processes": n, "gpus": gpus, "watched_processes": watched, "cpu_core_fraction": round(cpu, 4), "rss_bytes": rss,
                "plain_read_core_fraction": round(plain_frac, 5),
                "cpu_over_plain_read": round(cpu / plain_frac, 1) if plain_frac > 0 else None,
                "tick_seconds_p50": _quantile(metrics, 0.5), "tick_seconds_p99": _quantile(metrics, 0.99),
                "load_avg_1m": os.getloadavg()[0]}
    finally:
        stopped(r)


def main() -> None:
    seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 30.0
    sizes = [int(x) for x in sys.argv[sys.argv.index("--sizes") + 1].split(",")] if "--sizes" in sys.argv else [10, 100, 500]
    gpus = int(sys.argv[sys.argv.index("--gpus") + 1]) if "--gpus" in sys.argv else 0
    runs = [run(n, seconds, gpus) for n in sizes]
    head = runs[-1]
    emit({"cpu_core_fraction": head["cpu_core_fraction"], "rss_bytes": head["rss_bytes"],
          "tick_seconds_p50": head["tick_seconds_p50"], "tick_seconds_p99": head["tick_seconds_p99"],
          "watched_processes": head["watched_processes"], "gpus": gpus, "runs": runs},
         f"hangd serve at 1 Hz, {seconds:.0f} s per size")


if __name__ == "__main__":
    main()
