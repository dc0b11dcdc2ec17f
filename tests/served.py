"""A real `hangd serve` started for a test: ``serve`` starts one and waits for /healthz; the
``served`` fixture (tests/conftest.py) stops what a test appended to it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from .conftest import ROOT, hangd_cmd
from .realpg import free_port


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
