from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from ..conftest import ROOT, hangd_cmd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    proc: subprocess.Popen
    url: str
    db: str
    log: Path

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10, **kw)

    def post(self, path: str, **kw) -> httpx.Response:
        return httpx.post(self.url + path, timeout=10, **kw)

    def wait_for(self, pred, timeout: float = 60, what: str = "") -> object:
        t_end = time.time() + timeout
        last = None
        while time.time() < t_end:
            try:
                last = pred(self)
                if last:
                    return last
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise AssertionError(f"hangd serve exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}; last={last!r}; log: {self.log.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def serve(tmp_path: Path, *args: str, db: str | None = None, env: dict[str, str] | None = None,
          listen_host: str = "127.0.0.1", wait: bool = True) -> Served:
    port = free_port()
    db = db or f"sqlite:///{tmp_path / 'hangd.db'}"
    log = tmp_path / f"serve-{port}.log"
    proc = subprocess.Popen([*hangd_cmd(), "serve", "--listen", f"{listen_host}:{port}", "--db", db, *args], cwd=ROOT,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})))
    s = Served(proc, f"http://127.0.0.1:{port}", db, log)
    if wait:
        s.wait_for(lambda s: s.get("/healthz").status_code == 200, 60, "healthz")
    return s


@pytest.fixture
def served(tmp_path) -> Iterator[list[Served]]:
    running: list[Served] = []
    yield running
    for s in running:
        s.stop(signal.SIGKILL)


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory) -> Iterator[str]:
    """A real PostgreSQL (Debian's package) started for the tests, on loopback."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not bins:
        pytest.fail("PostgreSQL is not installed: `make test` installs Debian's postgresql")
    bindir = Path(bins[-1]).parent
    # not under pytest's tmp dir: that is private to root, and postgres runs as its own user
    d = Path(tempfile.mkdtemp(prefix="hangd-pg-"))
    data = d / "data"
    port = free_port()
    run_as: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root
        shutil.chown(d, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*run_as, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "hangd"], check=True,
                   capture_output=True)
    subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(d / "pg.log"), "-w", "-o",
                    f"-p {port} -k {d} -h 127.0.0.1", "start"], check=True, capture_output=True)
    try:
        url = f"postgresql+psycopg://hangd@127.0.0.1:{port}/postgres"
        yield url
    finally:
        subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)
