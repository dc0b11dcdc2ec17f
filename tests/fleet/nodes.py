"""Two "nodes" on one machine for the tests of jobs that span nodes: each a PID namespace of its own
(``unshare --pid --fork --mount-proc``) holding a real ``hangd serve`` on one shared database, and
real ``torchrun --nnodes 2`` launches whose ranks meet at one rendezvous.

Where creating a PID namespace needs a privilege the runner lacks (a non-root CI), the nodes are
made with ``unshare --user --map-root-user --pid --fork --mount-proc`` instead (an unprivileged
user namespace), and processes join it with ``nsenter --user --preserve-credentials``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest

from hangd.store.db import upgrade

from ..conftest import ROOT, WORKLOADS, hangd_cmd
from ..server.conftest import Served, free_port

# thresholds shortened as the other end-to-end tests do, so a 2-core runner sees a hang in seconds
ENV = {"HANGD_HANG_HOST_S": "6", "HANGD_HANG_GPU_S": "6", "HANGD_HEARTBEAT_S": "1", "HANGD_NODE_STALE_S": "6"}


def unshare_prefix() -> list[str]:
    for extra in ([], ["--user", "--map-root-user"]):
        if subprocess.run(["unshare", *extra, "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode == 0:
            return extra
    pytest.fail("unshare cannot make a PID namespace here, even in a user namespace (kernel.unprivileged_userns_clone?)")


class NodeNs:
    """A PID namespace whose init only sleeps, so that killing the hangd in it leaves the job's ranks."""

    def __init__(self, name: str, tmp: Path, user: list[str]) -> None:
        self.name = name
        self.tmp = tmp
        self.user = user
        self.init = subprocess.Popen(["unshare", *user, "--pid", "--fork", "--mount-proc", "sleep", "infinity"],
                                     start_new_session=True)
        t_end = time.time() + 10
        self.pid1 = 0
        while not self.pid1 and time.time() < t_end:
            kids = psutil.Process(self.init.pid).children()
            self.pid1 = kids[0].pid if kids else 0
            time.sleep(0.05)
        assert self.pid1, "the namespace's init did not start"
        self.procs: list[subprocess.Popen] = []

    def run(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        join = ["nsenter", "-t", str(self.pid1), "--pid", "--mount"] + (["--user", "--preserve-credentials"] if self.user else [])
        # nsenter --mount takes the target's working directory: this checkout's hangd comes first by path
        path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        p = subprocess.Popen([*join, f"--wd={ROOT}", *argv], cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             env=dict(os.environ, PYTHONPATH=path, **(env or {})), start_new_session=True)
        self.procs.append(p)
        return p

    def serve(self, db: str, wait: bool = True) -> tuple[Served, subprocess.Popen]:
        """Start this node's hangd; with ``wait``, return once it answers."""
        port = free_port()
        log = self.tmp / f"hangd-{self.name}.log"
        p = self.run([*hangd_cmd(), "serve", "--listen", f"127.0.0.1:{port}", "--db", db, "--node-name", self.name,
                      "--interval", "0.5"], log, env=ENV)
        s = Served(p, f"http://127.0.0.1:{port}", db, log)
        if wait:
            self.wait_served(s)
        return s, p

    def wait_served(self, s: Served) -> None:
        s.wait_for(lambda s: s.get("/healthz").status_code == 200, 90, f"{self.name}'s hangd")

    def kill_tree(self, p: subprocess.Popen) -> None:
        """nsenter forks the command into the namespace: kill what it started (and what that
        started), then nsenter; ranks left under the namespace's init go too."""
        keep = {p2.pid for p2 in self.procs if p2 is not p and p2.poll() is None}
        for _ in range(3):
            try:
                kids = psutil.Process(p.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                kids = []
            for c in kids:
                c.kill()
            time.sleep(0.2)
        p.kill()
        p.wait(10)
        self.procs.remove(p)
        mine = set(keep)
        for k in keep:
            try:
                mine |= {c.pid for c in psutil.Process(k).children(recursive=True)}
            except psutil.NoSuchProcess:
                pass
        try:
            orphans = [c for c in psutil.Process(self.pid1).children(recursive=True) if c.pid not in mine]
        except psutil.NoSuchProcess:
            orphans = []
        for c in orphans:
            c.kill()
        # the namespace's init only sleeps and never reaps: a killed rank stays a zombie until the
        # namespace closes, so wait for the live ones to die, not for the zombies to go
        t_end = time.time() + 5
        while time.time() < t_end and any(_alive(c) for c in orphans):
            time.sleep(0.05)

    def close(self) -> None:
        """Kill the namespace's init (not unshare, its parent): the kernel then ends everything in
        the namespace, hangd and ranks alike; unshare and the nsenters exit with their children."""
        try:
            os.kill(self.pid1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.init.wait(10)
        for p in self.procs:
            p.wait(10)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def torchrun(node: NodeNs, node_rank: int, port: int, tag: str, *args: str, nproc: int = 2) -> subprocess.Popen:
    """One node's part of a real ``torchrun --nnodes 2`` of tests/workloads/torchrun_job.py."""
    return node.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank),
                     "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(port),
                     str(WORKLOADS / "torchrun_job.py"), *args], node.tmp / f"job-{tag}-{node.name}.log")


def wait_for(pred, timeout: float, what: str, logs: list[Path]) -> object:
    t_end = time.time() + timeout
    last = None
    while time.time() < t_end:
        try:
            last = pred()
            if last:
                return last
        except (httpx.HTTPError, KeyError, IndexError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last={last!r}\n" + "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}"
                                                                                   for p in logs if p.exists()))


@contextmanager
def two_nodes(tmp: Path, db: str) -> Iterator[tuple[dict[str, NodeNs], dict[str, tuple[Served, subprocess.Popen]]]]:
    """node-a and node-b, each a PID namespace running a real ``hangd serve`` on the database ``db``;
    at the end every process of both is gone (checked)."""
    user = unshare_prefix()
    nodes = {n: NodeNs(n, tmp, user) for n in ("node-a", "node-b")}
    try:
        # migrated first, then both start at once: neither waits for the other's imports, and two
        # first starts do not both create the tables
        upgrade(db)
        served = {n: ns.serve(db, wait=False) for n, ns in nodes.items()}
        for n, (s, _) in served.items():
            nodes[n].wait_served(s)
        yield nodes, served
    finally:
        for ns in nodes.values():
            ns.close()
        left = [p for ns in nodes.values() for p in (ns.pid1, *(x.pid for x in ns.procs)) if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert not left, f"processes of the nodes left running: {left}"
