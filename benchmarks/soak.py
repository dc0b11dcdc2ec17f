"""A long soak of job churn: does hangd's memory stay flat for as long as the daemon lives?

python -m benchmarks.soak [--json] [--minutes M] [--every S] [--out FILE]
A real `hangd serve --interval 1` watches a new 2-rank "job" every ``--every`` seconds (plain
processes with a torch.distributed environment and a launcher, each living a few seconds; rank 0
writes ``[rank0]: step N`` lines to a log file of its own, as a job launched with its output
redirected does, rank 1 writes nothing), for ``--minutes``. Every minute it records hangd's RSS and
CPU time, the processes `/processes` still lists, and what the analysis reports it dropped from
memory (`hangd_analysis_forgotten_total`). The result says whether RSS grew after the first
minutes: the growth from minute 5 and from minute 10 to the end, and the least-squares slope of
RSS over minutes 10 to the end in MiB per hour (0 is flat).

Run it in a PID namespace of its own, so that hangd sees only the soak's processes:
``unshare --pid --fork --mount-proc python -m benchmarks.soak ...`` (as root).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from benchmarks.common import emit

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = """
import os, subprocess, sys, time
port, log = sys.argv[1], sys.argv[2]
kids = []
for r in range(2):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(r), WORLD_SIZE="2",
               TORCHELASTIC_RUN_ID="none")
    code = "import time\\nfor i in range(6):\\n print('[rank0]: step', i, flush=True); time.sleep(0.5)" if r == 0 \\
        else "import time; time.sleep(3)"
    out = open(log, "w") if r == 0 else subprocess.DEVNULL
    kids.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=out, stderr=subprocess.STDOUT))
for k in kids:
    k.wait()
os.unlink(log)
"""
MiB = 1 << 20


def _arg(name: str, default: float) -> float:
    return float(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def rss_parts(pid: int) -> dict[str, int]:
    """RssAnon (the heap: Python objects, malloc, SQLite's cache), RssFile (pages of the
    interpreter and libraries mapped in as code runs for the first time) and RssShmem, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("RssAnon", "RssFile", "RssShmem"):
            out[f"{k[3:].lower()}_bytes"] = int(v.split()[0]) * 1024
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slope_mib_per_hour(points: list[tuple[float, int]]) -> float | None:
    """Least-squares slope of (minute, bytes) in MiB per hour; None with fewer than 3 points."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    return sxy / sxx * 60 / MiB if sxx else None


def main() -> None:
    minutes, every = _arg("--minutes", 60.0), _arg("--every", 2.0)
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    tmp = Path(tempfile.mkdtemp(prefix="hangd-soak-"))
    port = free_port()  # in a PID namespace of its own every soak is pid 1: no port from the pid
    serve = subprocess.Popen([sys.executable, "-m", "hangd", "serve", "--listen", f"127.0.0.1:{port}", "--interval", "1",
                              "--db", f"sqlite:///{tmp / 'h.db'}"], cwd=ROOT, stdout=open(tmp / "serve.log", "w"),
                             stderr=subprocess.STDOUT, env=dict(os.environ, HANGD_NVML="0"))
    url = f"http://127.0.0.1:{port}"
    t_end = time.time() + 60
    while time.time() < t_end:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    proc = psutil.Process(serve.pid)
    samples = []
    jobs: list[subprocess.Popen[bytes]] = []
    t0 = time.time()
    next_job = t0
    next_sample = t0 + 60
    n = 0
    poll_failures = 0
    try:
        while time.time() - t0 < minutes * 60:
            now = time.time()
            if now >= next_job:
                jobs.append(subprocess.Popen([sys.executable, "-c", LAUNCHER, str(30000 + n % 20000),
                                              str(tmp / f"job{n}.log")]))
                n += 1
                next_job += every
            jobs = [j for j in jobs if j.poll() is None]
            if now >= next_sample:
                next_sample += 60
                rss, cpu = proc.memory_info().rss, proc.cpu_times()
                try:  # a host busy with other work can make a reply slow: the sample says so, the soak goes on
                    listed = httpx.get(url + "/processes", timeout=60).json()
                    metrics = httpx.get(url + "/metrics", timeout=60).text
                except httpx.HTTPError:
                    poll_failures += 1
                    listed, metrics = None, ""
                forgot = {m[0]: float(m[1]) for m in re.findall(r'hangd_analysis_forgotten_total\{what="(\w+)"\} ([\d.e+]+)', metrics)}
                samples.append({"minute": round((now - t0) / 60), "rss_bytes": rss, **rss_parts(serve.pid),
                                "cpu_seconds": round(cpu.user + cpu.system, 1),
                                "listed": len(listed) if listed is not None else None,
                                "listed_gone": sum(1 for p in listed if p["state"] == "gone") if listed is not None else None,
                                "jobs_started": n, "forgotten": forgot})
                print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
            time.sleep(0.05)
    finally:
        for j in jobs:
            j.wait()
        serve.terminate()
        try:
            serve.wait(20)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
    rss = {s["minute"]: s["rss_bytes"] for s in samples}
    end = max(rss) if rss else None

    def growth(since: int) -> int | None:
        return rss[end] - rss[since] if end is not None and since in rss and end > since else None
    after = [v for m, v in rss.items() if m >= 5]
    listed = [s["listed"] for s in samples if s["listed"] is not None]
    result = {"minutes": minutes, "every_s": every, "jobs_started": n, "processes_started": 3 * n,
              "rss_bytes_minute_1": rss.get(1), "rss_bytes_minute_5": rss.get(5), "rss_bytes_minute_10": rss.get(10),
              "rss_bytes_end": rss[end] if end is not None else None,
              "rss_bytes_min_after_5": min(after) if after else None, "rss_bytes_max_after_5": max(after) if after else None,
              "growth_after_minute_5_bytes": growth(5), "growth_after_minute_10_bytes": growth(10),
              "slope_after_minute_10_mib_per_hour": slope_mib_per_hour([(m, v) for m, v in rss.items() if m >= 10]),
              "slope_anon_after_minute_10_mib_per_hour": slope_mib_per_hour(
                  [(s["minute"], s["anon_bytes"]) for s in samples if s["minute"] >= 10 and "anon_bytes" in s]),
              "listed_min": min(listed) if listed else None, "listed_max": max(listed) if listed else None,
              "listed_at_end": samples[-1]["listed"] if samples else None,
              "forgotten_at_end": samples[-1]["forgotten"] if samples else None,
              "cpu_seconds": samples[-1]["cpu_seconds"] if samples else None,
              "poll_failures": poll_failures, "samples": samples}
    if out:
        Path(out).write_text(json.dumps(result, indent=1))
    emit({k: v for k, v in result.items() if k != "samples"}, "hangd soak: job churn")


if __name__ == "__main__":
    main()
