"""`hangd serve` and `hangd db ...`."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from hangd.config import ConfigError, Settings, load_settings, seconds_arg
from hangd.exitcodes import CannotRun
from hangd.redact import RedactingFormatter, redact_known, redact_text, redact_url, url_password


class JsonFormatter(logging.Formatter):
    """One JSON object a line; the message and traceback are redacted before they are encoded
    (redacting the encoded line could cut through the JSON)."""

    def format(self, record: logging.LogRecord) -> str:
        d = {"t": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
             "msg": redact_text(record.getMessage())}
        if record.exc_info:
            exc = self.formatException(record.exc_info)[-2000:]
            d["exc"] = redact_text(exc)
        return json.dumps(d)


def db_error(url: str, e: BaseException) -> ConfigError:
    """A one-line database error without the password: neither in the URL nor where the driver
    quoted it (a misparsed password ends up in "cannot resolve host" messages)."""
    first = (str(e).splitlines() or [""])[0]
    detail = redact_known(redact_text(first), [url_password(url)])
    return ConfigError(f"db {redact_url(url)}: {type(e).__name__}: {detail}")


def _setup_logging(json_logs: bool, level: str) -> None:
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(JsonFormatter() if json_logs else
                   RedactingFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")))
    root = logging.getLogger()
    root.handlers[:] = [h]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)


class ServeError(CannotRun):
    """hangd cannot run here now (the port is taken, the database is in use): exit status 3."""


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        return _serve(args)
    except ServeError as e:
        print(f"hangd: {e}", file=sys.stderr)
        return 3


def _serve(args: argparse.Namespace) -> int:
    from hangd.server import http

    s = load_settings(flags={"listen": args.listen, "db": args.db, "interval": args.interval, "replay": args.replay,
                             "speed": args.speed, "log_json": args.log_json or None, "token_file": args.token_file,
                             "node_name": args.node_name, "read_token_file": args.read_token_file,
                             "external_url": args.external_url, "tls_certfile": args.tls_cert, "tls_keyfile": args.tls_key},
                      config_path=getattr(args, "config", None))
    host, port = s.host_port()
    token = s.resolved_token()
    read_token = s.resolved_read_token()
    s.tls()
    loopback = s.is_loopback()
    if not loopback and not (token or read_token):
        raise ConfigError(f"listen {s.listen}: off loopback hangd needs a token (HANGD_TOKEN or --token-file; "
                          "HANGD_READ_TOKEN or --read-token-file for one that only reads)")
    if token and read_token and token == read_token:
        raise ConfigError("the read token is the write token: make them different, or the read token writes too")
    tmpdir: str | None = None
    if s.replay:
        from hangd.trace import TraceError, TraceReader
        try:  # read it all now: a malformed trace is one line at start, not a dead loop later
            TraceReader(s.replay).check()
        except TraceError as e:
            raise ConfigError(str(e)) from e
        if args.db is None:
            # a replay is an experiment: it never writes into the node's own store unless told to
            tmpdir = tempfile.mkdtemp(prefix="hangd-replay-")
            s.db = f"sqlite:///{os.path.join(tmpdir, 'replay.db')}"
    try:
        try:
            sock = http.bind(host, port)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ServeError(f"listen {host}:{port}: address already in use. HINT: another hangd runs "
                                 "(systemctl status hangd), or pick another port with --listen") from e
            raise ServeError(f"listen {host}:{port}: {e.strerror or e}") from e
        try:
            return _run(s, sock, (token, read_token), loopback, temp_db=tmpdir is not None)
        finally:
            sock.close()
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)


def _run(s: Settings, sock: socket.socket, tokens: tuple[str | None, str | None], loopback: bool, temp_db: bool) -> int:
    import uvicorn

    from hangd.server import http, links
    from hangd.server.app import create_app
    from hangd.server.runtime import Daemon
    from hangd.store.db import Store, StoreInUse

    _setup_logging(s.log_json, s.log_level)
    log = logging.getLogger("hangd.serve")
    try:
        store = Store(s.db, hostname=s.node_name, exclusive=True, migrate_apart=True, heartbeat_s=s.heartbeat_s,
                      node_stale_s=s.node_stale_s)
    except StoreInUse as e:
        raise ServeError(str(e)) from e
    except CannotRun:  # the database driver is not installed, the schema is newer than this hangd runs on
        raise
    except Exception as e:  # noqa: BLE001 - one line for the operator, not a traceback
        raise db_error(s.db, e) from e
    try:
        daemon = Daemon(s, store=store)
        host, port = sock.getsockname()[:2]
        tls = s.tls()
        base = links.external_base(s.external_url, store.hostname, host, port, tls is not None)
        app = create_app(daemon, token=tokens[0], loopback=loopback, read_token=tokens[1], external_base=base)
        max_conn = http.raise_fd_limit()
        server = uvicorn.Server(http.server_config(app, max_conn, tls))

        def stop(*_: Any) -> None:
            server.should_exit = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        daemon.start()
        # the socket is bound and listening: connections queue from now on
        log.info("hangd serving on %s://%s:%d, links as %s (%s, db %s%s)", "https" if tls else "http", host, port, base,
                 f"replay {s.replay}" if s.replay else "live", _shown_db(s.db),
                 ", temporary: pass --db to keep the replay's results" if temp_db else "")
        try:
            server.run(sockets=[sock])
        finally:
            daemon.shutdown()
            store.stop_writer()
            t0 = time.time()
            while store.pending and time.time() - t0 < 5:
                store.submit_flush()
    finally:
        store.close()
    return 0


def _shown_db(url: str) -> str:
    """A database URL without its password."""
    return redact_url(url)


def cmd_db(args: argparse.Namespace) -> int:
    from hangd.store.db import downgrade, upgrade

    s = load_settings(flags={"db": args.db}, config_path=getattr(args, "config", None))
    try:
        if args.db_cmd == "upgrade":
            upgrade(s.db, args.revision)
        else:
            downgrade(s.db, args.revision)
    except CannotRun:  # the database driver is not installed, the schema is newer than this hangd runs on
        raise
    except Exception as e:  # noqa: BLE001 - one line for the operator, not a traceback
        raise db_error(s.db, e) from e
    where = _shown_db(s.db)  # never print a password of the URL
    if args.json:
        print(json.dumps({"action": args.db_cmd, "db": where, "revision": args.revision}))
    else:
        print(f"{args.db_cmd} {where} to {args.revision}")
    return 0


def add_commands(sub: Any, help_: Callable[[str, str], dict[str, Any]]) -> None:
    sv = sub.add_parser("serve", help="run the daemon: REST API, /metrics, store", **help_(
        "Run the daemon: sample the node every --interval, keep incidents in the store, serve the REST\n"
        "API and /metrics. Exit 3 when the port is taken; 2 on a bad setting. A node whose GPUs cannot\n"
        "be seen still serves (a warning is logged, /readyz says degraded).",
        "  hangd serve\n  hangd serve --listen 0.0.0.0:9877 --token-file /etc/hangd/token\n"
        "  hangd serve --replay tests/data/traces/h200x2/nccl_stall --speed 2 --db sqlite:////tmp/h.db"))
    sv.add_argument("--listen", metavar="HOST:PORT", help="where to listen (default 127.0.0.1:9877), e.g. --listen 0.0.0.0:9877")
    sv.add_argument("--db", metavar="URL", help="SQLAlchemy URL (default SQLite in /var/lib/hangd or ~/.local/share/hangd; "
                    "with --replay a temporary database unless given), e.g. --db postgresql+psycopg://hangd@db/hangd")
    sv.add_argument("--interval", type=seconds_arg(), metavar="S", help="seconds between samples (default 1), e.g. --interval 0.5")
    sv.add_argument("--replay", metavar="DIR", help="run on a recorded trace instead of the live node, e.g. --replay /tmp/trace")
    sv.add_argument("--speed", type=seconds_arg(0, 1e6, lo_open=False), metavar="N",
                    help="with --replay: N times real time (default 1; 0: as fast as possible), e.g. --speed 10")
    sv.add_argument("--token-file", metavar="FILE", help="file holding the write token: acks, captures, and reads "
                    "(or set HANGD_TOKEN), e.g. --token-file /etc/hangd/token")
    sv.add_argument("--read-token-file", metavar="FILE", help="file holding a token that only reads: /metrics and GET "
                    "(or set HANGD_READ_TOKEN), e.g. --read-token-file /etc/hangd/read-token")
    sv.add_argument("--external-url", metavar="URL", help="where browsers reach this hangd, for the links in alerts; "
                    "{node} is the node's name (or set HANGD_EXTERNAL_URL), e.g. --external-url https://{node}.gpu.example:9877")
    sv.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (PEM; with --tls-key), "
                    "e.g. --tls-cert /etc/hangd/tls/tls.crt")
    sv.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM), e.g. --tls-key /etc/hangd/tls/tls.key")
    sv.add_argument("--log-json", action="store_true", help="structured JSON logs on stderr, one object a line, "
                    "e.g. hangd serve --log-json 2>&1 | jq -r .msg")
    sv.add_argument("--node-name", metavar="NAME", help="this node's name in a database several nodes share "
                    "(default: the host name), e.g. --node-name gpu-node-07")
    sv.set_defaults(func=cmd_serve)
    db = sub.add_parser("db", help="database migrations", **help_(
        "Database migrations (Alembic). `hangd serve` upgrades on start; these are for doing it by hand.",
        "  hangd db upgrade\n  hangd db downgrade base --db sqlite:////tmp/h.db --json"))
    dbs = db.add_subparsers(dest="db_cmd", required=True, metavar="COMMAND", parser_class=type(db))
    up = dbs.add_parser("upgrade", help="migrate to the newest schema", **help_(
        "Migrate the store to the newest schema (default revision: head).",
        "  hangd db upgrade\n  hangd db upgrade head --db sqlite:////tmp/h.db --json"))
    up.add_argument("revision", nargs="?", default="head", help="Alembic revision (default head), e.g. head")
    # no default: `hangd db downgrade` typed to see what it does must not drop every table (base)
    down = dbs.add_parser("downgrade", help="migrate to an older schema (base: drop every table)", **help_(
        "Migrate the store to an older schema. The revision is required: base drops every table\n"
        "and with them the incident history.",
        "  hangd db downgrade -1\n  hangd db downgrade base --db sqlite:////tmp/h.db --json"))
    down.add_argument("revision", help="Alembic revision: one, -1 for the previous, base for none, e.g. -1")
    for example, p in (("upgrade", up), ("downgrade -1", down)):
        p.add_argument("--db", metavar="URL", help="SQLAlchemy URL, e.g. --db sqlite:////var/lib/hangd/hangd.db")
        p.add_argument("--json", action="store_true", help=f"print the result as JSON, e.g. hangd db {example} --json")
        p.set_defaults(func=cmd_db)
