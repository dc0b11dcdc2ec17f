"""The ``hangd`` command.

One contract for every command: results on stdout (a table, lines, or JSON with ``--json``),
diagnostics on stderr, errors as one line ``hangd: <what is wrong>``, and the exit statuses of
``hangd.exitcodes`` (0 healthy, 1 something found, 2 usage or input error, 3 cannot run here)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any, NoReturn

from hangd import __version__, exitcodes
from hangd.config import ConfigError, Settings, load_settings, seconds_arg
from hangd.exitcodes import EPILOG, CannotRun
from hangd.redact import RedactingFormatter, redact_text, redact_url


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        self.exit(exitcodes.USAGE, f"hangd: {message} (see {self.prog} --help)\n")


def _settings(args: argparse.Namespace, **flags: Any) -> Settings:
    return load_settings(flags=flags, config_path=getattr(args, "config", None))


def _warn(text: str) -> None:
    """A header line on stderr: seen even when stdout goes to a file or a pipe into jq."""
    print(f"hangd: {text}", file=sys.stderr, flush=True)


def _quiet_source_logs(args: argparse.Namespace) -> None:
    # status, watch and record print their own header about a blind source; the runner's log line
    # would say it a second time
    if not args.verbose:
        logging.getLogger("hangd.sources").setLevel(logging.ERROR)


def _dump(doc: Any) -> None:
    print(json.dumps(doc, indent=1, default=str))


def _status_job(args: argparse.Namespace) -> int:
    from hangd.status import render_job
    from hangd.store.db import Store

    s = _settings(args, db=args.db)
    store = Store(s.db, migrate=False, register=False, heartbeat_s=s.heartbeat_s, node_stale_s=s.node_stale_s)
    try:
        job = store.fleet_jobs(args.job).get(args.job)
        incidents = store.list_incidents(status="open", job=args.job)[1] if job is not None else []
        fr = store.fleet_flight_recorder(args.job) if job is not None else {}
    finally:
        store.close()
    if job is None:
        _warn(f"no job {args.job} in {redact_url(s.db)} (a job that spans nodes, reported by a node in the last hour)")
        return exitcodes.CANNOT_RUN
    job["incidents"] = incidents
    job["flight_recorder"], job["fr_findings"] = fr["ranks"], fr["findings"]
    if args.json:
        _dump(job)
    else:
        print(render_job(job, time.time()))
    return exitcodes.FOUND if incidents else exitcodes.OK


def cmd_status(args: argparse.Namespace) -> int:
    from hangd.status import collect_status, nothing_to_watch, render_status, status_found

    if args.seconds <= 0:
        raise ConfigError("--seconds must be > 0")
    if args.job:
        return _status_job(args)
    s = _settings(args)
    _quiet_source_logs(args)
    st = collect_status(s, seconds=args.seconds)
    if st["gpus_unseen"]:
        _warn(st["gpus_unseen"])
    for name, why in sorted((st.get("unavailable") or {}).items()):
        if name != "nvml":
            _warn(f"source {name} {why}")
    if st["daemon"]["error"]:
        what, hint, todo = st["daemon"]["error"].partition(" HINT: ")
        _warn(f"{what} (its open incidents are not shown){hint}{todo}")
    if args.json:
        _dump(st)
    else:
        print(render_status(st))
    if nothing_to_watch(st):
        _warn("nothing to watch: no GPU can be seen and no distributed job runs here. "
              "HINT: run hangd on the node where the GPU job runs (see the operator guide: "
              "\"hangd says it cannot see GPUs\")")
        return exitcodes.CANNOT_RUN
    if status_found(st):
        return exitcodes.FOUND
    # nothing found by this look, and the daemon that has watched all along was not asked: not all clear
    return exitcodes.OK if st["daemon"]["answered"] else exitcodes.NO_DAEMON


def cmd_record(args: argparse.Namespace) -> int:
    from hangd.humanize import gpus_unseen
    from hangd.record import record
    from hangd.trace import TraceError

    s = _settings(args)
    _quiet_source_logs(args)
    try:
        res = record(s, args.out, args.seconds, args.hz, stacks_every=args.stacks_every, fr_every=args.fr_every)
    except TraceError as e:
        raise ConfigError(str(e)) from e
    unseen = gpus_unseen(res.get("unavailable"))
    if unseen:
        _warn(unseen + " (the trace holds /proc readings only)")
    if args.json:
        _dump({**res, "gpus_unseen": unseen})
    else:
        print(f"recorded {res['snapshots']} snapshots over {res['seconds']:.1f} s to {res['out']}; "
              f"replay it with: hangd replay {res['out']}")
    return exitcodes.OK


def cmd_replay(args: argparse.Namespace) -> int:
    from hangd.replay import render_replay, replay_result, run_replay
    from hangd.trace import TraceError

    if args.speed < 0:
        raise ConfigError("--speed must not be negative")
    try:
        an, info = run_replay(args.dir, speed=args.speed)
    except TraceError as e:
        raise ConfigError(str(e)) from e
    res = replay_result(an)
    if args.json:
        _dump(res)
    else:
        print(render_replay(res, info, args.dir))
    return exitcodes.FOUND if res["incidents"] or res["findings"] else exitcodes.OK


def cmd_watch(args: argparse.Namespace) -> int:
    """Follow the node: one JSON line (or one readable line) per state change and incident change."""
    from hangd.daemon import live_loop
    from hangd.watch import Watcher

    if args.seconds < 0:
        raise ConfigError("--seconds must not be negative")
    s = _settings(args, interval=args.interval)
    _quiet_source_logs(args)
    loop = live_loop(s)
    w = Watcher(json_lines=args.json, out=sys.stdout, warn=_warn)
    try:
        loop.run(w.emit, seconds=args.seconds or None)
    except KeyboardInterrupt:
        pass
    if w.blind and not w.seen_any:
        _warn("nothing to watch: no GPU could be seen and no distributed job ran here")
        return exitcodes.CANNOT_RUN
    open_now = bool(loop.front.incidents(open_only=True))
    return exitcodes.FOUND if open_now else exitcodes.OK


def cmd_fr_analyze(args: argparse.Namespace) -> int:
    from hangd.flightrec.cli import analyze_paths, exit_status

    missing = [p for p in args.paths if not os.path.exists(p)]
    if missing:
        raise ConfigError(f"no such file or directory: {missing[0]}")
    out, text = analyze_paths(args.paths)
    if not out.get("ranks") and not out.get("findings") and not out.get("skipped"):
        raise ConfigError(f"no flight-recorder dump found in {' '.join(args.paths)} "
                          "(files are named <prefix><rank>, e.g. fr_rank_0)")
    if args.json:
        _dump(out)
    else:
        print(text)
    status = exit_status(out)
    if status == exitcodes.USAGE:  # the report says file by file why; stderr says that it failed
        unread = len(out.get("skipped") or []) + sum(f.get("kind") == "unreadable" for f in out.get("findings") or [])
        _warn(f"no flight-recorder dump could be read from {' '.join(args.paths)} "
              f"({unread} file(s) refused or unreadable: the report on stdout says why)")
    return status


def _help(description: str, examples: str) -> dict[str, Any]:
    """description and epilog (examples, then the exit statuses) of a subcommand."""
    return {"description": description, "epilog": f"examples:\n{examples}\n\n{EPILOG}"}


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hangd", description="Is this distributed GPU job hung, why, and who is to blame?",
                epilog="examples:\n  hangd status\n  hangd watch --json | jq .\n"
                       "  hangd replay tests/data/traces/h200x2/nccl_stall\n\n" + EPILOG)
    p.add_argument("--version", action="version", version=f"hangd {__version__}")
    p.add_argument("--config", metavar="FILE",
                   help="settings file (TOML), e.g. --config /etc/hangd/hangd.toml; default: that file when present")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logs on stderr, e.g. hangd -v status")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser, metavar="COMMAND")

    st = sub.add_parser("status", help="one look at the node now", **_help(
        "One look at the node now: every GPU, every GPU process / rank, its state and why, and the open\n"
        "incidents of this node's hangd serve (asked at the listen setting; a look of a few seconds cannot\n"
        "see a hang itself). Exit 1 when an incident is open or a job is hung; 3 when no GPU can be seen\n"
        "and no job runs; 4 when nothing is found but hangd serve did not answer (one line on stderr\n"
        "says at which address): its incidents are unknown, not none.",
        "  hangd status\n  hangd status --seconds 5\n  hangd status --json | jq '.processes[] | {pid, state}'"))
    st.add_argument("--json", action="store_true", help="one JSON document instead of the table, e.g. hangd status --json")
    st.add_argument("--seconds", type=seconds_arg(0, 3600), default=2.0, metavar="S",
                    help="observe this long to measure rates (default 2), e.g. --seconds 5")
    st.add_argument("--job", metavar="KEY", help="the whole job as every node reports it, from the database the nodes "
                    "share (--db or the configured one), e.g. --job rdzv:10.0.0.1:29500")
    st.add_argument("--db", metavar="URL", help="with --job: the database, e.g. --db postgresql+psycopg://hangd@db/hangd")
    st.set_defaults(func=cmd_status)

    rec = sub.add_parser("record", help="record the node as a hangd-trace/1 bundle", **_help(
        "Record the node as a hangd-trace/1 bundle (secrets redacted) to attach to a bug report.",
        "  hangd record --out /tmp/trace --seconds 120\n"
        "  hangd record --out /tmp/trace --seconds 60 --hz 2 --stacks-every 10 --json"))
    rec.add_argument("--out", required=True, metavar="DIR", help="the bundle's directory (created), e.g. --out /tmp/trace")
    rec.add_argument("--seconds", type=seconds_arg(), default=60.0, metavar="S", help="record this long (default 60), e.g. --seconds 120")
    rec.add_argument("--hz", type=seconds_arg(0, 1000), default=4.0, help="snapshots per second (default 4), e.g. --hz 2")
    rec.add_argument("--stacks-every", type=seconds_arg(lo_open=False), default=0.0, metavar="S",
                     help="also dump every rank's stack this often (default: only when asked by the analysis), "
                          "e.g. --stacks-every 10")
    rec.add_argument("--fr-every", type=seconds_arg(lo_open=False), default=0.0, metavar="S",
                     help="also ask ranks with a dump pipe for a flight-recorder dump this often (default: only on "
                          "suspicion), e.g. --fr-every 30")
    rec.add_argument("--json", action="store_true", help="print the result as JSON, e.g. hangd record --out DIR --json")
    rec.set_defaults(func=cmd_record)

    rp = sub.add_parser("replay", help="run a recorded trace through the analysis", **_help(
        "Run a recorded trace through the same analysis as a live node: state changes, incidents\n"
        "(with the next step), flight-recorder findings. Exit 1 when the trace holds an incident or finding.",
        "  hangd replay tests/data/traces/h200x2/nccl_stall\n  hangd replay /tmp/trace --speed 10\n"
        "  hangd replay /tmp/trace --json | jq '.incidents[].summary'"))
    rp.add_argument("dir", metavar="DIR", help="a hangd-trace/1 directory, e.g. tests/data/traces/h200x2/nccl_stall")
    rp.add_argument("--json", action="store_true", help="states, incidents and findings as one JSON document, "
                    "e.g. hangd replay DIR --json | jq '.incidents[].next_step'")
    rp.add_argument("--speed", type=seconds_arg(0, 1e6, lo_open=False), default=0.0, metavar="N",
                    help="N times real time (default: as fast as possible), e.g. --speed 10")
    rp.set_defaults(func=cmd_replay)

    w = sub.add_parser("watch", help="follow the node: state changes and incidents as they happen", **_help(
        "Follow the node: one line per state change and per incident change, as they happen.\n"
        "Stops after --seconds (or Ctrl-C); exits 1 if an incident is still open then.",
        "  hangd watch\n  hangd watch --json | jq -c 'select(.type == \"incident\")'\n"
        "  hangd watch --seconds 600 --interval 0.5"))
    w.add_argument("--json", action="store_true", help="one JSON object a line, e.g. hangd watch --json")
    w.add_argument("--interval", type=seconds_arg(), default=None, metavar="S",
                   help="seconds between samples (default 1), e.g. --interval 0.5")
    w.add_argument("--seconds", type=seconds_arg(lo_open=False), default=0.0, metavar="S",
                   help="stop after this long (default: never), e.g. --seconds 600")
    w.set_defaults(func=cmd_watch)

    fr = sub.add_parser("fr", help="PyTorch flight-recorder dumps", **_help(
        "PyTorch flight-recorder dumps, read with a decoder that never unpickles code.",
        "  hangd fr analyze /tmp/fr_rank_0 /tmp/fr_rank_1\n  hangd fr analyze /tmp/dumps --json"))
    frs = fr.add_subparsers(dest="fr_cmd", required=True, parser_class=_Parser, metavar="COMMAND")
    fa = frs.add_parser("analyze", help="find who broke the collective, from dump files or directories", **_help(
        "Find who broke the collective: a missing rank, mismatched ops, sizes or dtypes.\n"
        "Exit 1 when there is a finding, 2 when no dump could be found.",
        "  hangd fr analyze /tmp/fr_rank_0 /tmp/fr_rank_1\n  hangd fr analyze /tmp/dumps --json"))
    fa.add_argument("paths", nargs="+", metavar="PATH", help="dump files or directories, e.g. /tmp/fr_rank_0 or /tmp/dumps")
    fa.add_argument("--json", action="store_true", help="ranks, groups and findings as one JSON document, e.g. hangd fr analyze /tmp/dumps --json")
    fa.set_defaults(func=cmd_fr_analyze)

    try:
        from hangd.server.cli import add_commands
    except ImportError:
        pass
    else:
        add_commands(sub, _help)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for h in logging.getLogger().handlers:
        if h.formatter is not None and not isinstance(h.formatter, RedactingFormatter):
            h.setFormatter(RedactingFormatter(h.formatter))
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"hangd: {redact_text(str(e))}", file=sys.stderr)
        return exitcodes.USAGE
    except CannotRun as e:
        print(f"hangd: {redact_text(str(e))}", file=sys.stderr)
        return exitcodes.CANNOT_RUN
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
