"""`hangd serve` and `hangd db ...`."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from typing import Any

from hangd.config import ConfigError, load_settings
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


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from hangd.server.app import create_app
    from hangd.server.runtime import Daemon
    from hangd.store.db import Store

    s = load_settings(flags={"listen": args.listen, "db": args.db, "interval": args.interval, "replay": args.replay,
                             "speed": args.speed, "log_json": args.log_json or None, "token_file": args.token_file},
                      config_path=getattr(args, "config", None))
    host, port = s.host_port()
    token = s.resolved_token()
    loopback = s.is_loopback()
    if not loopback and not token:
        raise ConfigError(f"listen {s.listen}: off loopback hangd needs a token (HANGD_TOKEN or --token-file)")
    if s.replay:
        from hangd.trace import TraceError, TraceReader
        try:
            TraceReader(s.replay)
        except TraceError as e:
            raise ConfigError(str(e)) from e
    _setup_logging(s.log_json, s.log_level)
    log = logging.getLogger("hangd.serve")
    try:
        store = Store(s.db)
    except Exception as e:  # noqa: BLE001 - one line for the operator, not a traceback
        raise db_error(s.db, e) from e
    daemon = Daemon(s, store=store)
    app = create_app(daemon, token=token, loopback=loopback)
    daemon.start()
    log.info("hangd serving on http://%s:%d (%s, db %s)", host, port, f"replay {s.replay}" if s.replay else "live",
             redact_url(s.db))
    # log_config=None: uvicorn's records (a 500's traceback) go through hangd's redacting handler
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off",
                            limit_concurrency=64, timeout_keep_alive=5, log_config=None)
    server = uvicorn.Server(config)

    def stop(*_: Any) -> None:
        server.should_exit = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.run()
    finally:
        daemon.shutdown()
        t0 = time.time()
        while daemon.store.pending and time.time() - t0 < 5:
            daemon.store.submit_flush()
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from hangd.store.db import downgrade, upgrade

    s = load_settings(flags={"db": args.db}, config_path=getattr(args, "config", None))
    try:
        if args.db_cmd == "upgrade":
            upgrade(s.db, args.revision)
        else:
            downgrade(s.db, args.revision)
    except Exception as e:  # noqa: BLE001 - one line for the operator, not a traceback
        raise db_error(s.db, e) from e
    print(f"{args.db_cmd} {redact_url(s.db)} to {args.revision}")
    return 0


def add_commands(sub: Any) -> None:
    sv = sub.add_parser("serve", help="run the daemon: REST API, /metrics, store")
    sv.add_argument("--listen", help="HOST:PORT (default 127.0.0.1:9877)")
    sv.add_argument("--db", help="SQLAlchemy URL (default SQLite in /var/lib/hangd or ~/.local/share/hangd)")
    sv.add_argument("--interval", type=float, help="seconds between samples (default 1)")
    sv.add_argument("--replay", help="run on a recorded trace instead of the live node")
    sv.add_argument("--speed", type=float, help="with --replay: N times real time (default 1)")
    sv.add_argument("--token-file", help="file holding the API token (or set HANGD_TOKEN)")
    sv.add_argument("--log-json", action="store_true", help="structured JSON logs")
    sv.set_defaults(func=cmd_serve)
    db = sub.add_parser("db", help="database migrations")
    dbs = db.add_subparsers(dest="db_cmd", required=True)
    for name, default in (("upgrade", "head"), ("downgrade", "base")):
        p = dbs.add_parser(name)
        p.add_argument("revision", nargs="?", default=default)
        p.add_argument("--db", help="SQLAlchemy URL")
        p.set_defaults(func=cmd_db)
