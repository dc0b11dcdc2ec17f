"""The installed package, not the source tree: build the wheel, install it into a fresh venv outside
the repo, and run that install's `hangd`. Catches files the wheel leaves out (the migrations, which
live in the top-level migrations/ folder and install as hangd.migrations) and a fleet install that
cannot reach its PostgreSQL (the driver is the extra hangd[postgres]).

Nothing is downloaded: pip installs the wheel with --no-index, and finds the dependencies already
installed, in a folder of links to the test environment's own packages (without hangd, torch and,
until the extra is installed, the PostgreSQL driver psycopg)."""

from __future__ import annotations

import email
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from . import realpg
from .conftest import ROOT

pytestmark = pytest.mark.slow  # builds the wheel and installs it into a fresh venv

DRIVER = ("psycopg", "psycopg_binary")  # what hangd[postgres] brings: psycopg[binary]
NOT_DEPS = ("hangd", "__editable__", "torch", "functorch")  # hangd itself, and no torch to run it


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the files the build reads (no build/ left in the repo)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    for d in ("hangd", "migrations"):
        shutil.copytree(ROOT / d, src / d, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    f"{src}/"], check=True, capture_output=True, timeout=180)
    (whl,) = out.glob("hangd-*.whl")
    return whl


@dataclass
class Venv:
    root: Path
    site: Path
    deps: Path

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    def pip_install(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pip", "--python", self.python, "install", "--no-index",
                               "--no-compile", "--disable-pip-version-check", "-q", *args],
                              capture_output=True, text=True, timeout=300,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})

    def env(self) -> dict[str, str]:
        # a blind node: the NVML library cannot load here or on a GPU host alike; serve still serves
        lib = self.root / "no-driver"
        lib.mkdir(exist_ok=True)
        (lib / "libnvidia-ml.so.1").write_text("not a shared library\n")
        return {"PATH": f"{self.root / 'bin'}:/usr/bin:/bin", "HOME": str(self.root), "LD_LIBRARY_PATH": str(lib),
                "HANGD_CONFIG": os.devnull}

    def hangd(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.root / "bin" / "hangd"), *args], cwd=self.root, capture_output=True,
                              text=True, timeout=timeout, env=self.env())

    def link_driver(self) -> None:
        """What `pip install 'hangd[postgres]'` needs present: the test environment's psycopg."""
        for p in _test_site().iterdir():
            if p.name.startswith(DRIVER):
                (self.deps / p.name).symlink_to(p)


