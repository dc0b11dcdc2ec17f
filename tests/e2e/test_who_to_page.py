"""End to end: whom to page. Two real 2-rank gloo jobs deadlock under one real `hangd serve`: one
launched with Slurm's variables set, one whose ranks sit in a kubelet-shaped cgroup (only the
cgroup line is made up: a launcher writes it where `cgroup_path` points before each rank runs; the
kubelet's log folders are a temp tree that `pod_log_dir` points at). Each job's owner, Slurm job and
pod must show on /jobs, on its incident (summary, evidence, the list) and as labels of its series
on /metrics."""

from __future__ import annotations

import os
import pwd
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..conftest import ROOT, WORKLOADS, torch_available
from ..served import serve

pytestmark = [pytest.mark.skipif(not torch_available(), reason="torch is a test dependency"), pytest.mark.torchrun]
HERE = Path(__file__).resolve().parent
POD_UID = "6b9f1f8e-3c5a-4b8e-9d1a-2f7e8c9a0b1c"
CONTAINER_ID = "4f3e" * 16
CGROUP = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice/"
          f"cri-containerd-{CONTAINER_ID}.scope")
DEADLOCK = (str(WORKLOADS / "gloo_job.py"), "deadlock", "--steps", "20", "--step-sleep", "0.05", "--culprit", "1")
OWNER = pwd.getpwuid(os.getuid()).pw_name


def _start(argv: list[str], env: dict[str, str], ranks: int = 2) -> tuple[subprocess.Popen, list[int]]:
    launcher = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    pids: list[int] = []
    t_end = time.time() + 30
    while len(pids) < ranks and time.time() < t_end:
        pids = [c.pid for c in psutil.Process(launcher.pid).children()]
        time.sleep(0.2)
    return launcher, pids


