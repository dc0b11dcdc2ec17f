"""A long soak of job churn: does hangd's memory stay flat for as long as the daemon lives?

python -m benchmarks.soak [--json] [--minutes M] [--every S] [--out FILE]
A real `hangd serve --interval 1` watches a new 2-rank "job" every ``--every`` seconds (plain
processes with a torch.distributed environment and a launcher, each living a few seconds, one in
two writing a log line), for ``--minutes``. Every minute it records hangd's RSS, the processes
`/processes` still lists, and what the analysis reports it dropped from memory
(`hangd_analysis_forgotten_total`). The result says whether RSS grew after the first minutes.
"""

from __future__ import annotations

import json
import os
import re
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
port = sys.argv[1]
kids = []
for r in range(2):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(r), WORLD_SIZE="2",
               TORCHELASTIC_RUN_ID="none")
    code = "import time\\nfor i in range(6):\\n print('step', i, flush=True); time.sleep(0.5)" if r == 0 else \\
        "import time; time.sleep(3)"
    kids.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL))
for k in kids:
    k.wait()
"""


def _arg(name: str, default: float) -> float:
    return float(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def main() -> None:
    minutes, every = _arg("--minutes", 60.0), _arg("--every", 2.0)
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    tmp = Path(tempfile.mkdtemp(prefix="hangd-soak-"))
    port = 20000 + os.getpid() % 20000
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
    try:
        while time.time() - t0 < minutes * 60:
            now = time.time()
            if now >= next_job:
                jobs.append(subprocess.Popen([sys.executable, "-c", LAUNCHER, str(30000 + n % 20000)]))
                n += 1
                next_job += every
            jobs = [j for j in jobs if j.poll() is None]
            if now >= next_sample:
                next_sample += 60
                listed = httpx.get(url + "/processes", timeout=10).json()
                metrics = httpx.get(url + "/metrics", timeout=10).text
                forgot = {m[0]: float(m[1]) for m in re.findall(r'hangd_analysis_forgotten_total\{what="(\w+)"\} ([\d.e+]+)', metrics)}
                samples.append({"minute": round((now - t0) / 60), "rss_bytes": proc.memory_info().rss,
                                "listed": len(listed), "listed_gone": sum(1 for p in listed if p["state"] == "gone"),
                                "jobs_started": n, "forgotten": forgot})
                print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
            time.sleep(0.05)
    finally:
        for j in jobs:
            j.wait()
        serve.terminate()
        serve.wait(20)
    rss = [s["rss_bytes"] for s in samples]
    after = rss[min(5, len(rss) - 1):] if rss else []
    result = {"minutes": minutes, "jobs_started": n, "processes_started": 3 * n,
              "rss_bytes_minute_1": rss[0] if rss else None, "rss_bytes_min_after_5": min(after) if after else None,
              "rss_bytes_max_after_5": max(after) if after else None, "rss_bytes_end": rss[-1] if rss else None,
              "growth_after_minute_5_bytes": (after[-1] - after[0]) if len(after) > 1 else None,
              "listed_at_end": samples[-1]["listed"] if samples else None, "samples": samples}
    if out:
        Path(out).write_text(json.dumps(result, indent=1))
    emit({k: v for k, v in result.items() if k != "samples"}, "hangd soak: job churn")


if __name__ == "__main__":
    main()
