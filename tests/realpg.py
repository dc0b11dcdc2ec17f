"""A real PostgreSQL started for a test run or a live script, on loopback, in a private folder.

The server is Debian's package (``/usr/lib/postgresql/N/bin``) or, where it is not installed (a GPU
host's image), the same files unpacked under ``root`` (``root/usr/lib/postgresql/N/bin``, its own
shared libraries in ``root/lib``): PostgreSQL finds its share folder relative to its binaries."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NoPostgres(RuntimeError):
    """No PostgreSQL server binaries where they were looked for."""


@dataclass
class Postgres:
    url: str
    folder: Path
    bindir: Path
    run_as: list[str]
    env: dict[str, str]

    def stop(self) -> None:
        subprocess.run([*self.run_as, str(self.bindir / "pg_ctl"), "-D", str(self.folder / "data"), "-m", "immediate",
                        "stop"], capture_output=True, env=self.env)
        shutil.rmtree(self.folder, ignore_errors=True)


def _run_as_user() -> list[str]:
    """postgres refuses to run as root: as root, run it as the ``postgres`` user, made if missing."""
    if os.geteuid() != 0:
        return []
    if subprocess.run(["id", "-u", "postgres"], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--system", "--no-create-home", "postgres"], check=True, capture_output=True)
    return ["runuser", "-u", "postgres", "--"]


def start(root: str | None = None) -> Postgres:
    """Start a fresh cluster (trust auth, user ``hangd``) and return its SQLAlchemy URL."""
    base = Path(root) if root else Path("/")
    bins = sorted(glob.glob(str(base / "usr/lib/postgresql/*/bin/initdb")))
    if not bins:
        raise NoPostgres(f"no PostgreSQL under {base}usr/lib/postgresql: install Debian's postgresql")
    bindir = Path(bins[-1]).parent
    env = dict(os.environ, TZ="UTC")
    if root:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(base / "lib"), os.environ.get("LD_LIBRARY_PATH")]))
    # not under pytest's tmp dir: that is private to root, and postgres runs as its own user
    d = Path(tempfile.mkdtemp(prefix="hangd-pg-"))
    run_as = _run_as_user()
    if run_as:
        shutil.chown(d, "postgres")
    port = free_port()
    subprocess.run([*run_as, str(bindir / "initdb"), "-D", str(d / "data"), "-A", "trust", "-U", "hangd"], check=True,
                   capture_output=True, env=env)
    subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(d / "data"), "-l", str(d / "pg.log"), "-w", "-o",
                    f"-p {port} -k {d} -h 127.0.0.1 -c jit=off", "start"], check=True, capture_output=True, env=env)
    return Postgres(f"postgresql+psycopg://hangd@127.0.0.1:{port}/postgres", d, bindir, run_as, env)
