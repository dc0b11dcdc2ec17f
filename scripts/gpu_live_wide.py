"""The wide live run: ONE `hangd serve` watches healthy jobs of 4 and 8 ranks, one after another, all
ranks sharing the host's GPU(s) (each rank its own NCCL_HOSTID, set by tests/workloads/matrix_job.py),
and this writes what hangd said about them: per job the rank-seconds in each state, the incidents
opened (on healthy jobs every one is a false alarm) and `hangd status` at a few moments of each phase.

    python scripts/gpu_live_wide.py OUTDIR [--device cuda|cpu] [--jobs serve8,train4,fsdp8,graph4,graph8]
                                           [--world N] [--short]

Jobs (tests/workloads/matrix_job.py, launched as scripts/matrix.py launches a cell):
  serve8  mpargv  warmup         8 ranks: a server's collective warm-up, then idle serving (killed)
  serve4  mpargv  warmup         4 ranks: the same (not in the default list)
  train4  torchrun train         4 ranks: DDP training with DataLoader workers, then a clean exit
  fsdp8   torchrun train         8 ranks: FSDP2 (fully_shard) training, the same loop
  graph4  spawn   graph_capture  4 ranks: CUDA graphs captured over the batch sizes, replayed, exit
  graph8  parent  graph_capture  8 ranks: the same
--device cpu (gloo) runs serve and train only (graph capture needs a GPU); --world N overrides the
ranks of every job (e.g. 2 on a laptop); --short shortens every job for a try-out.

OUTDIR: report.json, samples.jsonl (every second: /processes), status.txt (the `hangd status`
captures), incidents.json, serve.log (hangd serve's own log), jobs.log (the jobs' output, tails).
With --record, also OUTDIR/traces/<job>/: a hangd-trace/1 bundle of each job recorded beside serve
at serve's own pace and with only the asking its analysis does (no periodic stacks or flight-recorder
dumps, unlike scripts/matrix.py's cells), with truth.jsonl and expect.json: what serve saw, to replay.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(MULTICAST_OFF)  # in every environment started from here: serve, status, the jobs

# name: (launcher, phase, world, seconds at most, killed at the end (a server) or exits itself, env)
JOBS: dict[str, tuple[str, str, int, float, bool, dict[str, str]]] = {
    "serve8": ("mpargv", "warmup", 8, 75.0, True, {"MATRIX_WARMUP_S": "15"}),
    "serve4": ("mpargv", "warmup", 4, 60.0, True, {"MATRIX_WARMUP_S": "15"}),
    "train4": ("torchrun", "train", 4, 90.0, False, {"MATRIX_PHASE_S": "25"}),
    "fsdp8": ("torchrun", "train", 8, 90.0, False, {"MATRIX_PHASE_S": "20", "MATRIX_FSDP": "1"}),
    "graph4": ("spawn", "graph_capture", 4, 70.0, False, {"MATRIX_CAPTURE_S": "20", "MATRIX_PHASE_S": "20"}),
    "graph8": ("parent", "graph_capture", 8, 75.0, False, {"MATRIX_CAPTURE_S": "20", "MATRIX_PHASE_S": "20"}),
}
SHORT = {"MATRIX_WARMUP_S": "5", "MATRIX_PHASE_S": "5", "MATRIX_CAPTURE_S": "5"}
HANG_FAMILY = ("nccl_stall", "host_stall", "io_stall", "rank_exited", "straggler", "orphaned_gpu_memory",
               "collective_mismatch")
STATUS_AT = (1.5, 8.0, 20.0)  # seconds into a phase at which `hangd status` is captured
TEARDOWN_GRACE_S = 12.0  # a rank that said it is done and still lives this long after: blocked in teardown


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def cpu_of(p: psutil.Process) -> float:
    try:
        t = p.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


class Poller(threading.Thread):
    """Every second: GET /processes (every row kept) and /incidents (the latest version of each)."""

    def __init__(self, base: str, samples: Path) -> None:
        super().__init__(daemon=True)
        self.base = base
        self.out = open(samples, "w")
        self.rows: list[dict[str, Any]] = []  # {t, pid, rank, job, state, reason}
        self.incidents: dict[int, dict[str, Any]] = {}
        self.first_seen: dict[int, float] = {}
        self.errors: list[str] = []
        self.n = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        next_t = time.time()
        while not self.stop.is_set():
            next_t += 1.0
            t = time.time()
            try:
                procs = get(self.base + "/processes")
                incs = get(self.base + "/incidents?limit=500")["incidents"]
            except Exception as e:  # noqa: BLE001 - counted and reported
                self.errors.append(f"{round(t, 1)} {type(e).__name__}: {e}")
                procs, incs = None, []
            with self.lock:
                if procs is not None:
                    rows = [{"t": round(t, 2), "pid": p["pid"], "rank": p["rank"], "job": p["job"], "state": p["state"],
                             "reason": p["reason"], "for_s": p.get("for_s")} for p in procs]
                    self.rows += rows
                    self.out.write(json.dumps({"t": round(t, 2), "processes": rows,
                                               "open_incidents": [i["id"] for i in incs if i["status"] == "open"]}) + "\n")
                    self.out.flush()
                    self.n += 1
                for i in incs:
                    self.incidents[i["id"]] = i
                    self.first_seen.setdefault(i["id"], t)
            self.stop.wait(max(0.0, next_t - time.time()))


class StatusTaker:
    """`hangd status` in a thread of its own (it watches 2 s), one at a time; every capture kept."""

    def __init__(self, listen: str, out: Path) -> None:
        self.base = f"http://{listen}"
        self.env = dict(os.environ, HANGD_LISTEN=listen)
        self.out = open(out, "w")
        self.busy = threading.Lock()
        self.taken: list[dict[str, Any]] = []

    def take(self, label: dict[str, Any]) -> bool:
        if not self.busy.acquire(blocking=False):
            return False
        threading.Thread(target=self._run, args=(label,), daemon=True).start()
        return True

    def _run(self, label: dict[str, Any]) -> None:
        try:
            t = time.time()
            try:
                r = subprocess.run([sys.executable, "-m", "hangd", "status"], cwd=ROOT, env=self.env,
                                   capture_output=True, text=True, timeout=40)
                text, rc = r.stdout + (("\n[stderr] " + r.stderr.strip()) if r.stderr.strip() else ""), r.returncode
            except subprocess.TimeoutExpired:
                text, rc = "(hangd status took over 40 s)", None
            try:  # what the daemon itself says at the same moment (status shows its own 2-s look)
                daemon = [f"{p['pid']} rank={p['rank']} {p['state']} for {p.get('for_s')} s: {p['reason'][:110]}"
                          for p in get(self.base + "/processes") if p["state"] != "gone"]
            except Exception as e:  # noqa: BLE001 - reported
                daemon = [f"GET /processes failed: {e}"]
            entry = {**label, "t": round(t, 2), "took_s": round(time.time() - t, 1), "rc": rc, "text": text,
                     "daemon_processes": daemon}
            self.taken.append(entry)
            self.out.write(f"===== {label['job']} phase={label['phase']} +{label['at_s']} s into the phase "
                           f"(job +{label['job_s']} s) rc={rc}\n{text}\n----- GET /processes (hangd serve) then:\n"
                           + "\n".join(daemon) + "\n\n")
            self.out.flush()
        finally:
            self.busy.release()

    def wait(self, timeout: float = 45.0) -> None:
        if self.busy.acquire(timeout=timeout):
            self.busy.release()


def phase_of(truth: list[dict[str, Any]]) -> str:
    """The job's phase: rank 0's last truth line (state:phase), 'launching' before it has one."""
    mine = [x for x in truth if x["rank"] == 0]
    return mine[-1]["phase"] if mine else "launching"


def truth_at(lines: list[dict[str, Any]], t: float) -> str | None:
    st = None
    for x in lines:
        if x["t"] <= t:
            st = x["state"]
    return st


def run_job(name: str, a: argparse.Namespace, out: Path, work: Path, poller: Poller, status: StatusTaker,
            serve_p: psutil.Process, log: Any) -> dict[str, Any]:
    from hf_live import read_truth
    from matrix import alive, kill_all, launch, tree

    launcher_kind, phase, world, max_s, killed, extra = JOBS[name]
    rec, rec_dir = None, out / "traces" / name
    if a.record:
        shutil.rmtree(rec_dir, ignore_errors=True)
        rec_dir.parent.mkdir(parents=True, exist_ok=True)
        rec = subprocess.Popen([sys.executable, "-m", "hangd", "record", "--out", str(rec_dir), "--seconds",
                                str(int(max_s + a.gap + 30)), "--hz", "1"], cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=open(work / f"record-{name}.log", "w"),
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(1.0)
    if a.world:
        world = a.world
    env_over = dict(extra, **(SHORT if a.short else {}))
    if a.short:
        max_s = min(max_s, 45.0)
    c = {"launcher": launcher_kind, "phase": phase, "fault": "none", "wait": "none", "world": str(world)}
    job = work / name
    job.mkdir(parents=True)
    saved = {k: os.environ.get(k) for k in env_over}
    os.environ.update(env_over)  # matrix.job_env copies os.environ
    try:
        log.write(f"\n===== {name}: {launcher_kind} {phase} w{world} {env_over}\n")
        log.flush()
        jlog = open(job / "launcher.log", "w")
        t0 = time.time()
        c0 = cpu_of(serve_p)
        launcher = launch(c, job, jlog)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    pids: set[int] = {launcher.pid}
    cur_phase, phase_t0, phase_taken = None, t0, 0
    phases: list[dict[str, Any]] = []
    done_at: float | None = None
    exited_itself = False
    teardown_blocked: list[int] = []
    end = t0 + max_s
    while time.time() < end:
        time.sleep(0.25)
        now = time.time()
        tree(launcher.pid, pids)
        truth = read_truth(job)
        pids |= {x["pid"] for x in truth}
        p = phase_of(truth)
        if p != cur_phase:
            cur_phase, phase_t0, phase_taken = p, now, 0
            phases.append({"t_s": round(now - t0, 1), "phase": p})
            print(f"[{name} +{now - t0:5.1f}s] phase {p}", flush=True)
        if phase_taken < len(STATUS_AT) and now - phase_t0 >= STATUS_AT[phase_taken] and status.take(
                {"job": name, "phase": p, "at_s": STATUS_AT[phase_taken], "job_s": round(now - t0, 1)}):
            phase_taken += 1
        if launcher.poll() is not None and not any(alive(x) for x in pids - {launcher.pid}):
            exited_itself = True
            break
        ranks = {x["pid"] for x in truth}
        done = [x for x in truth if x["phase"] == "busy:done"]
        if not killed and len({x["rank"] for x in done}) == world and done_at is None:
            done_at = max(x["t"] for x in done)
        if done_at is not None and now > done_at + TEARDOWN_GRACE_S:
            teardown_blocked = sorted(x for x in ranks if alive(x))
            break
    t_end = time.time()
    c1 = cpu_of(serve_p)
    truth = read_truth(job)
    rank_of = {x["pid"]: x["rank"] for x in truth}
    kill_all(pids - {launcher.pid}, launcher)
    rc = launcher.returncode
    time.sleep(a.gap)  # the same serve sees the ranks go; what it opens then is kept apart
    t_after = time.time()
    if rec is not None:
        finish_recording(rec, rec_dir, c, name, job, truth, pids, t_end, killed)
    with poller.lock:
        rows = [r for r in poller.rows if t0 <= r["t"] <= t_end]
        after = [r for r in poller.rows if t_end < r["t"] <= t_after]
        incs = dict(poller.incidents)
    by_pid_truth: dict[int, list[dict[str, Any]]] = {}
    for x in sorted(truth, key=lambda x: x["t"]):
        by_pid_truth.setdefault(x["pid"], []).append(x)
    states: dict[str, int] = {}
    per_rank: dict[str, dict[str, int]] = {}
    others: dict[str, int] = {}
    confusion: dict[str, int] = {}
    reasons: dict[str, dict[str, int]] = {}
    seconds_seen = len({r["t"] for r in rows})
    for r in rows:
        if r["pid"] in rank_of:
            states[r["state"]] = states.get(r["state"], 0) + 1
            k = str(rank_of[r["pid"]])
            per_rank.setdefault(k, {})
            per_rank[k][r["state"]] = per_rank[k].get(r["state"], 0) + 1
            want = truth_at(by_pid_truth[r["pid"]], r["t"])
            key = f"{want}->{r['state']}"
            confusion[key] = confusion.get(key, 0) + 1
            rs = reasons.setdefault(r["state"], {})
            short = r["reason"][:140]
            rs[short] = rs.get(short, 0) + 1
        elif r["pid"] in pids:
            key = f"{r['state']}"
            others[key] = others.get(key, 0) + 1
    after_states: dict[str, int] = {}
    for r in after:
        if r["pid"] in rank_of:
            after_states[r["state"]] = after_states.get(r["state"], 0) + 1

    def brief(i: dict[str, Any]) -> dict[str, Any]:
        return {"id": i["id"], "kind": i["kind"], "severity": i["severity"], "status": i["status"], "job": i["job"],
                "opened_s": round(i["opened_at"] - t0, 1), "hang_started_s": round(i["hang_started_at"] - t0, 1)
                if i.get("hang_started_at") else None, "resolved_s": round(i["resolved_at"] - t0, 1)
                if i.get("resolved_at") else None, "culprit_ranks": i.get("culprit_ranks"),
                "culprit_pids": i.get("culprit_pids"), "ranks": i.get("ranks"), "summary": i["summary"]}

    mine = [i for i in incs.values() if t0 - 1 <= i["opened_at"] <= t_end or (set(i.get("pids") or []) & pids
                                                                               and i["opened_at"] <= t_end)]
    later = [i for i in incs.values() if t_end < i["opened_at"] <= t_after]
    right = sum(v for k, v in confusion.items() if k.split("->")[0] == k.split("->")[1])
    entry = {
        "job": name, "launcher": launcher_kind, "phase": phase, "world": world, "env": env_over,
        "seconds_run": round(t_end - t0, 1), "samples": seconds_seen,
        "ended": "exited by itself" if exited_itself else ("ranks blocked in teardown, killed" if teardown_blocked
                                                            else "killed at the time limit (a server)"
                                                            if killed else "killed at the time limit"),
        "launcher_rc": rc, "teardown_blocked_pids": teardown_blocked,
        "rank_pids": {str(r): p for p, r in sorted(rank_of.items(), key=lambda kv: kv[1])},
        "other_pids": sorted(pids - set(rank_of)),
        "state_rank_seconds": dict(sorted(states.items(), key=lambda kv: -kv[1])),
        "state_rank_seconds_per_rank": dict(sorted(per_rank.items(), key=lambda kv: int(kv[0]))),
        "state_seconds_other_pids": others,
        "truth_vs_hangd_rank_seconds": dict(sorted(confusion.items(), key=lambda kv: -kv[1])),
        "agreement_with_truth": round(right / max(1, sum(confusion.values())), 3),
        "reasons_by_state": {s: dict(sorted(v.items(), key=lambda kv: -kv[1])[:4]) for s, v in reasons.items()},
        "incidents_opened": [brief(i) for i in sorted(mine, key=lambda i: i["opened_at"])],
        "hang_family_incidents": [brief(i) for i in mine if i["kind"] in HANG_FAMILY],
        "false_alarm": bool(mine),
        "incidents_opened_after_teardown": [brief(i) for i in later],
        "states_after_teardown_rank_seconds": after_states,
        "phases": phases,
        "truth_rank0": [{"t_s": round(x["t"] - t0, 1), "state": x["state"], "phase": x["phase"]}
                        for x in truth if x["rank"] == 0],
        "hangd_cpu_core_fraction": round((c1 - c0) / max(1e-6, t_end - t0), 4),
        "job_log_tail": (job / "launcher.log").read_text(errors="replace").splitlines()[-12:],
        "job_log_key_lines": [x[:200] for x in (job / "launcher.log").read_text(errors="replace").splitlines()
                              if re.search(r"warm-up|Capture cuda graph|replays|ready|Traceback|Error:|step \d*00 ", x)
                              and "preparing to dump" not in x][:60],
        "job_log_fr_dump_lines": sum("preparing to dump debug info" in x for x in
                                     (job / "launcher.log").read_text(errors="replace").splitlines()),
    }
    text = (job / "launcher.log").read_text(errors="replace")
    log.write(text if len(text) <= 12000 else text[:4000] + "\n[...]\n" + text[-8000:])
    log.flush()
    status.wait()
    entry["status_snapshots"] = [{k: s[k] for k in ("phase", "at_s", "job_s", "rc", "took_s", "text",
                                                     "daemon_processes")}
                                 for s in status.taken if s["job"] == name]
    print(f"== {name}: {entry['seconds_run']} s, {entry['ended']}; states {entry['state_rank_seconds']}; "
          f"agreement {entry['agreement_with_truth']}; incidents {[(i['kind'], i['culprit_ranks']) for i in mine]}",
          flush=True)
    return entry


def finish_recording(rec: subprocess.Popen[bytes], d: Path, c: dict[str, str], name: str, job: Path,
                     truth: list[dict[str, Any]], pids: set[int], t_end: float, killed: bool) -> None:
    """Stop the job's recorder and make its bundle a cell as scripts/matrix.py makes one: this job's
    processes only, host paths neutral, its truth (a server killed at the end is gone then) and expect."""
    from matrix import (
        expect,
        finish_truth,
        gzip_trace,
        host_paths,
        keep_only,
        merge_actions,
        neutralize_cell,
        stop_recorder,
    )

    stop_recorder(rec)
    if not (d / "trace.jsonl").exists():
        return
    actions = [{"t": round(t_end, 3), "kind": "action", "what": "sigkill_all", "pid": None}]
    final = finish_truth(truth, actions, {}, t_end)
    merge_actions(d, actions)
    keep_only(d, pids, job)
    neutralize_cell(d, host_paths(job))
    meta = json.loads((d / "meta.json").read_text())
    meta.update({"scenario": f"live-{name}", "axes": c, "world_size": int(c["world"]), "t_end": t_end,
                 "ranks": {str(x["rank"]): x["pid"] for x in final if x["state"] == "starting"},
                 "driver": "scripts/gpu_live_wide.py --record", "device": os.environ.get("MATRIX_DEVICE", "cpu"),
                 "launch": f"{c['launcher']} tests/workloads/matrix_job.py {c['launcher']} {c['phase']} none none JOBDIR"
                           f" --world-size {c['world']}", "killed_at_end": killed})
    (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    (d / "truth.jsonl").write_text("".join(json.dumps(x) + "\n" for x in final))
    (d / "expect.json").write_text(json.dumps(expect(c, final, None), indent=1) + "\n")
    gzip_trace(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--jobs", default="")
    ap.add_argument("--world", type=int, default=0, help="ranks of every job (default: each job's own)")
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--port", type=int, default=0, help="hangd serve's port (default: a free one)")
    ap.add_argument("--gap", type=float, default=5.0, help="seconds watched after each job's teardown")
    ap.add_argument("--budget-s", type=float, default=480.0, help="no job starts past this many seconds")
    ap.add_argument("--record", action="store_true", help="also record each job (OUTDIR/traces/<job>/) to replay")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.device == "cuda":
        os.environ["MATRIX_DEVICE"] = "cuda"
    else:
        os.environ.pop("MATRIX_DEVICE", None)
    names = [n for n in a.jobs.split(",") if n] or ([n for n in JOBS if n != "serve4"] if a.device == "cuda" else ["serve8", "train4", "fsdp8"])
    work = Path(tempfile.mkdtemp(prefix="hangd-live-wide-"))
    port = a.port or free_port()
    listen = f"127.0.0.1:{port}"
    base = f"http://{listen}"
    serve_log = open(out / "serve.log", "w")
    T0 = time.time()
    serve = subprocess.Popen([sys.executable, "-m", "hangd", "serve", "--listen", listen, "--interval", "1",
                              "--db", f"sqlite:///{work / 'hangd.db'}"], cwd=ROOT, stdout=serve_log,
                             stderr=subprocess.STDOUT)
    serve_p = psutil.Process(serve.pid)
    ready = None
    for _ in range(120):
        time.sleep(0.5)
        if serve.poll() is not None:
            break
        try:
            ready = get(base + "/readyz")
            if ready.get("status") in ("ok", "degraded"):
                break
        except Exception:  # noqa: BLE001 - not up yet
            continue
    report: dict[str, Any] = {"device": a.device, "listen": listen, "serve_ready_s": round(time.time() - T0, 1),
                              "readyz": ready, "jobs": []}
    try:
        import torch

        report["torch"] = torch.__version__
        if a.device == "cuda" and torch.cuda.is_available():
            report["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception as e:  # noqa: BLE001 - reported
        report["torch"] = f"unavailable: {e}"
    try:
        report["gpus_api"] = get(base + "/gpus")
    except Exception as e:  # noqa: BLE001 - reported
        report["gpus_api"] = f"error: {e}"
    print(f"hangd serve on {listen}, ready after {report['serve_ready_s']} s: {ready}", flush=True)
    poller = Poller(base, out / "samples.jsonl")
    poller.start()
    status = StatusTaker(listen, out / "status.txt")
    jobs_log = open(out / "jobs.log", "w")
    try:
        if serve.poll() is not None:
            raise SystemExit("hangd serve exited: see serve.log")
        time.sleep(2.0)
        for name in names:
            if time.time() - T0 > a.budget_s:
                report["jobs"].append({"job": name, "skipped": f"past the budget of {a.budget_s} s"})
                continue
            try:
                report["jobs"].append(run_job(name, a, out, work, poller, status, serve_p, jobs_log))
            except Exception as e:  # noqa: BLE001 - one job's failure is reported, the next still runs
                import traceback

                report["jobs"].append({"job": name, "error": traceback.format_exc()[-3000:]})
                print(f"== {name}: ERROR {e}", flush=True)
            (out / "report.json").write_text(json.dumps(report, indent=1))  # so far, in case the run is cut
    finally:
        poller.stop.set()
        poller.join(5)
        status.wait()
        with poller.lock:
            report["all_incidents"] = [{k: i.get(k) for k in ("id", "kind", "severity", "status", "job", "opened_at",
                                                              "culprit_ranks", "summary")}
                                       for i in sorted(poller.incidents.values(), key=lambda i: i["id"])]
            report["poll_errors"] = poller.errors[:20]
            report["poll_samples"] = poller.n
        try:
            report["hangd_serve_rss_bytes"] = serve_p.memory_info().rss
            report["hangd_serve_cpu_s"] = round(cpu_of(serve_p), 1)
        except psutil.Error:
            pass
        try:
            (out / "incidents.json").write_text(json.dumps(get(base + "/incidents?limit=500"), indent=1))
        except Exception as e:  # noqa: BLE001 - reported
            report["final_incidents_error"] = str(e)
        report["serve_alive_at_end"] = serve.poll() is None
        report["wall_s"] = round(time.time() - T0, 1)
        report["false_alarms_total"] = sum(len(j.get("incidents_opened", [])) for j in report["jobs"])
        serve.terminate()
        try:
            serve.wait(20)
        except subprocess.TimeoutExpired:
            serve.kill()
        serve_log.close()
        report["serve_log_tail"] = (out / "serve.log").read_text(errors="replace").splitlines()[-40:]
        (out / "report.json").write_text(json.dumps(report, indent=1))
        shutil.rmtree(work, ignore_errors=True)
    summary = [{k: j.get(k) for k in ("job", "seconds_run", "ended", "state_rank_seconds", "agreement_with_truth",
                                      "error", "skipped")} | {"incidents": [(i["kind"], i["severity"], i["culprit_ranks"])
                                                                for i in j.get("incidents_opened", [])]}
               for j in report["jobs"]]
    print(json.dumps({"wall_s": report["wall_s"], "false_alarms_total": report["false_alarms_total"],
                      "jobs": summary}, indent=1))


if __name__ == "__main__":
    main()
