"""Real 2-rank torch jobs over gloo under a live hangd (`hangd watch`): a healthy job, a deadlock
and a job whose launcher is SIGKILLed, all at once on this CPU machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from ..conftest import ROOT, WORKLOADS, hangd_cmd, torch_available

pytestmark = pytest.mark.skipif(not torch_available(), reason="torch is a test dependency")


def start_job(tmp: Path, name: str, *args: str) -> subprocess.Popen:
    d = tmp / name
    d.mkdir()
    return subprocess.Popen([sys.executable, str(WORKLOADS / "launch.py"), "2", str(d), str(WORKLOADS / "gloo_job.py"),
                             *args], cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def ranks_of(launcher: subprocess.Popen) -> list[int]:
    return [c.pid for c in psutil.Process(launcher.pid).children()]


def kill_tree(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    events: list[dict] = []
    watch = subprocess.Popen([*hangd_cmd(), "watch", "--json", "--interval", "0.5"], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=dict(os.environ, HANGD_JOB_ENV="MASTER_ADDR"))

    def read() -> None:
        assert watch.stdout is not None
        for line in watch.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            ev["seen"] = time.time()
            events.append(ev)

    threading.Thread(target=read, daemon=True).start()
    healthy = start_job(tmp, "healthy", "train", "--steps", "0", "--step-sleep", "0.05")
    deadlock = start_job(tmp, "deadlock", "deadlock", "--steps", "40", "--step-sleep", "0.05")
    orphan = start_job(tmp, "orphan", "train", "--steps", "0", "--step-sleep", "0.05")
    launchers = {"healthy": healthy, "deadlock": deadlock, "orphan": orphan}
    time.sleep(3)
    ranks = {k: ranks_of(p) for k, p in launchers.items()}
    all_ranks = [p for v in ranks.values() for p in v]
    try:
        time.sleep(20)
        orphan_killed_at = time.time()
        os.kill(orphan.pid, signal.SIGKILL)  # the launcher dies; its ranks live on
        orphan.wait()
        time.sleep(22)
        yield {"events": list(events), "ranks": ranks, "orphan_killed_at": orphan_killed_at, "tmp": tmp}
    finally:
        kill_tree(all_ranks)
        for p in launchers.values():
            kill_tree([p.pid])
            p.wait()
        watch.terminate()
        watch.wait(10)


def states(ev: list[dict], pids: list[int]) -> list[dict]:
    return [e for e in ev if e["type"] == "state" and e["pid"] in pids]


def incidents(ev: list[dict], pids: list[int]) -> list[dict]:
    return [e for e in ev if e["type"] == "incident" and set(e["pids"]) & set(pids)]


def test_healthy_training_makes_no_incident(live):
    pids = live["ranks"]["healthy"]
    assert not incidents(live["events"], pids)
    seen = {e["state"] for e in states(live["events"], pids)}
    assert "busy" in seen and seen <= {"starting", "busy", "waiting_peer", "straggler"}, seen


def test_deadlock_opens_host_stall_naming_the_culprit(live):
    pids = live["ranks"]["deadlock"]
    incs = incidents(live["events"], pids)
    assert incs, states(live["events"], pids)
    first = incs[0]
    assert first["kind"] == "host_stall"
    culprit_pid = pids[1]  # the launcher starts rank 0 first, then rank 1 (--culprit 1)
    assert first["culprit_pids"] == [culprit_pid] and first["culprit_ranks"] == [1]
    assert set(first["evidence"]["stacks"]) == {"0", "1"}
    assert {e["state"] for e in states(live["events"], pids)} >= {"hung"}
    # the culprit's log says where it waits; the incident quotes it
    log1 = (live["tmp"] / "deadlock" / "log_1.txt").read_text()
    assert "culprit" in log1 and "culprit" in " ".join(first["evidence"]["logs"].get("1", []))


def test_killed_launcher_leaves_orphaned_ranks(live):
    pids = live["ranks"]["orphan"]
    after = [e for e in states(live["events"], pids) if e["seen"] >= live["orphan_killed_at"]]
    orphaned = {e["pid"] for e in after if e["state"] == "orphaned"}
    assert orphaned == set(pids), after
    lat = min(e["seen"] for e in after if e["state"] == "orphaned") - live["orphan_killed_at"]
    assert lat < 10, lat
