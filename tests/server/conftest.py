from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from .. import realpg
from ..conftest import ROOT, hangd_cmd
from ..realpg import free_port


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
          listen_host: str = "127.0.0.1", wait: bool = True, port: int | None = None) -> Served:
    port = port or free_port()
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
    try:
        pg = realpg.start()
    except realpg.NoPostgres as e:
        pytest.fail(f"{e} (`make test` installs it)")
    try:
        yield pg.url
    finally:
        pg.stop()


@pytest.fixture
def fresh_pg(postgres_url) -> Iterator[str]:
    """A database of its own on the session's PostgreSQL: no other test's rows (incident ids, nodes)."""
    import uuid

    from sqlalchemy import create_engine, text

    name = f"t_{uuid.uuid4().hex[:10]}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield postgres_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as c:
            c.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()

