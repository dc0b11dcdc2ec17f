"""Live cost run: hangd serve at 1 Hz on a GPU host watching a 2-rank NCCL job with 8 data-loader
workers per rank; CPU, RSS and tick p99 from /metrics, nvidia-smi dmon beside it.

python scripts/cost_live.py SECONDS   (writes $OUT/cost-live-h200x2.json, serve.log, job.log, metrics.txt)
Run from a checkout with hangd's dependencies importable; needs torch with CUDA and 2 GPUs."""

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

OUT = os.environ.get("OUT", "/tmp")
HERE = os.path.dirname(os.path.abspath(__file__))
MC = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
JOB = r"""
import os, time, torch, torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
class D(Dataset):
    def __len__(self): return 10**9
    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.randn(1024)
dist.init_process_group("nccl")
r = dist.get_rank(); torch.cuda.set_device(r)
m = torch.nn.Linear(1024, 1024).cuda(); opt = torch.optim.SGD(m.parameters(), lr=1e-3)
dl = DataLoader(D(), batch_size=64, num_workers=8, persistent_workers=True)
t_end = time.time() + float(os.environ["JOB_S"]); step = 0
for x in dl:
    x = x.cuda(); loss = m(x).pow(2).mean(); loss.backward()
    for p in m.parameters(): dist.all_reduce(p.grad)
    opt.step(); opt.zero_grad(); step += 1
    if step % 200 == 0 and r == 0: print("step", step, flush=True)
    if time.time() > t_end: break
dist.destroy_process_group()
"""


def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def get(url):
    return urllib.request.urlopen(url, timeout=10).read().decode()


def cpu_s(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def metric(text, name):
    m = re.search(rf"^{name} ([\d.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def quantile(text, q):
    b = [
        (float(le), float(v))
        for le, v in re.findall(
            r'hangd_tick_duration_seconds_bucket\{le="([^"]+)"\} ([\d.e+]+)', text
        )
        if le != "+Inf"
    ]
    n = metric(text, "hangd_tick_duration_seconds_count")
    if not b or not n:
        return None
    rank, pl, pc = q * n, 0.0, 0.0
    for le, c in b:
        if c >= rank:
            return pl + (le - pl) * ((rank - pc) / (c - pc) if c > pc else 1.0)
        pl, pc = le, c
    return b[-1][0]


res = {
    "code": os.environ.get("HANGD_COMMIT"),
    "host": subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip(),
}
hp = port()
url = f"http://127.0.0.1:{hp}"
serve = subprocess.Popen(
    [
        sys.executable,
        "-m",
        "hangd",
        "serve",
        "--listen",
        f"127.0.0.1:{hp}",
        "--interval",
        "1",
        "--db",
        "sqlite:////tmp/cost-live.db",
    ],
    stdout=open(f"{OUT}/serve.log", "w"),
    stderr=subprocess.STDOUT,
)
time.sleep(8)
env = dict(
    os.environ,
    **MC,
    JOB_S=str(float(sys.argv[1]) + 60),
    MASTER_ADDR="127.0.0.1",
    MASTER_PORT=str(port()),
)
open("/tmp/job.py", "w").write(JOB)
job = subprocess.Popen(
    [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        env["MASTER_PORT"],
        "/tmp/job.py",
    ],
    env=env,
    stdout=open(f"{OUT}/job.log", "w"),
    stderr=subprocess.STDOUT,
)
time.sleep(40)  # ranks up, loaders forked, hangd has seen everything


def descendants(root):
    pp = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                pp[int(d)] = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    out, stack = [], [root]
    while stack:
        c = stack.pop()
        for p, q in pp.items():
            if q == c:
                out.append(p)
                stack.append(p)
    return out


desc = len(descendants(job.pid))
dmon = subprocess.Popen(["nvidia-smi", "dmon", "-s", "pucm", "-d", "1"], stdout=subprocess.DEVNULL)
m0 = get(url + "/metrics")
c0, d0, t0 = cpu_s(serve.pid), 0.0, time.monotonic()
time.sleep(1)
d0 = cpu_s(dmon.pid)
time.sleep(float(sys.argv[1]))
m1 = get(url + "/metrics")
c1, d1, t1 = cpu_s(serve.pid), cpu_s(dmon.pid), time.monotonic()
procs = json.loads(get(url + "/processes"))
jobs = json.loads(get(url + "/jobs"))
dmon.terminate()
serve.terminate()
job.terminate()
for p in (dmon, serve, job):
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
pc0, pc1 = metric(m0, "process_cpu_seconds_total"), metric(m1, "process_cpu_seconds_total")
res.update(
    {
        "seconds": round(t1 - t0, 1),
        "watched_processes": len(procs),
        "job_processes_on_host": desc,
        "ranks_listed": [(p.get("rank"), p.get("state")) for p in procs],
        "states": {
            s: sum(1 for p in procs if p.get("state") == s) for s in {p.get("state") for p in procs}
        },
        "jobs": [
            {k: j.get(k) for k in ("id", "state", "ranks", "world_size") if k in j} for j in jobs
        ],
        "hangd_cpu_core_fraction_metrics": round((pc1 - pc0) / (t1 - t0), 4)
        if pc0 is not None and pc1 is not None
        else None,
        "hangd_cpu_core_fraction_proc": round((c1 - c0) / (t1 - t0), 4),
        "hangd_rss_bytes_metrics": metric(m1, "process_resident_memory_bytes"),
        "tick_seconds_p50": quantile(m1, 0.5),
        "tick_seconds_p99": quantile(m1, 0.99),
        "ticks": metric(m1, "hangd_tick_duration_seconds_count"),
        "nvidia_smi_dmon_cpu_core_fraction": round((d1 - d0) / (t1 - t0 - 1), 4),
    }
)
res["collector_seconds"] = {
    k: float(v)
    for k, v in re.findall(
        r'hangd_collector_duration_seconds\{collector="([^"]+)"\} ([\d.e+-]+)', m1
    )
}
print(json.dumps(res, indent=1))
json.dump(res, open(f"{OUT}/cost-live-h200x2.json", "w"), indent=1)
open(f"{OUT}/metrics.txt", "w").write(m1)
