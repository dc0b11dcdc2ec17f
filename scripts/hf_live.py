"""Live suite: Hugging Face transformers tensor parallelism under plain torchrun, watched by ONE hangd serve.

Each scenario is a fresh `torchrun --nproc-per-node 2 --master-port P tests/workloads/hf_tp.py ...` (no
--rdzv-id: every job has torchrun's default run id), recorded by `hangd record` into a hangd-trace/1
bundle whose truth.jsonl holds the ranks' own truth lines (plus `gone` when a rank's process ends).
While it runs, this polls `GET /processes` every second; at the end it reads every incident
(`/incidents`, `/incidents/{id}`), `/metrics` and `/timeline`, and writes what hangd said next to the truth.

python scripts/hf_live.py OUTDIR  ->  OUTDIR/report.json, OUTDIR/<scenario>.tar.gz (trace bundles),
                                      OUTDIR/logs.tar.gz (serve log, job logs, states, incidents, metrics)
Env: HF_LIVE_HOLD (seconds a hang is kept, default 40), HF_LIVE_ONLY (comma list of scenarios),
HF_LIVE_DEADLINE_S (skip a scenario that would end past this many seconds after the start),
HF_LIVE_JOB_PYTHONPATH (PYTHONPATH for the ranks; by default they get none).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.teardown import kill_all  # noqa: E402 - the repository root goes on the path first

WORKLOAD = ROOT / "tests" / "workloads" / "hf_tp.py"
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
HOLD = float(os.environ.get("HF_LIVE_HOLD", "40"))
# a scenario is not started when it would end past the deadline (seconds since the start)
DEADLINE_S = float(os.environ.get("HF_LIVE_DEADLINE_S", "1e9"))
ESTIMATE_S = {"healthy": 50, "worker_died": 30 + HOLD, "gloo_handshake": 25 + HOLD, "slow_load": 60, "back_to_back": 60}
HANG_KINDS = ("nccl_stall", "host_stall", "io_stall", "orphaned_gpu_memory", "rank_exited", "collective_mismatch")
# name: (workload scenario per launch, expected hang incident or None, what ran)
SCENARIOS: dict[str, tuple[list[str], dict[str, Any] | None, str]] = {
    "healthy": (["healthy"], None,
                "load a 3.1 B-parameter random Llama (7 safetensors shards) with DistributedConfig(tp_size=2), "
                "generate for 25 s through a worker thread fed by a queue.Queue, exit cleanly"),
    "worker_died": (["worker_died"], {"kinds": ["nccl_stall"], "culprit_ranks": [1]},
                    "healthy generation for 10 s, then speculative requests: rank 1's draft head has hidden size "
                    "2048 instead of 4096, its worker thread dies on 'mat1 and mat2 shapes cannot be multiplied' "
                    "and its main thread blocks in Queue.get(); rank 0 goes on into the verify forward and blocks "
                    "in NCCL; kept 40 s, then killed"),
    "gloo_handshake": (["gloo_handshake"], {"kinds": ["host_stall"], "culprit_ranks": [1]},
                       "load, generate 3 s, then rank 0 creates a gloo group for request broadcast "
                       "(dist.new_group(backend='gloo')) while rank 1 waits on an Event that is never set: rank 0 "
                       "blocks in the group's store handshake; kept 40 s, then killed"),
    "slow_load": (["slow_load"], None,
                  "rank 1 reads the shards from a throttled disk (120 MB/s, page cache dropped with "
                  "posix_fadvise DONTNEED) for 32 s while rank 0 waits at an NCCL barrier; then both load, "
                  "generate 5 s and exit cleanly"),
    "back_to_back": (["short", "short"], None,
                     "two healthy launches (generate 6 s) right after each other on the same master port, "
                     "both with torchrun's default run id"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, raw: bool = False) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read()
    return body.decode() if raw else json.loads(body)


def cpu_of(p: psutil.Process) -> float:
    """CPU seconds of hangd and of what it runs (py-spy)."""
    t = p.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for c in p.children(recursive=True):
        try:
            ct = c.cpu_times()
            total += ct.user + ct.system
        except psutil.Error:
            pass
    return total


def read_truth(job: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted(job.glob("truth_*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a line being written
    return out


class Poller(threading.Thread):
    """GET /processes every second, and hangd's own CPU and RSS, for the whole suite."""

    def __init__(self, base: str, serve: psutil.Process) -> None:
        super().__init__(daemon=True)
        self.base, self.serve = base, serve
        self.rows: list[dict[str, Any]] = []
        self.rss_max = 0
        self.errors = 0
        self.n = 0
        self.jobs: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            t = time.time()
            try:
                procs = get(self.base + "/processes")
            except Exception:  # noqa: BLE001 - counted and reported
                self.errors += 1
                continue
            for p in procs:
                self.rows.append({"t": round(t, 2), "pid": p["pid"], "rank": p["rank"], "job": p["job"],
                                  "state": p["state"], "reason": p["reason"]})
            self.n += 1
            if self.n % 5 == 0:
                try:
                    self.jobs.append({"t": round(t, 2), "jobs": get(self.base + "/jobs")})
                except Exception:  # noqa: BLE001 - counted and reported
                    self.errors += 1
            try:
                self.rss_max = max(self.rss_max, self.serve.memory_info().rss)
            except psutil.Error:
                pass


