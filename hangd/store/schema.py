"""Where the migrations are, the database driver, and which hangd releases can run on a schema.

The migrations live in the top-level ``migrations/`` folder of the source tree and install as the
package ``hangd.migrations`` (pyproject.toml maps the one to the other).

Rolling upgrades (docs/operator-guide.md, "Upgrades"): every migration names the oldest hangd
release that can run on the schema it leaves (``oldest_hangd`` in the migration file), and the
hangd that migrates writes that into the table ``hangd_schema``, one row per revision. A hangd
that meets a database migrated past the newest revision it knows reads those rows: when each
revision it does not know is declared runnable by its release, it serves on that schema and leaves
it as it is; otherwise it refuses to start with one line (SchemaTooNew) saying which release the
database needs."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Table, inspect, select
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError

import hangd
from hangd.exitcodes import CannotRun
from hangd.redact import redact_url

log = logging.getLogger("hangd.store")
HANGD = Path(hangd.__file__).resolve().parent
SCHEMA_TABLE = "hangd_schema"
GUIDE = "see the operator guide: Upgrades"


def migrations_dir() -> Path:
    """The Alembic script folder: inside an installed package, else the source tree's top level."""
    installed = HANGD / "migrations"
    return installed if (installed / "env.py").is_file() else HANGD.parent / "migrations"


class DriverMissing(CannotRun):
    """The database URL names a driver that is not installed: says what to install."""


def require_driver(url: str) -> None:
    """Raise DriverMissing when the URL's database driver (DBAPI module) cannot be imported."""
    try:
        dialect = make_url(url).get_dialect()
    except ArgumentError:  # not a URL or no such dialect: create_engine says so itself
        return
    try:
        dialect.import_dbapi()
    except ImportError as e:
        where = redact_url(url)
        missing = f"No module named {e.name!r}" if e.name else str(e).splitlines()[0]
        if dialect.name == "postgresql" and dialect.driver == "psycopg":
            raise DriverMissing(f"db {where}: the PostgreSQL driver is not installed ({missing}). "
                                "HINT: pip install 'hangd[postgres]'") from None
        if dialect.name == "postgresql":
            raise DriverMissing(f"db {where}: the driver of {url.split(':', 1)[0]}:// URLs ({dialect.driver}) is "
                                f"not installed ({missing}). HINT: pip install 'hangd[postgres]' and write the URL "
                                "as postgresql+psycopg://...") from None
        raise DriverMissing(f"db {where}: the {dialect.name} driver {dialect.driver} is not installed ({missing}). "
                            "HINT: install it where hangd is installed") from None


class SchemaTooNew(CannotRun):
    """A newer hangd migrated the database to a schema this release cannot run on."""


def release(version: str) -> tuple[int, ...]:
    """``"0.2.10"`` -> (0, 2, 10): releases compare by their numbers (a suffix is ignored)."""
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+", 1)[0])[:3])


def _script(cfg: Any) -> Any:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(cfg)


def _heads(conn: Connection) -> tuple[str, ...]:
    from alembic.runtime.migration import MigrationContext

    return tuple(MigrationContext.configure(conn).get_current_heads())


def oldest_hangd(module: Any) -> str:
    """What a migration declares; one that declares nothing is taken to need the hangd that ships it."""
    v = getattr(module, "oldest_hangd", None)
    return v if isinstance(v, str) and release(v) else hangd.__version__


def serve_newer(conn: Connection, cfg: Any, url: str, version: str = hangd.__version__) -> bool:
    """Before ``upgrade head``: True when the database is at a revision this hangd does not know and
    every such revision declares this release runnable (nothing to migrate: serve on it as it is).
    Raises SchemaTooNew when one of them needs a newer release, or declares nothing."""
    script = _script(cfg)
    known = {s.revision for s in script.walk_revisions()}
    unknown = [h for h in _heads(conn) if h not in known]
    if not unknown:
        return False
    rows: dict[str, str] = {}
    if inspect(conn).has_table(SCHEMA_TABLE):
        from hangd.store.models import SchemaRevision

        t = cast(Table, SchemaRevision.__table__)
        rows = {r.revision: r.oldest_hangd for r in conn.execute(select(t.c.revision, t.c.oldest_hangd))}
    where, head = redact_url(url), ", ".join(unknown)
    newer = {rev: need for rev, need in rows.items() if rev not in known}
    if not all(h in rows for h in unknown):
        raise SchemaTooNew(f"db {where}: its schema (revision {head}) was migrated by a newer hangd and says "
                           f"nothing of the releases that can run on it. HINT: upgrade hangd on this node to the "
                           f"release that migrated it ({GUIDE})")
    need = max(newer.values(), key=release)
    if release(version) < release(need):
        raise SchemaTooNew(f"db {where}: its schema (revision {head}) needs hangd {need} or newer; this is hangd "
                           f"{version}. HINT: upgrade hangd on this node to {need} or newer ({GUIDE})")
    log.warning("db %s: its schema (revision %s) is newer than this hangd %s knows and declared runnable by it "
                "(hangd %s or newer): serving on it without migrating", where, head, version, need)
    return True


def record(conn: Connection, cfg: Any) -> None:
    """After a migration: write, for the revisions now applied, the oldest release that runs on each."""
    if not inspect(conn).has_table(SCHEMA_TABLE):  # below the revision that made it
        return
    from hangd.store.models import SchemaRevision

    t = cast(Table, SchemaRevision.__table__)
    heads = _heads(conn)
    applied = list(_script(cfg).iterate_revisions(heads, "base")) if heads else []
    rows = {s.revision: oldest_hangd(s.module) for s in applied}
    if {r.revision: r.oldest_hangd for r in conn.execute(select(t.c.revision, t.c.oldest_hangd))} == rows:
        return  # as written before: a start with nothing to migrate writes nothing (a locked file stays readable)
    conn.execute(t.delete())
    if rows:
        conn.execute(t.insert(), [{"revision": r, "oldest_hangd": v} for r, v in rows.items()])