def _test_site() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _venv(tmp: Path) -> Venv:
    root = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    site = Path(subprocess.run([str(root / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    deps = tmp / "deps"
    deps.mkdir()
    for p in _test_site().iterdir():
        if not p.name.startswith((*NOT_DEPS, *DRIVER)) and not p.name.endswith(".pth"):
            (deps / p.name).symlink_to(p)
    (site / "zz-deps.pth").write_text(f"{deps}\n")  # after the venv's own: the wheel's hangd wins
    return Venv(root, site, deps)


def test_installed_wheel_ships_the_migrations_and_runs_them(wheel, tmp_path):
    names = zipfile.ZipFile(wheel).namelist()
    assert "hangd/migrations/env.py" in names and "hangd/migrations/script.py.mako" in names, names
    assert "hangd/docs/operator-guide.md" in names, names  # served at /docs/runbook: the alerts' runbook_url
    versions = sorted(p.name for p in (ROOT / "migrations" / "versions").glob("*.py"))
    assert versions and all(f"hangd/migrations/versions/{v}" in names for v in versions), names
    # every module and data file of the source tree is in the wheel: a package or file left out fails here
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "hangd").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert sources <= set(names), sorted(sources - set(names))
    assert not any(n.startswith("migrations/") for n in names), "the migrations install inside hangd, not at the top"

    v = _venv(tmp_path)
    out = v.pip_install(str(wheel))
    assert out.returncode == 0, out.stderr
    where = subprocess.run([v.python, "-c", "import hangd; print(hangd.__file__)"], cwd=tmp_path, check=True,
                           capture_output=True, text=True, env=v.env()).stdout.strip()
    assert where.startswith(str(v.site)), where

    db = tmp_path / "installed.db"
    url = f"sqlite:///{db}"
    out = v.hangd("db", "upgrade", "--db", url)
    assert out.returncode == 0, out.stderr
    assert {"alembic_version", "incidents", "nodes", "hangd_schema"} <= _tables(db)
    head = max(v.split("_", 1)[0] for v in versions)
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT version_num FROM alembic_version").fetchall() == [(head,)]
        # which releases run on each revision, for an older hangd meeting this database
        assert dict(c.execute("SELECT revision, oldest_hangd FROM hangd_schema"))[head] == "0.1.0"
    out = v.hangd("db", "downgrade", "base", "--db", url)
    assert out.returncode == 0, out.stderr
    assert _tables(db) <= {"alembic_version"}
    out = v.hangd("db", "upgrade", "--db", url)
    assert out.returncode == 0 and "incidents" in _tables(db), out.stderr
    bad = v.hangd("db", "upgrade", "nosuchrev", "--db", url)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


@pytest.fixture(scope="module")
def pg() -> Iterator[realpg.Postgres]:
    try:
        p = realpg.start()
    except realpg.NoPostgres as e:
        pytest.fail(f"{e} (`make test` installs it)")
    try:
        yield p
    finally:
        p.stop()


@pytest.mark.postgres
def test_fleet_install_reaches_postgresql_with_the_postgres_extra_and_says_what_to_install_without(
        wheel, tmp_path, pg):
    """`pip install hangd` then a PostgreSQL URL: one line saying to install hangd[postgres], exit 3.
    `pip install 'hangd[postgres]'`: `hangd db upgrade` and `hangd serve --node-name` run on it."""
    meta = email.message_from_bytes(zipfile.ZipFile(wheel).read("hangd-0.1.0.dist-info/METADATA"))
    assert "postgres" in meta.get_all("Provides-Extra", [])
    needs = meta.get_all("Requires-Dist", [])
    assert any(re.match(r"psycopg\[binary\].*; extra == \"postgres\"", r) for r in needs), needs
    assert not any(r.startswith(("psycopg", "torch")) and "extra" not in r for r in needs), needs

    v = _venv(tmp_path)
    out = v.pip_install(str(wheel))  # plain `pip install hangd`: no driver
    assert out.returncode == 0, out.stderr
    url = pg.url
    hint = "the PostgreSQL driver is not installed (No module named 'psycopg'). HINT: pip install 'hangd[postgres]'"
    port = realpg.free_port()
    for args in (["db", "upgrade", "--db", url],
                 ["serve", "--listen", f"127.0.0.1:{port}", "--node-name", "wheel-node", "--db", url]):
        out = v.hangd(*args, timeout=60)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 3 and len(lines) == 1, (args, out.returncode, out.stderr)
        assert lines[0].startswith("hangd: db postgresql+psycopg://") and lines[0].endswith(hint), lines

    v.link_driver()
    out = v.pip_install(f"{wheel}[postgres]")  # the extra: resolved by pip, its driver present
    assert out.returncode == 0 and "does not provide the extra" not in out.stderr, out.stderr
    out = v.hangd("db", "upgrade", "--db", url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("upgrade postgresql+psycopg://"), out.stdout

    log = tmp_path / "serve.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([str(v.root / "bin" / "hangd"), "serve", "--listen", f"127.0.0.1:{port}",
                                 "--node-name", "wheel-node", "--db", url], cwd=v.root, stdout=f,
                                stderr=subprocess.STDOUT, env=v.env())
    try:
        base = f"http://127.0.0.1:{port}"
        t_end = time.time() + 60
        ready = None
        while time.time() < t_end and proc.poll() is None:
            try:
                ready = httpx.get(base + "/readyz", timeout=5).json()
                if ready["status"] != "not ready":
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert proc.poll() is None, log.read_text()[-3000:]
        assert ready is not None and "store degraded" not in ready["detail"], (ready, log.read_text()[-3000:])
        assert httpx.get(base + "/healthz", timeout=5).status_code == 200
        inc = httpx.get(base + "/incidents", timeout=5)
        assert inc.status_code == 200 and inc.json()["incidents"] == [], inc.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert "hangd serving on" in log.read_text() and "Traceback" not in log.read_text(), log.read_text()[-3000:]
    # it wrote into PostgreSQL under its node name
    import psycopg

    with psycopg.connect(pg.url.replace("postgresql+psycopg", "postgresql")) as c:
        assert ("wheel-node",) in c.execute("SELECT hostname FROM nodes").fetchall()


def _tables(db: Path) -> set[str]:
    with sqlite3.connect(db) as c:
        return {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
