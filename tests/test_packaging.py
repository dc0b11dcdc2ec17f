"""The installed package, not the source tree: build the wheel, install it into a fresh venv
(dependencies borrowed from the test environment, nothing downloaded), and migrate a database
both ways with that install's `hangd db`. Catches files the wheel leaves out (the migrations)."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.slow  # builds the wheel and installs it into a fresh venv


def _tables(db: Path) -> set[str]:
    with sqlite3.connect(db) as c:
        return {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_installed_wheel_ships_the_migrations_and_runs_them(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    shutil.copytree(ROOT / "hangd", src / "hangd", ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(src)], check=True, capture_output=True, timeout=180)
    (wheel,) = wheels.glob("hangd-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hangd/store/migrations/env.py" in names and "hangd/store/migrations/script.py.mako" in names, names
    assert all(any(n.startswith(f"hangd/store/migrations/versions/{v}") for n in names) for v in ("0001", "0002", "0003", "0004", "0005")), names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, timeout=180)
    # the dependencies come from the test environment, after the venv's own packages (so the
    # wheel's hangd wins over the editable one there, whose finder this path does not load)
    (site / "zz-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    def hangd(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(py), "-m", "hangd", *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})

    where = subprocess.run([str(py), "-c", "import hangd; print(hangd.__file__)"], cwd=tmp_path, check=True,
                           capture_output=True, text=True).stdout.strip()
    assert where.startswith(str(site)), where

    db = tmp_path / "installed.db"
    url = f"sqlite:///{db}"
    out = hangd("db", "upgrade", "--db", url)
    assert out.returncode == 0, out.stderr
    assert {"alembic_version", "incidents", "nodes"} <= _tables(db)
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT version_num FROM alembic_version").fetchall() == [("0005",)]
    out = hangd("db", "downgrade", "base", "--db", url)
    assert out.returncode == 0, out.stderr
    assert _tables(db) <= {"alembic_version"}
    out = hangd("db", "upgrade", "--db", url)
    assert out.returncode == 0 and "incidents" in _tables(db), out.stderr
    bad = hangd("db", "upgrade", "nosuchrev", "--db", url)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
