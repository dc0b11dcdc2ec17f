"""API latency on a database holding 30 days of an 8-GPU node and 10,000 incidents.

python -m benchmarks.api [--json] -> {"p50_ms", "p99_ms", "incidents", "db_bytes", ...}
The volume is synthetic but shaped like a real node: 8 GPUs downsampled per minute for 30 days,
64 processes changing state ~40 times a day each, and 10,000 incidents carrying evidence of the
size real incidents have (stacks of 2-8 ranks, findings, log lines; ~6 KB each). Requests go to a
real `hangd serve` (uvicorn) over loopback: GET /incidents (first page, filtered pages) and
GET /incidents/{id}; p50/p99 over 1000 requests each. Also reports the bytes per day of the
history without incidents, for sizing (target <= 100 MB per 30 days)."""

from __future__ import annotations

import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.common import emit
from hangd.store import models as m
from hangd.store.db import Store

ROOT = Path(__file__).resolve().parent.parent
DAYS = 30
GPUS = 8
PROCS = 64


def _evidence(rng: random.Random, ranks: int) -> dict:
    frames = ["all_reduce (torch/distributed/distributed_c10d.py:3068)", "wrapper (torch/distributed/c10d_logger.py:83)",
              "train_step (train.py:212)", "main (train.py:340)", "<module> (train.py:400)"]
    return {"quiet_for_s": rng.uniform(10, 600),
            "stacks": {str(r): {"pid": 1000 + r, "verdict": "collective", "frames": frames, "threads": 200} for r in range(ranks)},
            "processes": {str(r): {"pid": 1000 + r, "state": "R", "wchan": "0", "cpu_cores": 1.0, "gpu_mem_bytes": 7.6e10}
                          for r in range(ranks)},
            "logs": {str(r): [f"[rank{r}] step {i} loss 0.01" for i in range(10)] for r in range(min(ranks, 2))},
            "gpus": {str(r): {"util_gpu": 100, "power_w": 124.0, "gpm": {"SM_UTIL": 18.2, "ANY_TENSOR_UTIL": 0.0}}
                     for r in range(ranks)}}


def build(url: str, incidents: int) -> Store:
    st = Store(url)
    rng = random.Random(1)
    now = time.time()
    start = now - DAYS * 86400
    kinds = ["nccl_stall", "host_stall", "straggler", "orphaned_gpu_memory", "rank_exited", "collective_mismatch"]
    with st.Session.begin() as s:
        for g in range(GPUS):
            s.add(m.Gpu(node_id=st.node_id, index=g, uuid=f"GPU-{g}", name="NVIDIA H200", mem_total=150754820096, last_seen=now))
        minute0 = int(start // 60)
        s.bulk_insert_mappings(m.GpuMinute, [  # type: ignore[arg-type]
            {"node_id": st.node_id, "gpu_index": g, "minute": minute0 + i, "util": rng.uniform(0, 100),
             "sm": rng.uniform(0, 90), "power_w": rng.uniform(120, 700), "mem_used": rng.uniform(1e9, 1.4e11)}
            for i in range(DAYS * 1440) for g in range(GPUS)])
        states = ["busy", "idle", "loading", "waiting_peer", "graph_capture", "starting"]
        s.bulk_insert_mappings(m.StateChange, [  # type: ignore[arg-type]
            {"node_id": st.node_id, "t": start + rng.uniform(0, DAYS * 86400), "pid": 1000 + rng.randrange(PROCS),
             "rank": rng.randrange(8), "job": f"rdzv:10.0.0.1:{29500 + rng.randrange(20)}", "state": rng.choice(states),
             "reason": "GPU working: tensor 80%, DRAM 18%, NVLink 17000 MiB/s, 690 W"}
            for _ in range(PROCS * 40 * DAYS)])
        s.bulk_insert_mappings(m.Incident, [  # type: ignore[arg-type]
            {"id": i + 1, "node_id": st.node_id, "kind": (k := rng.choice(kinds)), "severity": "critical", "job": f"rdzv:10.0.0.1:{29500 + i % 50}",
             "family": "hang", "status": "resolved" if i < incidents - 5 else "open",
             "opened_at": (t := start + i * (DAYS * 86400 / incidents)), "updated_at": t + 30, "resolved_at": t + 60,
             "hang_started_at": t - 10, "acked": False, "summary": f"{k}: rank 1 never entered all_reduce #{i}",
             "next_step": "read the culprit's stack", "pids": [1000, 1001], "ranks": [0, 1], "culprit_pids": [1001],
             "culprit_ranks": [1], "evidence": _evidence(rng, rng.choice([2, 4, 8])), "findings": [], "timeline": []}
            for i in range(incidents)])
    return st


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="hangd-api-"))
    url = f"sqlite:///{tmp / 'hangd.db'}"
    t0 = time.time()
    st = build(url, 10_000)
    db_bytes = st.size_bytes() or 0
    # the same history without incidents, for bytes per day of a node
    url2 = f"sqlite:///{tmp / 'history.db'}"
    st2 = build(url2, 0)
    with st2.engine.connect() as c:
        c.exec_driver_sql("VACUUM")
    per_day = (st2.size_bytes() or 0) / DAYS
    built = time.time() - t0
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    trace = ROOT / "tests" / "data" / "traces" / "h200x2" / "idle_server"
    serve = subprocess.Popen([sys.executable, "-m", "hangd", "serve", "--listen", f"127.0.0.1:{port}", "--db", url,
                              "--replay", str(trace), "--speed", "100"], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=dict(os.environ))
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=10) as c:
            for _ in range(100):
                try:
                    if c.get("/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            rng = random.Random(2)
            lists, details = [], []
            for i in range(1000):
                params = [{}, {"status": "open"}, {"kind": "nccl_stall", "limit": 20}, {"offset": rng.randrange(9000)}][i % 4]
                t = time.perf_counter()
                r = c.get("/incidents", params=params)
                lists.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200
                t = time.perf_counter()
                r = c.get(f"/incidents/{rng.randrange(1, 10_001)}")
                details.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200
    finally:
        serve.terminate()
        serve.wait(20)
    lists.sort()
    details.sort()
    both = sorted(lists + details)
    emit({"p50_ms": round(statistics.median(both), 2), "p99_ms": round(both[int(len(both) * 0.99)], 2),
          "list_p50_ms": round(statistics.median(lists), 2), "list_p99_ms": round(lists[int(len(lists) * 0.99)], 2),
          "detail_p50_ms": round(statistics.median(details), 2), "detail_p99_ms": round(details[int(len(details) * 0.99)], 2),
          "incidents": 10_000, "db_bytes": db_bytes, "history_bytes_per_day_8_gpus": int(per_day),
          "build_seconds": round(built, 1)}, "GET /incidents and /incidents/{id} on 30 days of an 8-GPU node")


if __name__ == "__main__":
    main()
