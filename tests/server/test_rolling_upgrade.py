"""A rolling upgrade on one PostgreSQL: a newer hangd migrates the shared database one revision past
what this hangd knows, while this one still runs on the other nodes (docs/operator-guide.md,
"Upgrades"). The newer hangd is this source tree, copied, with release 0.2.0 and one migration more,
made for the test: additive (a nullable column and a table). Declared runnable by this release, this
hangd keeps serving on it; declared to need 0.2.0, it refuses with one line that says what to do, and
serves again once the newer hangd has rolled the schema back."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

import hangd
from hangd.store.schema import release

from ..conftest import ROOT, hangd_cmd
from ..realpg import free_port
from ..served import serve

NEWER = "0.2.0"


def _head() -> str:
    return max(p.name.split("_", 1)[0] for p in (ROOT / "migrations" / "versions").glob("[0-9]*.py"))


def _newer_hangd(tmp: Path, oldest_hangd: str) -> Path:
    """This tree as the next release, with a migration one past this one's head."""
    root = tmp / "newer"
    for d in ("hangd", "migrations"):
        shutil.copytree(ROOT / d, root / d, ignore=shutil.ignore_patterns("__pycache__"))
    init = root / "hangd" / "__init__.py"
    init.write_text(re.sub(r'__version__ = "[^"]+"', f'__version__ = "{NEWER}"', init.read_text()))
    head = _head()
    nxt = f"{int(head) + 1:04d}"
    (root / "migrations" / "versions" / f"{nxt}_pager.py").write_text(f'''"""pager: who to page for an incident"""
import sqlalchemy as sa
from alembic import op

revision = {nxt!r}
down_revision = {head!r}
branch_labels = None
depends_on = None
oldest_hangd = {oldest_hangd!r}


def upgrade() -> None:
    with op.batch_alter_table("incidents") as b:
        b.add_column(sa.Column("pager", sa.String(255), nullable=True))
    op.create_table("pagers", sa.Column("id", sa.Integer, primary_key=True), sa.Column("who", sa.String(255)))


def downgrade() -> None:
    op.drop_table("pagers")
    with op.batch_alter_table("incidents") as b:
        b.drop_column("pager")
''')
    return root


def _run(root: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    """`hangd ARGS` of the newer tree (root) or of the one under test (None)."""
    env = dict(os.environ, HANGD_CONFIG=os.devnull)
    if root is not None:
        env["PYTHONPATH"] = str(root)
    return subprocess.run([*hangd_cmd(), *args], cwd=root or ROOT, capture_output=True, text=True, timeout=180,
                          env=env)


@pytest.fixture
def fleet_db(fresh_pg) -> Iterator[str]:
    yield fresh_pg


def _version(url: str) -> str:
    eng = create_engine(url)
    try:
        with eng.connect() as c:
            return str(c.execute(text("SELECT version_num FROM alembic_version")).scalar_one())
    finally:
        eng.dispose()


def _nodes(url: str) -> set[str]:
    eng = create_engine(url)
    try:
        with eng.connect() as c:
            return {r[0] for r in c.execute(text("SELECT hostname FROM nodes"))}
    finally:
        eng.dispose()


def test_an_older_hangd_keeps_serving_on_a_newer_schema_declared_runnable_by_its_release(tmp_path, served, fleet_db):
    assert release(hangd.__version__) < release(NEWER)
    newer = _newer_hangd(tmp_path, oldest_hangd=hangd.__version__)
    nxt = f"{int(_head()) + 1:04d}"
    old = _run(None, "db", "upgrade", "--db", fleet_db)  # the fleet ran this release
    assert old.returncode == 0, old.stderr
    up = _run(newer, "db", "upgrade", "--db", fleet_db)  # the first node of the rollout migrates
    assert up.returncode == 0, up.stderr
    assert _version(fleet_db) == nxt

    # a node not yet upgraded restarts: it serves, writes, and leaves the newer schema as it is
    s = serve(tmp_path, "--node-name", "old-node", db=fleet_db)
    served.append(s)
    ready = s.wait_for(lambda s: (r := s.get("/readyz").json())["status"] != "not ready" and r, 60, "ready")
    assert "store degraded" not in ready["detail"], ready
    assert s.get("/incidents").status_code == 200
    s.wait_for(lambda s: "old-node" in _nodes(fleet_db), 30, "the old node's row in the shared database")
    assert _version(fleet_db) == nxt
    eng = create_engine(fleet_db)
    assert "pager" in {c["name"] for c in inspect(eng).get_columns("incidents")}
    eng.dispose()
    s.stop()
    log = s.log.read_text()
    assert (f"its schema (revision {nxt}) is newer than this hangd {hangd.__version__} knows and declared runnable "
            f"by it (hangd {hangd.__version__} or newer): serving on it without migrating") in log, log[-3000:]
    assert "Traceback" not in log and "Can't locate revision" not in log, log[-3000:]
    by_hand = _run(None, "db", "upgrade", "--db", fleet_db)
    assert by_hand.returncode == 0 and "serving on it without migrating" in by_hand.stderr, by_hand.stderr


def test_an_older_hangd_refuses_a_newer_schema_that_needs_a_newer_release_in_one_line(tmp_path, fleet_db):
    newer = _newer_hangd(tmp_path, oldest_hangd=NEWER)
    nxt = f"{int(_head()) + 1:04d}"
    up = _run(newer, "db", "upgrade", "--db", fleet_db)
    assert up.returncode == 0, up.stderr
    line = (f"its schema (revision {nxt}) needs hangd {NEWER} or newer; this is hangd {hangd.__version__}. "
            f"HINT: upgrade hangd on this node to {NEWER} or newer (see the operator guide: Upgrades)")
    for args in (["serve", "--listen", f"127.0.0.1:{free_port()}", "--node-name", "old-node", "--db", fleet_db],
                 ["db", "upgrade", "--db", fleet_db]):
        out = _run(None, *args)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 3 and len(lines) == 1, (args, out.returncode, out.stderr)
        assert lines[0].startswith("hangd: db postgresql+psycopg://") and lines[0].endswith(line), lines
    assert _version(fleet_db) == nxt and "old-node" not in _nodes(fleet_db)

    # the rollback the guide gives: the newer hangd takes the schema back to what this release knows
    down = _run(newer, "db", "downgrade", _head(), "--db", fleet_db)
    assert down.returncode == 0, down.stderr
    again = _run(None, "db", "upgrade", "--db", fleet_db)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert _version(fleet_db) == _head()


def test_every_migration_names_the_oldest_release_that_runs_on_it():
    """What an older hangd reads in a rollout; a migration without it counts as needing its own release."""
    for p in sorted((ROOT / "migrations" / "versions").glob("[0-9]*.py")):
        m = re.search(r"^oldest_hangd = '([^']+)'", p.read_text(), re.M)
        assert m and release(m.group(1)) and release(m.group(1)) <= release(hangd.__version__), p.name