def truth_at(truth: list[dict[str, Any]], pid: int, t: float) -> str | None:
    st = None
    for x in truth:
        if x["pid"] == pid and x["t"] <= t:
            st = x["state"]
    return st


def neutralize(d: Path, subs: list[tuple[str, str]]) -> None:
    """Paths of the host that ran it become neutral ones, as in the reference traces."""
    for f in [p for p in d.rglob("*") if p.is_file()]:
        b = f.read_bytes()
        try:
            s = b.decode()
        except UnicodeDecodeError:
            # binary (a flight-recorder pickle, its frames' file names): lengths inside it must not
            # change, so a path becomes the neutral one padded with slashes to the same length
            nb = b
            for a, r in subs:
                ab, rb = a.encode(), r.encode()
                if len(rb) <= len(ab):
                    nb = nb.replace(ab, rb + b"/" * (len(ab) - len(rb)))
                elif ab in nb:
                    print(f"warning: {f}: {a} is shorter than {r}, left as it is", file=sys.stderr)
            if nb != b:
                f.write_bytes(nb)
            continue
        n = s
        for a, r in subs:
            n = n.replace(a, r)
        if n != s:
            f.write_text(n)


def run_scenario(name: str, out: Path, ckpt: Path, serve: psutil.Process, job_env: dict[str, str]) -> dict[str, Any]:
    launches, expect, notes = SCENARIOS[name]
    d = out / "traces" / name
    jobs = out / "jobs" / name
    jobs.mkdir(parents=True, exist_ok=True)
    rec = subprocess.Popen([sys.executable, "-m", "hangd", "record", "--out", str(d), "--seconds", "400",
                            "--stacks-every", "10"], cwd=ROOT, stdout=open(jobs / "record.log", "w"),
                           stderr=subprocess.STDOUT)
    time.sleep(1.5)
    torchrun = Path(sys.executable).parent / "torchrun"
    launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    port = free_port()
    t_start = time.time()
    c0 = cpu_of(serve)
    actions: list[dict[str, Any]] = []
    runs = []
    truth_all: list[dict[str, Any]] = []
    for k, scen in enumerate(launches):
        job = jobs / f"launch{k}"
        job.mkdir()
        tr = subprocess.Popen([*launcher, "--nproc-per-node", "2", "--master-port", str(port), str(WORKLOAD), scen,
                               str(job), str(ckpt)], cwd=ROOT, env=job_env, start_new_session=True,
                              stdout=open(job / "torchrun.log", "w"), stderr=subprocess.STDOUT)
        t_launch = time.time()
        gone: dict[int, float] = {}
        hang_t = None
        jobs_at_hang: Any = None
        torn = None
        while True:
            time.sleep(0.25)
            truth = read_truth(job)
            pids = sorted({x["pid"] for x in truth})
            for pid in pids:
                if pid not in gone and not psutil.pid_exists(pid):
                    gone[pid] = round(time.time(), 3)
            hungs = [x["t"] for x in truth if x["state"] == "hung"]
            if hungs and hang_t is None:
                hang_t = min(hungs)
            if hang_t is not None and jobs_at_hang is None and time.time() >= hang_t + HOLD - 2:
                try:
                    jobs_at_hang = get(f"http://{os.environ['HF_LIVE_LISTEN']}/jobs")
                except Exception as e:  # noqa: BLE001
                    jobs_at_hang = {"error": str(e)}
            over = time.time() - t_launch > 300
            if (hang_t is not None and time.time() >= hang_t + HOLD) or over:
                torn = round(time.time(), 3)
                actions.append({"t": torn, "kind": "action", "what": "sigkill_all", "pid": None})
                kill_all(pids, tr)
                time.sleep(0.5)
                for pid in pids:
                    gone.setdefault(pid, round(time.time(), 3))
                break
            if tr.poll() is not None and all(p in gone for p in pids):
                break
        truth = read_truth(job)
        for pid, t in gone.items():
            rank = next(x["rank"] for x in truth if x["pid"] == pid)
            truth.append({"t": t, "pid": pid, "rank": rank, "state": "gone",
                          "phase": "killed" if torn is not None and t >= torn else "exited"})
        truth_all += truth
        runs.append({"scenario": scen, "launcher_pid": tr.pid, "master_port": port, "exit_code": tr.returncode,
                     "ranks": {str(x["rank"]): x["pid"] for x in truth if x["state"] == "starting"},
                     "hang_started_at": hang_t, "torn_down_at": torn, "timed_out": torn is not None and hang_t is None,
                     "jobs_seen_before_teardown": jobs_at_hang,
                     "seconds": round(time.time() - t_launch, 1)})
    time.sleep(4)  # let hangd see the end of the last job
    rec.send_signal(signal.SIGINT)
    try:
        rec.wait(30)
    except subprocess.TimeoutExpired:
        rec.kill()
        rec.wait()
    t_end = time.time()
    cpu = (cpu_of(serve) - c0) / (t_end - t_start)
    # merge: actions into the trace, the ranks' truth into truth.jsonl, what ran into meta.json
    truth_all.sort(key=lambda x: x["t"])
    if (d / "trace.jsonl").exists():
        events = [json.loads(x) for x in (d / "trace.jsonl").read_text().splitlines() if x.strip()]
        events = sorted(events + actions, key=lambda e: e["t"])
        (d / "trace.jsonl").write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))
    (d / "truth.jsonl").write_text("".join(json.dumps(x) + "\n" for x in truth_all))
    meta = json.loads((d / "meta.json").read_text()) if (d / "meta.json").exists() else {}
    meta.update({"scenario": name, "notes": notes, "world_size": 2,
                 "ranks": runs[-1]["ranks"], "jobs": [{"ranks": r["ranks"], "launcher": r["launcher_pid"],
                                                     "workload": r["scenario"]} for r in runs],
                 "driver": "scripts/hf_live.py (one hangd serve --interval 1 for all five scenarios; this trace by hangd record --stacks-every 10 beside it)",
                 "launch": "torchrun --nproc-per-node 2 --master-port P tests/workloads/hf_tp.py SCENARIO OUT CKPT "
                           "(no --rdzv-id)", "software": versions()})
    (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return {"scenario": name, "notes": notes, "expected": expect, "t_start": round(t_start, 3),
            "t_end": round(t_end, 3), "launches": runs, "truth": truth_all,
            "hangd_cpu_core_fraction": round(cpu, 4)}


_VERSIONS: dict[str, str] = {}


def versions() -> dict[str, str]:
    if not _VERSIONS:
        code = ("import torch, transformers; print(torch.__version__, transformers.__version__, "
                "torch.cuda.nccl.version() if torch.cuda.is_available() else '-')")
        try:
            t, tf, nccl = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                         env=job_env_base(), timeout=120).stdout.split(maxsplit=2)
            _VERSIONS.update({"torch": t, "transformers": tf, "nccl": nccl.strip()})
        except (ValueError, subprocess.SubprocessError):
            pass
    return _VERSIONS


