"""End to end on this CPU machine: real 2- and 4-rank torch jobs over gloo, started by a
torchrun-like launcher, watched by a real `hangd serve`, scraped by a real Prometheus that has the
shipped rules loaded. Two waves of jobs run at once; every hang case must open the right incident
naming the right rank, fire the hung-job alert, show in `curl /incidents`, and resolve once the job
is gone. Detection latencies are written to e2e-latency.json in the test's tmp dir and printed.

Flight recorder on gloo: the jobs dump through torch's API from a watchdog thread when no step
completed for 8 s (the NCCL watchdog dumps on timeout; gloo has no dump pipe), to
TORCH_FR_DUMP_TEMP_FILE, where hangd finds the files."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from ..conftest import ROOT, WORKLOADS, torch_available
from ..realpg import free_port
from ..served import serve
from ..teardown import kill_all

pytestmark = [pytest.mark.skipif(not torch_available(), reason="torch is a test dependency"),
              pytest.mark.torchrun, pytest.mark.prometheus]
RULES = ROOT / "deploy" / "prometheus" / "hangd-rules.yml"
LATENCY: dict[str, float] = {}


class Job:
    def __init__(self, tmp: Path, name: str, ranks: int, *args: str, cmd: list[str] | None = None) -> None:
        self.name = name
        self.dir = tmp / name
        self.dir.mkdir()
        cmd = cmd or [sys.executable, str(WORKLOADS / "launch.py"), str(ranks), str(self.dir),
                      str(WORKLOADS / "gloo_job.py"), *args]
        self.launcher = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pids: list[int] = []
        t_end = time.time() + 30
        while len(self.pids) < ranks and time.time() < t_end:
            self.pids = [c.pid for c in psutil.Process(self.launcher.pid).children()]
            time.sleep(0.2)
        self.event_at: float | None = None

    def log(self, rank: int) -> str:
        p = self.dir / f"log_{rank}.txt"
        return p.read_text() if p.exists() else ""

    def kill(self) -> None:
        kill_all(self.pids, self.launcher)


def _alerts(prom: str) -> list[dict]:
    try:
        return httpx.get(prom + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    except httpx.HTTPError:
        return []


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    s = serve(tmp, "--interval", "0.5", env={"HANGD_JOB_ENV": "MASTER_ADDR"})
    port = free_port()
    doc = yaml.safe_load(RULES.read_text())
    for g in doc["groups"]:
        g["interval"] = "1s"
    (tmp / "rules.yml").write_text(yaml.safe_dump(doc))
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(tmp / "rules.yml")],
        "scrape_configs": [{"job_name": "hangd",
                            "static_configs": [{"targets": [s.url.removeprefix("http://")]}]}]}))
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=open(tmp / "prom.log", "w"), stderr=subprocess.STDOUT)
    w = {"hangd": s, "prom": f"http://127.0.0.1:{port}", "tmp": tmp, "jobs": {}, "firing": {}, "incidents": {},
         "states": {}}
    jobs: list[Job] = []
    try:
        # wave 1: healthy training, a 4-rank deadlock, a size mismatch
        jobs += [Job(tmp, "healthy", 2, "train", "--steps", "0", "--step-sleep", "0.02", "--size", "262144"),
                 Job(tmp, "deadlock", 4, "deadlock", "--steps", "80", "--step-sleep", "0.05", "--culprit", "2",
                     "--watchdog", "8"),
                 Job(tmp, "mismatch", 2, "size", "--steps", "5", "--size", "1024", "--step-sleep", "0")]
        _watch(w, jobs, 95)  # eight torch processes start at once on two cores
        # wave 2: a rank killed, a launcher killed, a rank stopped
        for j in jobs:
            if j.name != "healthy":
                j.kill()
        wave2 = [Job(tmp, "kill", 2, "train", "--steps", "0", "--step-sleep", "0.1"),
                 Job(tmp, "orphan", 2, "train", "--steps", "0", "--step-sleep", "0.1"),
                 Job(tmp, "sigstop", 2, "train", "--steps", "0", "--step-sleep", "0.1")]
        # DDP training under torchrun with 2 DataLoader workers a rank: healthy, and rank 1's worker blocked
        ddp = [Job(tmp, name, 2, cmd=[sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                      "--master-port", str(free_port()), str(WORKLOADS / "matrix_job.py"), "torchrun",
                                      "train", fault, "event", str(tmp / name)])
               for name, fault in (("ddp_healthy", "none"), ("ddp_loader_blocked", "dl_blocks"))]
        # what only the descriptors tell apart: rank 1 selects on the pipe of a child it started, which
        # never writes (its stack shows its own frame over select, as a server's does), and a server
        # whose ranks wait for connections on a listening socket
        ddp += [Job(tmp, name, 2, cmd=[sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                       "--master-port", str(free_port()), str(WORKLOADS / "matrix_job.py"), "torchrun",
                                       phase, fault, wait, str(tmp / name)])
                for name, phase, fault, wait in (("select_on_child", "train", "stuck", "child_pipe"),
                                                 ("server_accepting", "serve_accept", "none", "none"))]
        jobs += wave2 + ddp
        _wait_steps(wave2, 10, 60)
        actions = {"kill": (signal.SIGKILL, 1), "sigstop": (signal.SIGSTOP, 1)}
        for j in wave2:
            if j.name in actions:
                sig, rank = actions[j.name]
                os.kill(j.pids[rank], sig)
            else:
                os.kill(j.launcher.pid, signal.SIGKILL)
            j.event_at = time.time()
        _watch(w, jobs, 45)
        # the blocked DataLoader worker: watch until it has blocked its rank for 45 s (its training is slow here)
        block = tmp / "ddp_loader_blocked" / "worker_block_1.json"
        t_end = time.time() + 120
        while not block.exists() and time.time() < t_end:
            _watch(w, jobs, 1)
        if block.exists():
            _watch(w, jobs, json.loads(block.read_text())["t"] + 45 - time.time())
        for j in jobs:
            w["jobs"][j.name] = j
        # the jobs go; their incidents must resolve
        for j in jobs:
            j.kill()
        time.sleep(6)
        w["after"] = s.get("/incidents").json()["incidents"]
        yield w
    finally:
        for j in jobs:
            j.kill()
        prom.terminate()
        prom.wait(20)
        s.stop()
        (tmp / "e2e-latency.json").write_text(json.dumps(LATENCY, indent=1))
        print("e2e detection latency (s):", json.dumps(LATENCY))


def _wait_steps(jobs: list[Job], steps: int, timeout: float) -> None:
    t_end = time.time() + timeout
    while time.time() < t_end:
        if all(re.search(rf"step {steps}\b", j.log(0)) for j in jobs):
            return
        time.sleep(0.5)
    raise AssertionError("jobs did not start training: " + " | ".join(j.log(0)[-300:] for j in jobs))


def _watch(w: dict, jobs: list[Job], seconds: float) -> None:
    t_end = time.time() + seconds
    while time.time() < t_end:
        for inc in w["hangd"].get("/incidents").json()["incidents"]:
            w["incidents"].setdefault(inc["id"], {**inc, "seen": time.time()})
        for p in w["hangd"].get("/processes").json():
            w["states"].setdefault(p["pid"], []).append((time.time(), p["state"], p.get("reason", "")))
        for a in _alerts(w["prom"]):
            if a["state"] == "firing":
                w["firing"].setdefault((a["labels"]["alertname"], a["labels"].get("incident")), time.time())
        time.sleep(0.5)


def _incidents_of(w: dict, name: str) -> list[dict]:
    pids = set(w["jobs"][name].pids)
    return sorted((i for i in w["incidents"].values() if set(i["pids"]) & pids), key=lambda i: i["opened_at"])


def _detail(w: dict, inc: dict) -> dict:
    return w["hangd"].get(f"/incidents/{inc['id']}").json()


def test_healthy_training_no_incident(world):
    assert not _incidents_of(world, "healthy"), [_detail(world, i) for i in _incidents_of(world, "healthy")]
    tl = world["hangd"].get("/timeline", params={"limit": 5000}).json()
    pids = world["jobs"]["healthy"].pids
    seen = {e["state"] for e in tl if e["pid"] in pids}
    assert "busy" in seen and seen <= {"starting", "busy", "waiting_peer", "straggler", "gone"}, seen


def test_deadlock_host_stall_names_the_culprit_with_stacks_and_flight_recorder(world):
    incs = _incidents_of(world, "deadlock")
    hangs = [i for i in incs if i["kind"] != "straggler"]
    assert [i["kind"] for i in hangs] == ["host_stall"], [_detail(world, i) for i in incs]
    inc = _detail(world, hangs[0])
    job = world["jobs"]["deadlock"]
    assert inc["culprit_ranks"] == [2] and inc["culprit_pids"] == [job.pids[2]]
    assert set(inc["evidence"]["stacks"]) == {"0", "1", "2", "3"}
    miss = [f for f in inc["findings"] if f["kind"] == "missing_rank"]
    assert miss and miss[0]["missing_ranks"] == [2], inc["findings"]
    stopped_at = float(re.search(r"t=([\d.]+)", job.log(2)).group(1))
    LATENCY["host_stall (4-rank deadlock)"] = round(inc["opened_at"] - stopped_at, 1)
    assert inc["opened_at"] - stopped_at <= 30
    assert ("HangdJobHung", str(inc["id"])) in world["firing"]


def test_size_mismatch_is_a_collective_mismatch(world):
    incs = _incidents_of(world, "mismatch")
    assert "collective_mismatch" in [i["kind"] for i in incs], (incs, world["jobs"]["mismatch"].log(0)[-800:],
                                                                world["jobs"]["mismatch"].log(1)[-800:])
    inc = _detail(world, next(i for i in incs if i["kind"] == "collective_mismatch"))
    f = [x for x in inc["findings"] if x["kind"] == "size_mismatch"][0]
    assert f["sizes"] == {"0": [[1024]], "1": [[2048]]}
    assert ("HangdCollectiveMismatch", str(inc["id"])) in world["firing"]


def test_killed_rank_is_rank_exited(world):
    job = world["jobs"]["kill"]
    incs = _incidents_of(world, "kill")
    assert [i["kind"] for i in incs][:1] == ["rank_exited"], incs
    assert incs[0]["culprit_ranks"] == [1]
    LATENCY["rank_exited"] = round(incs[0]["opened_at"] - job.event_at, 1)
    assert ("HangdRankExited", str(incs[0]["id"])) in world["firing"]


def test_killed_launcher_leaves_orphaned_ranks(world):
    job = world["jobs"]["orphan"]
    tl = world["hangd"].get("/timeline", params={"limit": 5000}).json()
    orphaned = {e["pid"]: e["t"] for e in tl if e["pid"] in job.pids and e["state"] == "orphaned"}
    assert set(orphaned) == set(job.pids)
    LATENCY["orphaned"] = round(max(orphaned.values()) - job.event_at, 1)


def test_stopped_rank_is_the_culprit_of_the_stall(world):
    job = world["jobs"]["sigstop"]
    incs = [i for i in _incidents_of(world, "sigstop") if i["kind"] in ("host_stall", "nccl_stall")]
    assert incs, _incidents_of(world, "sigstop")
    assert incs[0]["culprit_ranks"] == [1] and incs[0]["culprit_pids"] == [job.pids[1]]
    LATENCY["host_stall (SIGSTOP)"] = round(incs[0]["opened_at"] - job.event_at, 1)
    assert ("HangdJobHung", str(incs[0]["id"])) in world["firing"]


def _truth(job: Job) -> list[dict]:
    return [json.loads(line) for f in job.dir.glob("truth_*.jsonl") for line in f.read_text().splitlines() if line]


def _rank_pids(job: Job) -> dict[int, int]:
    """rank -> pid, from the truth lines the matrix workload writes."""
    out = {}
    for f in job.dir.glob("truth_*.jsonl"):
        line = json.loads(f.read_text().splitlines()[0])
        out[line["rank"]] = line["pid"]
    return out


def test_ddp_with_dataloader_workers_healthy_no_incident(world):
    incs = _incidents_of(world, "ddp_healthy")
    assert not incs, [_detail(world, i) for i in incs]


def test_blocked_dataloader_worker_is_one_hang_naming_the_rank_and_its_worker(world):
    job = world["jobs"]["ddp_loader_blocked"]
    incs = _incidents_of(world, "ddp_loader_blocked")
    assert (job.dir / "worker_block_1.json").exists(), "rank 1's DataLoader worker never blocked"
    assert [i["kind"] for i in incs] == ["host_stall"], [_detail(world, i) for i in incs]
    inc = _detail(world, incs[0])
    worker = json.loads((job.dir / "worker_block_1.json").read_text())  # the worker writes it as it blocks
    assert inc["culprit_ranks"] == [1] and inc["culprit_pids"] == [_rank_pids(job)[1]], inc
    assert str(worker["worker_pid"]) in inc["summary"], inc["summary"]
    LATENCY["host_stall (DataLoader worker blocked)"] = round(inc["opened_at"] - worker["t"], 1)


def test_a_rank_selecting_on_its_child_s_pipe_is_one_hang_naming_the_child(world):
    job = world["jobs"]["select_on_child"]
    incs = _incidents_of(world, "select_on_child")
    assert (job.dir / "worker_block_1.json").exists(), "rank 1 never started selecting on its child's pipe"
    assert [i["kind"] for i in incs] == ["host_stall"], [_detail(world, i) for i in incs]
    inc = _detail(world, incs[0])
    child = json.loads((job.dir / "worker_block_1.json").read_text())
    assert inc["culprit_ranks"] == [1], inc
    assert f"pid {child['worker_pid']}" in inc["summary"] and "a pipe held by its child" in inc["summary"], inc["summary"]
    LATENCY["host_stall (select on a child's pipe)"] = round(inc["opened_at"] - child["t"], 1)


def test_a_server_waiting_on_its_listening_socket_is_idle_with_no_incident(world):
    incs = _incidents_of(world, "server_accepting")
    assert not incs, [_detail(world, i) for i in incs]
    # once it serves (its truth says so), each rank reads idle, and rank 0 for what it waits on
    job = world["jobs"]["server_accepting"]
    ready = min(x["t"] for x in _truth(job) if x["state"] == "idle")
    for rank, pid in _rank_pids(job).items():
        seen = [(st, why) for t, st, why in world["states"].get(pid, []) if t >= ready + 8]
        assert seen and all(st == "idle" for st, _ in seen), (rank, seen[:5])
        if rank == 0:
            assert any("listening TCP socket" in why for _, why in seen), seen[:3]


def test_no_false_incident_and_everything_resolves_once_the_jobs_are_gone(world):
    # hangd watches every process of the node: a job of another run on the same machine (a second copy
    # of this suite hangs its own deadlock job on purpose) gets its own incident, rightly, and only our
    # jobs have a known truth. An incident that mixes our pids with others' still fails below.
    ours = {p for j in world["jobs"].values() for p in j.pids}
    hang = [i for i in world["incidents"].values()
            if i["kind"] in ("host_stall", "nccl_stall", "io_stall") and set(i["pids"]) & ours]
    assert {tuple(sorted(i["pids"])) for i in hang} <= {tuple(sorted(world["jobs"][n].pids))
                                                       for n in ("deadlock", "sigstop", "ddp_loader_blocked", "select_on_child")}
    still_open = [i for i in world["after"] if i["status"] == "open" and set(i["pids"]) & ours]
    assert not still_open, still_open
