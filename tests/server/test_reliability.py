"""hangd keeps going: SIGKILL and restart, a locked database, a full disk."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from ..conftest import ROOT, TRACES, WORKLOADS
from ..served import serve

# a real server degraded and waited for until it catches up
pytestmark = pytest.mark.slow


def _job(tmp: Path) -> subprocess.Popen:
    d = tmp / "job"
    d.mkdir()
    return subprocess.Popen([sys.executable, str(WORKLOADS / "launch.py"), "2", str(d), str(WORKLOADS / "gloo_job.py"),
                             "deadlock", "--steps", "30", "--step-sleep", "0.05"], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _kill_job(job: subprocess.Popen) -> None:
    for c in psutil.Process(job.pid).children(recursive=True):
        c.kill()
    job.kill()
    job.wait()


@pytest.mark.torchrun
def test_sigkill_and_restart_loses_nothing_and_duplicates_nothing(tmp_path, served):
    job = _job(tmp_path)
    try:
        s = serve(tmp_path, "--interval", "0.5", env={"HANGD_JOB_ENV": "MASTER_ADDR"})
        served.append(s)
        first = s.wait_for(lambda s: s.get("/incidents", params={"status": "open"}).json()["incidents"], 90,
                           "the host_stall of the deadlocked job")
        assert first[0]["kind"] == "host_stall"
        s.stop(signal.SIGKILL)  # no chance to flush anything
        s2 = serve(tmp_path, "--interval", "0.5", db=s.db, env={"HANGD_JOB_ENV": "MASTER_ADDR"})
        served.append(s2)
        # the same episode goes on under the same id once the analysis sees it again
        s2.wait_for(lambda s: any(e.get("note") == "still going on after hangd restarted"
                                  for e in s.get(f"/incidents/{first[0]['id']}").json()["timeline"]), 90,
                    "the restarted hangd to adopt the open incident")
        allinc = s2.get("/incidents").json()
        assert allinc["total"] == 1, allinc
        assert allinc["incidents"][0]["id"] == first[0]["id"] and allinc["incidents"][0]["status"] == "open"
    finally:
        _kill_job(job)


def test_locked_database_keeps_serving_and_catches_up(tmp_path, served):
    db = tmp_path / "locked.db"
    s = serve(tmp_path, "--replay", str(TRACES / "cpu_hang"), "--speed", "4", db=f"sqlite:///{db}")
    served.append(s)
    s.wait_for(lambda s: s.get("/processes").json(), 30, "processes")
    lock = sqlite3.connect(db, timeout=1)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        s.wait_for(lambda s: "store degraded" in s.get("/readyz").json()["detail"], 40, "degraded readiness")
        assert s.get("/processes").status_code == 200  # still diagnosing from memory
        assert 'hangd_collector_success{collector="store"} 0.0' in s.get("/metrics").text
    finally:
        lock.rollback()
        lock.close()
    s.wait_for(lambda s: s.get("/incidents").json()["total"] >= 1, 40, "the incident written after the lock")
    assert s.get("/incidents").json()["incidents"][0]["kind"] == "host_stall"


def test_full_disk_keeps_serving_and_catches_up(tmp_path, served):
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], check=True)
    try:
        db = mnt / "hangd.db"
        from hangd.store.db import upgrade
        upgrade(f"sqlite:///{db}")
        filler = mnt / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:  # fill the disk to the last byte
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        s = serve(tmp_path, "--replay", str(TRACES / "nccl_stall"), "--speed", "10", db=f"sqlite:///{db}")
        served.append(s)
        s.wait_for(lambda s: s.get("/processes").status_code == 200 and
                   "store degraded" in s.get("/readyz").json()["detail"], 40, "degraded store")
        assert s.get("/jobs").json()
        filler.unlink()
        s.wait_for(lambda s: s.get("/incidents").json()["total"] >= 1, 40, "catching up after space came back")
        assert s.get("/incidents").json()["incidents"][0]["kind"] == "nccl_stall"
        s.stop()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