def job_env_base() -> dict[str, str]:
    env = dict(os.environ, **MULTICAST_OFF, PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    if os.environ.get("HF_LIVE_JOB_PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["HF_LIVE_JOB_PYTHONPATH"]
    return env


def judge(sc: dict[str, Any], incidents: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """What hangd said about one scenario, next to its truth."""
    truth = sc["truth"]
    pids = {x["pid"] for x in truth} | {r["launcher_pid"] for r in sc["launches"]}
    torn = min([r["torn_down_at"] for r in sc["launches"] if r["torn_down_at"]], default=None)
    # an incident belongs to the scenario it was opened in (up to the next scenario's start): jobs that
    # share torchrun's default run id may be one job to hangd, so its pids can span several scenarios
    mine = [i for i in incidents if sc["t_start"] <= i["opened_at"] < sc["t_next"]]
    # states over time, per pid: hangd's changes next to the truth's
    states: dict[str, Any] = {}
    agree = total = 0
    confusion: dict[str, dict[str, int]] = {}
    for pid in sorted({x["pid"] for x in truth}):
        seq = []
        for r in rows:
            if r["pid"] != pid:
                continue
            if not seq or seq[-1][1] != r["state"] or seq[-1][2] != r["reason"]:
                seq.append([round(r["t"] - sc["t_start"], 1), r["state"], r["reason"]])
            ts = truth_at(truth, pid, r["t"])
            if ts is None or ts == "gone" or (torn is not None and r["t"] >= torn):
                continue
            total += 1
            agree += ts == r["state"]
            confusion.setdefault(ts, {}).setdefault(r["state"], 0)
            confusion[ts][r["state"]] += 1
        rank = next(x["rank"] for x in truth if x["pid"] == pid)
        states[str(pid)] = {"rank": rank,
                            "truth": [[round(x["t"] - sc["t_start"], 1), x["state"], x["phase"]] for x in truth
                                      if x["pid"] == pid],
                            "hangd": seq}
    sc["states"] = states
    sc["state_agreement"] = {"seconds_compared": total, "agree": agree,
                             "fraction": round(agree / total, 3) if total else None,
                             "truth_vs_hangd_seconds": confusion}
    keep = ("id", "kind", "severity", "status", "job", "opened_at", "resolved_at", "hang_started_at", "summary",
            "next_step", "pids", "ranks", "culprit_pids", "culprit_ranks")
    sc["incidents"] = [{k: i.get(k) for k in keep} | {"opened_after_start_s": round(i["opened_at"] - sc["t_start"], 1),
                                                      "pids_of_this_scenario": sorted(set(i.get("pids") or []) & pids)}
                       for i in mine]
    jobs: dict[str, list[Any]] = {}
    for r in rows:
        if r["pid"] in pids:
            jobs.setdefault(r["job"], [])
            if [r["pid"], r["rank"]] not in jobs[r["job"]]:
                jobs[r["job"]].append([r["pid"], r["rank"]])
    sc["hangd_jobs"] = jobs  # job id hangd gave the scenario's ranks: [pid, rank] pairs
    expect = sc["expected"]
    hang_t = min([r["hang_started_at"] for r in sc["launches"] if r["hang_started_at"]], default=None)
    false_alarms = []
    after_teardown = []
    hit = None
    for i in sorted(mine, key=lambda i: i["opened_at"]):
        if torn is not None and i["opened_at"] >= torn:
            after_teardown.append(i["id"])
            continue
        if expect is None:
            false_alarms.append({"id": i["id"], "kind": i["kind"], "why": "incident on a healthy scenario"})
            continue
        if hang_t is not None and i["opened_at"] < hang_t:
            false_alarms.append({"id": i["id"], "kind": i["kind"], "why": "opened before the hang began"})
        elif i["kind"] in HANG_KINDS and hit is None:
            hit = i
            if i["kind"] not in expect["kinds"] or sorted(i.get("culprit_ranks") or []) != expect["culprit_ranks"]:
                false_alarms.append({"id": i["id"], "kind": i["kind"],
                                     "why": f"hang incident that is not the truth (expected {expect['kinds']} "
                                            f"with culprit ranks {expect['culprit_ranks']}, got culprit ranks "
                                            f"{i.get('culprit_ranks')})"})
        elif i["kind"] in HANG_KINDS:
            false_alarms.append({"id": i["id"], "kind": i["kind"], "why": "a second hang incident"})
    sc["false_alarms"] = false_alarms
    sc["incidents_after_teardown"] = after_teardown
    if expect is not None and hang_t is not None:
        # short of an incident of its own: when hangd first called a rank hung, and when it first
        # added to an incident that was already open (a job it had merged with an earlier one)
        hung = [r["t"] for r in rows if r["pid"] in pids and r["state"] == "hung" and hang_t <= r["t"] < (torn or 1e18)]
        sc["hung_state_latency_s"] = round(min(hung) - hang_t, 1) if hung else None
        upd = sorted((e["t"], i["id"], e.get("note", "")) for i in incidents for e in (i.get("timeline") or [])
                     if e.get("event") == "updated" and hang_t <= e["t"] < (torn or 1e18)
                     and set(i.get("pids") or []) & pids)
        sc["hang_noted_as_update"] = ({"incident": upd[0][1], "latency_s": round(upd[0][0] - hang_t, 1),
                                       "note": upd[0][2]} if upd else None)
    if expect is not None:
        sc["hang_began_at"] = hang_t
        sc["detected"] = hit is not None
        if hit is not None:
            sc["detection"] = {"incident": hit["id"], "kind": hit["kind"], "culprit_ranks": hit.get("culprit_ranks"),
                               "kind_right": hit["kind"] in expect["kinds"],
                               "culprit_right": sorted(hit.get("culprit_ranks") or []) == expect["culprit_ranks"],
                               "latency_s": round(hit["opened_at"] - hang_t, 1) if hang_t else None,
                               "hangd_hang_started_at_minus_truth_s":
                                   round(hit["hang_started_at"] - hang_t, 1) if hit.get("hang_started_at") and hang_t
                                   else None}


def histogram_quantile(metrics: str, name: str, q: float) -> float | None:
    buckets = []
    for m in re.finditer(rf'^{name}_bucket{{le="([^"]+)"}} ([0-9.e+]+)$', metrics, re.M):
        buckets.append((float("inf") if m.group(1) == "+Inf" else float(m.group(1)), float(m.group(2))))
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    for le, c in buckets:
        if c >= q * total:
            return le
    return None


def metric(metrics: str, name: str) -> float | None:
    m = re.search(rf"^{name} ([0-9.e+]+)$", metrics, re.M)
    return float(m.group(1)) if m else None


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"scenario": s["scenario"], "expected": s["expected"], "detected": s.get("detected"),
             "detection": s.get("detection"), "hung_state_latency_s": s.get("hung_state_latency_s"),
             "hang_noted_as_update": s.get("hang_noted_as_update"), "false_alarms": len(s["false_alarms"]),
             "incidents": [(i["id"], i["kind"], i["culprit_ranks"], i["status"]) for i in s["incidents"]],
             "state_agreement": s["state_agreement"]["fraction"]} for s in results]


def rejudge(out: Path) -> None:
    """Judge a finished run again (report.json, incidents.json, states.jsonl in OUT), e.g. after a change here."""
    report = json.loads((out / "report.json").read_text())
    details = json.loads((out / "incidents.json").read_text())
    rows = [json.loads(x) for x in (out / "states.jsonl").read_text().splitlines() if x.strip()]
    for sc in report["scenarios"]:
        judge(sc, details, rows)
    report["summary"] = summarize(report["scenarios"])
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report["summary"], indent=1))


