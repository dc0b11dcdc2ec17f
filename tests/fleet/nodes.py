"""Nodes on one machine: each a PID namespace of its own (``unshare --pid --fork --mount-proc``), so
that the hangd in it sees only that namespace's processes, as a hangd on a node of its own would.
Used by the two-node tests and by the live script that runs them on GPUs (scripts/fleet_gpu.py).

Where creating a PID namespace needs a privilege the runner lacks (a non-root CI), the nodes are
made with ``unshare --user --map-root-user --pid --fork --mount-proc`` instead (an unprivileged
user namespace), and processes join it with ``nsenter --user --preserve-credentials``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent.parent


class NoNamespaces(RuntimeError):
    """unshare cannot make a PID namespace here."""


def unshare_prefix() -> list[str]:
    """The unshare options that make a PID namespace here: none as root, a user namespace otherwise."""
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
        penv = {**os.environ, "PYTHONPATH": path, **self.env, **(env or {})}
        p = subprocess.Popen([*join, f"--wd={ROOT}", *argv], cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             env=penv, start_new_session=True)
        self.procs.append(p)
        return p

    def serve(self, db: str, port: int, env: dict[str, str], *args: str) -> tuple[subprocess.Popen, Path]:
        """``hangd serve`` on this node, writing to the shared ``db`` under this node's name."""
        log = self.tmp / f"hangd-{self.name}.log"
        p = self.run([sys.executable, "-m", "hangd", "serve", "--listen", f"127.0.0.1:{port}", "--db", db,
                      "--node-name", self.name, *args], log, env=env)
        return p, log

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
        psutil.wait_procs(orphans, timeout=5)

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