def _stop(launcher: subprocess.Popen, pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launcher.kill()
    launcher.wait()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("who")
    cg = tmp / "cgroup"
    cg.mkdir()
    pods = tmp / "log" / "pods"
    (pods / f"ml_train-llama-0_{POD_UID}" / "trainer").mkdir(parents=True)
    (tmp / "log" / "containers").mkdir()
    os.symlink(pods / f"ml_train-llama-0_{POD_UID}" / "trainer" / "0.log",
               tmp / "log" / "containers" / f"train-llama-0_ml_trainer-{CONTAINER_ID}.log")
    s = serve(tmp, "--interval", "0.5", env={"HANGD_JOB_ENV": "MASTER_ADDR", "HANGD_CGROUP_PATH": f"{cg}/{{pid}}",
                                             "HANGD_POD_LOG_DIR": str(pods)})
    slurm_id = str(random.randint(100000, 999999))  # another copy of this suite may run beside it
    slurm_env = dict(os.environ, SLURM_JOB_ID=slurm_id, SLURM_JOB_USER=OWNER, SLURM_JOB_NAME="train-llama",
                     SLURM_JOB_ACCOUNT="ml", SLURM_JOB_PARTITION="gpu", SLURM_JOB_PASSWORD="hunter2-not-shown")
    running = []
    try:
        (tmp / "slurm").mkdir()
        (tmp / "kube").mkdir()
        slurm = _start([sys.executable, str(WORKLOADS / "launch.py"), "2", str(tmp / "slurm"), *DEADLOCK], slurm_env)
        running.append(slurm)
        kube = _start([sys.executable, str(HERE / "kube_launch.py"), "2", str(tmp / "kube"), str(cg), CGROUP, *DEADLOCK],
                      dict(os.environ))
        running.append(kube)
        w = {"hangd": s, "slurm_id": slurm_id, "pids": {"slurm": slurm[1], "kube": kube[1]}}

        def opened(_s) -> bool:
            incs = s.get("/incidents").json()["incidents"]
            return all(any(set(i["pids"]) & set(pids) and i["kind"] in ("host_stall", "nccl_stall") for i in incs)
                       for pids in w["pids"].values())

        s.wait_for(opened, 150, "a hang incident of each job")
        w["jobs"] = s.get("/jobs").json()
        w["incidents"] = s.get("/incidents").json()["incidents"]
        w["metrics"] = {f.name: f for f in text_string_to_metric_families(s.get("/metrics").text)}
        yield w
    finally:
        for launcher, pids in running:
            _stop(launcher, pids)
        s.stop()


def _job(w: dict, name: str) -> dict:
    pids = set(w["pids"][name])
    return next(j for j in w["jobs"] if set(j["ranks"].values()) == pids)


def _incident(w: dict, name: str) -> dict:
    pids = set(w["pids"][name])
    inc = next(i for i in w["incidents"] if set(i["pids"]) & pids and i["kind"] in ("host_stall", "nccl_stall"))
    return w["hangd"].get(f"/incidents/{inc['id']}").json() | {"listed": inc}


def _series(w: dict, family: str, **match: str) -> list[dict[str, str]]:
    return [s.labels for s in w["metrics"][family].samples if all(s.labels.get(k) == v for k, v in match.items())]


def test_a_slurm_job_shows_its_owner_and_slurm_job_on_jobs_the_incident_and_metrics(world):
    sid = world["slurm_id"]
    job = _job(world, "slurm")
    assert job["job"] == f"slurm:{sid}"
    assert job["who"]["user"] == OWNER and job["who"]["uid"] == os.getuid()
    assert job["who"]["slurm"] == {"job_id": sid, "user": OWNER, "name": "train-llama", "account": "ml",
                                   "partition": "gpu", "array_job_id": None, "array_task_id": None, "step_id": None}
    assert job["who"]["pod"] is None  # its cgroup is not a kubelet's
    said = f"Owner {OWNER}, Slurm job {sid} (train-llama, account ml, partition gpu)."
    inc = _incident(world, "slurm")
    assert inc["summary"].endswith(said) and inc["listed"]["summary"].endswith(said), inc["summary"]
    assert inc["evidence"]["who"]["slurm"]["job_id"] == sid and inc["listed"]["who"]["user"] == OWNER
    assert "hunter2" not in str(inc) + str(job)
    for fam in ("hangd_job_state", "hangd_job_ranks"):
        assert _series(world, fam, hangd_job=job["job"], user=OWNER, slurm_job=sid), fam
    assert _series(world, "hangd_incident_opened_timestamp_seconds", incident=str(inc["id"]), user=OWNER, slurm_job=sid)
    assert _series(world, "hangd_job_owner_info", hangd_job=job["job"], slurm_job_name="train-llama",
                   slurm_account="ml", slurm_partition="gpu")


def test_a_job_in_a_kubelet_cgroup_shows_its_pod_on_jobs_the_incident_and_metrics(world):
    job = _job(world, "kube")
    pod = job["who"]["pod"]
    assert (pod["uid"], pod["name"], pod["namespace"], pod["container"], pod["container_id"], pod["qos"]) == \
        (POD_UID, "train-llama-0", "ml", "trainer", CONTAINER_ID, "burstable")
    assert pod["name_from"].endswith(f"ml_train-llama-0_{POD_UID}") and job["who"]["user"] == OWNER
    assert job["who"]["slurm"] is None
    inc = _incident(world, "kube")
    said = f"Owner {OWNER}, pod ml/train-llama-0 (container trainer)."
    assert inc["summary"].endswith(said) and inc["listed"]["summary"].endswith(said), inc["summary"]
    assert inc["evidence"]["who"]["pod"]["name"] == "train-llama-0"
    for fam in ("hangd_job_state", "hangd_job_ranks"):
        assert _series(world, fam, hangd_job=job["job"], user=OWNER, k8s_namespace="ml", k8s_pod="train-llama-0"), fam
    assert _series(world, "hangd_incident_opened_timestamp_seconds", incident=str(inc["id"]), k8s_namespace="ml",
                   k8s_pod="train-llama-0")
    assert _series(world, "hangd_job_owner_info", hangd_job=job["job"], k8s_container="trainer", k8s_pod_uid=POD_UID)