def main() -> None:
    if sys.argv[1] == "--rejudge":
        rejudge(Path(sys.argv[2]))
        return
    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    job_env = job_env_base()
    ckpt = out / "ckpt"
    t0 = time.time()
    if not (ckpt / "config.json").exists():
        subprocess.run([sys.executable, str(WORKLOAD), "make_ckpt", str(ckpt)], cwd=ROOT, env=job_env, check=True,
                       stdout=open(out / "make_ckpt.log", "w"), stderr=subprocess.STDOUT)
    print((out / "make_ckpt.log").read_text().splitlines()[-1] if (out / "make_ckpt.log").exists() else "", flush=True)
    subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=False, capture_output=True)
    ckpt_s = time.time() - t0
    listen = f"127.0.0.1:{free_port()}"
    os.environ["HF_LIVE_LISTEN"] = listen
    base = f"http://{listen}"
    serve = subprocess.Popen([sys.executable, "-m", "hangd", "serve", "--listen", listen, "--interval", "1",
                              "--db", f"sqlite:///{out / 'hangd.db'}"], cwd=ROOT, stdout=open(out / "serve.log", "w"),
                             stderr=subprocess.STDOUT)
    for _ in range(60):
        time.sleep(0.5)
        try:
            get(base + "/readyz")
            break
        except Exception:  # noqa: BLE001 - not up yet
            if serve.poll() is not None:
                sys.exit("hangd serve exited: " + (out / "serve.log").read_text()[-3000:])
    sp = psutil.Process(serve.pid)
    poller = Poller(base, sp)
    poller.start()
    only = [s for s in os.environ.get("HF_LIVE_ONLY", "").split(",") if s]
    results = []
    skipped: list[str] = []
    t_suite = time.time()
    c_suite = cpu_of(sp)
    for name in SCENARIOS:
        if only and name not in only:
            continue
        if time.time() - t0 + ESTIMATE_S[name] > DEADLINE_S:
            print(f"== {name} skipped: it would end past the deadline ({DEADLINE_S:.0f} s)", flush=True)
            skipped.append(name)
            continue
        print(f"== {name} {time.strftime('%H:%M:%S')}", flush=True)
        res = run_scenario(name, out, ckpt, sp, job_env)
        results.append(res)
        print(f"   {name}: {[(r['seconds'], r['exit_code']) for r in res['launches']]}", flush=True)
        time.sleep(2)
    time.sleep(3)
    poller.stop.set()
    poller.join(5)
    suite_cpu = (cpu_of(sp) - c_suite) / (time.time() - t_suite)
    incs = get(base + "/incidents?limit=500")["incidents"]
    details = []
    for i in incs:
        try:
            details.append(get(base + f"/incidents/{i['id']}"))
        except Exception as e:  # noqa: BLE001
            details.append({**i, "detail_error": str(e)})
    metrics = get(base + "/metrics", raw=True)
    timeline = get(base + "/timeline?limit=5000")
    for k, sc in enumerate(results):
        sc["t_next"] = results[k + 1]["t_start"] if k + 1 < len(results) else time.time()
        judge(sc, details, poller.rows)
    report = {
        "what": "HF transformers TP (DistributedConfig(tp_size=2)) under plain torchrun, one hangd serve "
                "(--interval 1, SQLite), each scenario recorded with hangd record",
        "software": versions(),
        "checkpoint_seconds": round(ckpt_s, 1),
        "checkpoint": (out / "make_ckpt.log").read_text().splitlines()[-1] if (out / "make_ckpt.log").exists() else None,
        "hold_after_hang_s": HOLD,
        "skipped": skipped,
        "scenarios": results,
        "summary": summarize(results),
        "hangd": {"cpu_core_fraction_suite": round(suite_cpu, 4), "rss_bytes_max": poller.rss_max,
                  "rss_bytes_end": sp.memory_info().rss,
                  "tick_p50_s_bucket": histogram_quantile(metrics, "hangd_tick_duration_seconds", 0.5),
                  "tick_p99_s_bucket": histogram_quantile(metrics, "hangd_tick_duration_seconds", 0.99),
                  "ticks": metric(metrics, "hangd_ticks_total"), "tick_failures": metric(metrics, "hangd_tick_failures_total"),
                  "poll_errors": poller.errors, "incidents_total": len(incs)},
    }
    subs = sorted([(str(out / "jobs"), "/var/tmp/job"), (str(ckpt), "/data/ckpt"), (str(out), "/var/tmp/out"),
                   (str(ROOT), "/opt/job")], key=lambda x: -len(x[0]))

    def neutral(text: str) -> str:
        for a, r in subs:
            text = text.replace(a, r)
        return text

    (out / "report.json").write_text(neutral(json.dumps(report, indent=1)))
    (out / "incidents.json").write_text(neutral(json.dumps(details, indent=1)))
    (out / "metrics.txt").write_text(metrics)
    (out / "timeline.json").write_text(neutral(json.dumps(timeline)))
    (out / "states.jsonl").write_text(neutral("".join(json.dumps(r) + "\n" for r in poller.rows)))
    (out / "jobs.jsonl").write_text(neutral("".join(json.dumps(r) + "\n" for r in poller.jobs)))
    serve.terminate()
    try:
        serve.wait(20)
    except subprocess.TimeoutExpired:
        serve.kill()
    for sc in results:
        d = out / "traces" / sc["scenario"]
        neutralize(d, subs)
        with tarfile.open(out / f"{sc['scenario']}.tar.gz", "w:gz") as tf:
            tf.add(d, arcname=sc["scenario"])
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tf:
        for f in ["serve.log", "make_ckpt.log", "incidents.json", "metrics.txt", "timeline.json", "states.jsonl", "jobs.jsonl"]:
            if (out / f).exists():
                tf.add(out / f, arcname=f)
        for f in sorted((out / "jobs").rglob("*.log")):
            tf.add(f, arcname=str(f.relative_to(out)))
    print(json.dumps(report["summary"], indent=1))
    print(json.dumps(report["hangd"], indent=1))


if __name__ == "__main__":
    main()
