"""Two "nodes" on one machine for the tests of jobs that span nodes: each a PID namespace of its own
(``unshare --pid --fork --mount-proc``) holding a real ``hangd serve`` on one shared database, and
real ``torchrun --nnodes 2`` launches whose ranks meet at one rendezvous. The GPU run of the same checks
(scripts/fleet_gpu.py) makes its nodes with these too.

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

from ..conftest import ROOT, WORKLOADS, hangd_cmd
from ..realpg import free_port
from ..served import Served


class NoNamespaces(RuntimeError):
    """unshare cannot make a PID namespace here."""


# thresholds shortened as the other end-to-end tests do, so a 2-core runner sees a hang in seconds
ENV = {"HANGD_HANG_HOST_S": "6", "HANGD_HANG_GPU_S": "6", "HANGD_HEARTBEAT_S": "1", "HANGD_NODE_STALE_S": "6"}


def unshare_prefix() -> list[str]:
    for extra in ([], ["--user", "--map-root-user"]):
        if subprocess.run(["unshare", *extra, "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode == 0:
            return extra
    raise NoNamespaces("unshare cannot make a PID namespace here, even in a user namespace "
                       "(kernel.unprivileged_userns_clone?)")


class NodeNs:
    """A PID namespace whose init only sleeps, so that killing the hangd in it leaves the job's ranks."""

    def __init__(self, name: str, tmp: Path, user: list[str], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.tmp = tmp
        self.user = user
        self.env = env or {}  # what every process of this node gets (CUDA_VISIBLE_DEVICES: its GPUs)
        self.init = subprocess.Popen(["unshare", *user, "--pid", "--fork", "--mount-proc", "sleep", "infinity"],
                                     start_new_session=True)
        t_end = time.time() + 10
        self.pid1 = 0
        while not self.pid1 and time.time() < t_end:
            kids = psutil.Process(self.init.pid).children()
            self.pid1 = kids[0].pid if kids else 0
            time.sleep(0.05)
        if not self.pid1:
            raise NoNamespaces("the namespace's init did not start")
        self.procs: list[subprocess.Popen] = []

    def run(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        join = ["nsenter", "-t", str(self.pid1), "--pid", "--mount"] + (["--user", "--preserve-credentials"] if self.user else [])
        # nsenter --mount takes the target's working directory: this checkout's hangd comes first by path
        path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        p = subprocess.Popen([*join, f"--wd={ROOT}", *argv], cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             env={**os.environ, "PYTHONPATH": path, **self.env, **(env or {})}, start_new_session=True)
        self.procs.append(p)
        return p

    def serve(self, db: str, wait: bool = True) -> tuple[Served, subprocess.Popen]:
        """Start this node's hangd; with ``wait``, return once it answers."""
        port = free_port()
        p, log = self.start(db, port, ENV, "--interval", "0.5")
        s = Served(p, f"http://127.0.0.1:{port}", db, log)
        if wait:
            self.wait_served(s)
        return s, p

    def start(self, db: str, port: int, env: dict[str, str], *args: str) -> tuple[subprocess.Popen, Path]:
        """``hangd serve`` on this node, writing to the shared ``db`` under this node's name."""
        log = self.tmp / f"hangd-{self.name}.log"
        p = self.run([*hangd_cmd(), "serve", "--listen", f"127.0.0.1:{port}", "--db", db, "--node-name", self.name,
                      *args], log, env=env)
        return p, log

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
                try:
                    c.kill()
                except psutil.NoSuchProcess:
                    pass  # it exited between the listing and the kill
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
            try:
                c.kill()
            except psutil.NoSuchProcess:
                pass
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


    def left_running(self) -> list[int]:
        return [p for p in (self.pid1, *(x.pid for x in self.procs)) if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def torchrun(node: NodeNs, node_rank: int, port: int, tag: str, *args: str, nproc: int = 2,
             env: dict[str, str] | None = None) -> subprocess.Popen:
    """One node's part of a real ``torchrun --nnodes 2`` of tests/workloads/torchrun_job.py."""
    return node.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank),
                     "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(port),
                     str(WORKLOADS / "torchrun_job.py"), *args], node.tmp / f"job-{tag}-{node.name}.log", env=env)


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
    try:
        user = unshare_prefix()
    except NoNamespaces as e:
        pytest.fail(str(e))
    nodes = {n: NodeNs(n, tmp, user) for n in ("node-a", "node-b")}
    try:
        # both start at once, as a rollout starts them: on a fresh database the two first starts
        # migrate it together (one waits for the other's migration)
        served = {n: ns.serve(db, wait=False) for n, ns in nodes.items()}
        for n, (s, _) in served.items():
            nodes[n].wait_served(s)
        yield nodes, served
    finally:
        for ns in nodes.values():
            ns.close()
        left = [p for ns in nodes.values() for p in ns.left_running()]
        assert not left, f"processes of the nodes left running: {left}"
