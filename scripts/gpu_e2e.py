"""The live GPU run: one `hangd serve` on a host with 2 GPUs watches real NCCL jobs go through
loading, CUDA-graph capture, training, a straggler, a stall and orphaned workers; this writes what
hangd reported (incidents, detection latencies, false alarms) and what it cost next to nvidia-smi.

python scripts/gpu_e2e.py OUTDIR  ->  OUTDIR/report.json, OUTDIR/incidents.json, OUTDIR/metrics.txt
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.teardown import kill_all  # noqa: E402 - the repository root goes on the path first

WORK = ROOT / "tests" / "workloads"
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# scenario: (seconds, hang expected (kind), action, action at s)
SCENARIOS = [("load", 30, None, None, None), ("graph_capture", 45, None, None, None), ("train", 20, None, None, None),
             ("straggler", 35, None, None, None), ("nccl_stall", 35, "nccl_stall", None, None),
             ("orphan", 25, "orphaned_gpu_memory", "sigkill_launcher", 12)]


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> object:
    import urllib.request
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def cpu_of(p: psutil.Process) -> float:
    t = p.cpu_times()
    total = t.user + t.system
    for c in p.children(recursive=True):
        try:
            ct = c.cpu_times()
            total += ct.user + ct.system
        except psutil.Error:
            pass
    return total


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    p = port()
    serve = subprocess.Popen([sys.executable, "-m", "hangd", "serve", "--listen", f"127.0.0.1:{p}", "--interval", "1",
                              "--db", f"sqlite:///{out / 'hangd.db'}"], cwd=ROOT,
                             stdout=open(out / "serve.log", "w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{p}"
    time.sleep(5)
    report: dict = {"scenarios": []}
    sp = psutil.Process(serve.pid)
    for name, seconds, expect, action, at in SCENARIOS:
        job = out / name
        job.mkdir()
        if name == "load":
            for r in range(2):
                for i in range(8):
                    (job / f"shard_{r}_{i:02d}").write_bytes(os.urandom(256 << 20))
            subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=False)
        env = dict(os.environ, **MULTICAST_OFF, TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(job / "frpipe_"),
                   TORCH_NCCL_DUMP_ON_TIMEOUT="1")
        t0 = time.time()
        c0 = cpu_of(sp)
        launcher = subprocess.Popen([sys.executable, str(WORK / "launch.py"), "2", str(job), str(WORK / "gpu_job.py"),
                                     "straggler" if name == "straggler" else name, str(job)],
                                    cwd=ROOT, env=env, start_new_session=True)
        ranks: list[int] = []
        acted = None
        while time.time() - t0 < seconds:
            time.sleep(0.5)
            if not ranks:
                ranks = [c.pid for c in psutil.Process(launcher.pid).children()]
            if action and acted is None and time.time() - t0 >= at:
                os.kill(launcher.pid, signal.SIGKILL)
                acted = time.time()
        c1 = cpu_of(sp)
        incs = get(base + "/incidents?limit=500")["incidents"]  # type: ignore[index]
        mine = [i for i in incs if set(i["pids"]) & set(ranks)]
        truth = []
        for f in job.glob("truth_*.jsonl"):
            truth += [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        hang_t = min([x["t"] for x in truth if x["state"] == "hung"] + ([acted] if acted else []), default=None)
        timeline = get(base + "/timeline?limit=5000")
        states = sorted({e["state"] for e in timeline if e["pid"] in ranks})  # type: ignore[union-attr]
        entry = {"scenario": name, "ranks": ranks, "states_seen": states,
                 "incidents": [{k: i[k] for k in ("id", "kind", "culprit_ranks", "opened_at", "summary")} for i in mine],
                 "expected": expect, "hangd_cpu_core_fraction": round((c1 - c0) / (time.time() - t0), 4)}
        hang_incs = [i for i in mine if i["kind"] in ("nccl_stall", "host_stall", "io_stall", "orphaned_gpu_memory", "rank_exited")]
        if expect:
            hit = [i for i in hang_incs if i["kind"] == expect]
            entry["detected"] = bool(hit)
            if hit and hang_t:
                entry["detection_latency_s"] = round(hit[0]["opened_at"] - hang_t, 1)
        entry["false_alarms"] = [i["kind"] for i in hang_incs if i["kind"] != expect]
        report["scenarios"].append(entry)
        kill_all(ranks, launcher)
        for f in job.glob("shard_*"):
            f.unlink()
        entry["job_log_tail"] = [x for x in (job / "log_0.txt").read_text().splitlines()[-3:]] if (job / "log_0.txt").exists() else []
        entry["truth"] = sorted(truth, key=lambda x: x["t"])
        time.sleep(3)
    # cost next to nvidia-smi, on an idle node, 30 s each, same 1 Hz
    def measure(cmd: list[str] | None, seconds: float = 30) -> float:
        if cmd is None:
            c0, t0 = cpu_of(sp), time.time()
            time.sleep(seconds)
            return (cpu_of(sp) - c0) / (time.time() - t0)
        q = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        qp = psutil.Process(q.pid)
        time.sleep(1)
        c0, t0 = cpu_of(qp), time.time()
        time.sleep(seconds)
        c = (cpu_of(qp) - c0) / (time.time() - t0)
        q.terminate()
        q.wait()
        return c
    smi = measure(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used,power.draw,temperature.gpu,clocks.sm",
                   "--format=csv", "-l", "1"])
    dmon = measure(["nvidia-smi", "dmon", "-s", "pucm", "-d", "1"])
    hangd = measure(None)
    report["side_by_side_cpu_core_fraction"] = {"hangd_serve_1hz": round(hangd, 5), "nvidia_smi_query_1hz": round(smi, 5),
                                                "nvidia_smi_dmon_1hz": round(dmon, 5),
                                                "hangd_over_nvidia_smi": round(hangd / smi, 2) if smi else None,
                                                "hangd_over_dmon": round(hangd / dmon, 2) if dmon else None}
    report["hangd_rss_bytes"] = sp.memory_info().rss
    metrics = subprocess.run(["curl", "-s", base + "/metrics"], capture_output=True, text=True).stdout
    (out / "metrics.txt").write_text(metrics)
    (out / "incidents.json").write_text(json.dumps(get(base + "/incidents?limit=500"), indent=1))
    (out / "report.json").write_text(json.dumps(report, indent=1))
    serve.terminate()
    serve.wait(20)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
