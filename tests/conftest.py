from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from . import realpg

if TYPE_CHECKING:
    from .served import Served

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
TRACES = DATA / "traces" / "h200x2"
WORKLOADS = ROOT / "tests" / "workloads"
SHARED_TRACES = sorted(p.name for p in TRACES.iterdir() if (p / "meta.json").exists())
BENIGN = ("idle_server", "compute", "train", "load", "graph_capture")
PLANTED_SECRET = "hf_EXAMPLEsecret"


def hangd_cmd() -> list[str]:
    return [sys.executable, "-m", "hangd"]


def run_hangd(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the CLI; with ``check``, fail unless it exits 0 or 1 (1 is "an incident or finding", a result)."""
    out = subprocess.run([*hangd_cmd(), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if check and out.returncode not in (0, 1):
        raise AssertionError(f"hangd {' '.join(args)} exited {out.returncode}: {out.stderr[-2000:]}")
    return out


@pytest.fixture
def trace_copy(tmp_path: Path):
    def copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(TRACES / name, dst)
        return dst
    return copy


@pytest.fixture
def served(tmp_path) -> Iterator[list[Served]]:
    """Each ``hangd serve`` (tests/served.py) a test appends here is stopped after it."""
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


# Tiers (markers registered in pyproject.toml): a test that needs a real PostgreSQL says so by taking
# the ``postgres_url`` fixture and is marked here; torchrun and prometheus are marked where the
# test is written. `make test-fast` deselects all three and ``slow``.
FIXTURE_MARKS = {"postgres_url": "postgres"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, mark in FIXTURE_MARKS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(getattr(pytest.mark, mark))


# `make test-fast` runs on pytest-xdist workers with --dist loadgroup: each test goes to whichever
# worker is free, except that the tests of one group below all go to one worker: those that share
# the replays of recorded traces (tests/replays.py, or their module's own cache), so each trace is
# replayed once, and those that write a file of the repo that another of them reads. Grouped by
# file here, not by xdist_group marks: pytest 9.2 ignores the node ids those marks rewrite.
WORKER_GROUPS = {
    "tests/analysis/test_golden.py": "replays",
    "tests/analysis/test_accuracy.py": "replays",
    "tests/analysis/test_accuracy_live_gpu.py": "replays",
    "tests/analysis/test_matrix.py": "matrix",
    "tests/analysis/test_held_back_traces.py": "held_back",
    # builds deploy/kubernetes/*.yaml again in place while another test validates them
    "tests/deploy/test_systemd_k8s.py": "k8s_manifests",
}
# test_baseline.py judges every recording again, from the replay the group that judges it first
# caches: each of its tests goes to that group's worker, by the recording its id names
BASELINE_TESTS = "tests/analysis/test_baseline.py"
BASELINE_GROUPS = {"[matrix-cpu/": "matrix", "[matrix-gpu/": "matrix", "[h200x2-more/": "held_back"}


def worker_group(nodeid: str) -> str | None:
    """The group of WORKER_GROUPS (or the baseline's) a test belongs to, if any."""
    path, _, rest = nodeid.partition("::")
    if path == BASELINE_TESTS:
        return next((g for key, g in BASELINE_GROUPS.items() if key in rest), "replays")
    return WORKER_GROUPS.get(path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ByGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid) or super()._split_scope(nodeid)

    return ByGroups(config, log)


def torch_available() -> bool:
    """Installed, found without importing it: the modules that ask at collection run torch in their
    jobs' processes, and an import here would cost every collection (each xdist worker's) seconds."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


@pytest.fixture(autouse=True)
def _no_leftover_children():
    """Every test cleans up what it starts: a child it leaves running fails it."""
    import psutil

    me = psutil.Process()
    before = {c.pid for c in me.children(recursive=True)}
    yield

    def started_here(c: psutil.Process) -> bool:
        # a process a module's server started (a live hangd's py-spy) is that server's, not the test's
        try:
            return c.status() != psutil.STATUS_ZOMBIE and not any(a.pid in before for a in c.parents())
        except psutil.NoSuchProcess:
            return False

    left = [c for c in me.children(recursive=True) if c.pid not in before and started_here(c)]
    if left:
        for c in left:
            c.kill()
        raise AssertionError(f"test left child processes running: {[(c.pid, c.name()) for c in left]}")
