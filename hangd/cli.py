"""The ``hangd`` command."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any, NoReturn

from hangd import __version__
from hangd.config import ConfigError, Settings, load_settings
from hangd.redact import RedactingFormatter, redact_text


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        self.exit(2, f"hangd: {message}\n")


def _settings(args: argparse.Namespace, **flags: Any) -> Settings:
    return load_settings(flags=flags, config_path=getattr(args, "config", None))


def cmd_status(args: argparse.Namespace) -> int:
    from hangd.status import collect_status, render_status

    s = _settings(args)
    st = collect_status(s, seconds=args.seconds)
    print(json.dumps(st, indent=1, default=str) if args.json else render_status(st))
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    from hangd.record import record

    if args.hz <= 0 or args.seconds <= 0:
        raise ConfigError("--hz and --seconds must be > 0")
    s = _settings(args)
    res = record(s, args.out, args.seconds, args.hz, stacks_every=args.stacks_every, fr_every=args.fr_every)
    print(f"recorded {res['snapshots']} snapshots to {res['out']}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from hangd.replay import replay_result, run_replay
    from hangd.trace import TraceError

    try:
        an, info = run_replay(args.dir, speed=args.speed)
    except TraceError as e:
        raise ConfigError(str(e)) from e
    res = replay_result(an)
    if args.json:
        print(json.dumps(res, indent=1, default=str))
        return 0
    t0 = info["meta"].get("t_start") or (res["states"][0]["t"] if res["states"] else 0)
    print(f"{info['snapshots']} snapshots from {args.dir}")
    events = [(c["t"], f"pid {c['pid']:>7} rank {c['rank']!s:>3}  {c['state']:<13} {c['reason']}") for c in res["states"]]
    for inc in res["incidents"]:
        events.append((inc["opened_at"], f"INCIDENT #{inc['id']} {inc['kind']} opened: job {inc['job']}, culprit ranks "
                       f"{inc['culprit_ranks']} (pids {inc['culprit_pids']})\n{'':>10}{inc['summary']}"))
        if inc["resolved_at"] is not None:
            events.append((inc["resolved_at"], f"INCIDENT #{inc['id']} resolved: {inc['timeline'][-1].get('note', '')}"))
    for f in res["findings"]:
        events.append((f["t"], f"FINDING {f['kind']}: {f.get('message', '')}"))
    for t, text in sorted(events, key=lambda e: e[0]):
        print(f"{t - t0:+9.2f}s  {text}")
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    """Follow the node: one JSON line (or one readable line) per state change and incident change."""
    from hangd.daemon import Loop

    s = _settings(args, interval=args.interval)
    loop = Loop(s)

    def emit(snap: Any, changes: list[Any], incidents: list[Any]) -> None:
        for c in changes:
            d = c.to_dict()
            d.pop("evidence", None)
            print(json.dumps({"type": "state", **d}) if args.json else
                  f"{c.t:.1f} pid {c.pid} rank {c.rank} {c.state}: {c.reason}", flush=True)
        for inc in incidents:
            print(json.dumps({"type": "incident", **inc.to_dict()}, default=str) if args.json else
                  f"{inc.updated_at:.1f} incident #{inc.id} {inc.kind} {'open' if inc.open else 'resolved'}: {inc.summary}",
                  flush=True)

    loop.run(emit, seconds=args.seconds or None)
    return 0


def cmd_fr_analyze(args: argparse.Namespace) -> int:
    from hangd.flightrec.cli import analyze_paths, exit_status

    out, text = analyze_paths(args.paths)
    print(json.dumps(out, indent=1, default=str) if args.json else text)
    return exit_status(out)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hangd", description="Is this distributed GPU job hung, why, and who is to blame?")
    p.add_argument("--version", action="version", version=f"hangd {__version__}")
    p.add_argument("--config", help="settings file (TOML); default /etc/hangd/hangd.toml when present")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    st = sub.add_parser("status", help="one look at the node now")
    st.add_argument("--json", action="store_true")
    st.add_argument("--seconds", type=float, default=2.0, help="observe this long to measure rates (default 2)")
    st.set_defaults(func=cmd_status)

    rec = sub.add_parser("record", help="record the node as a hangd-trace/1 bundle")
    rec.add_argument("--out", required=True)
    rec.add_argument("--seconds", type=float, default=60.0)
    rec.add_argument("--hz", type=float, default=4.0)
    rec.add_argument("--stacks-every", type=float, default=0.0, help="also dump every rank's stack this often (s)")
    rec.add_argument("--fr-every", type=float, default=0.0,
                     help="also ask ranks with a dump pipe for a flight-recorder dump this often (s)")
    rec.set_defaults(func=cmd_record)

    rp = sub.add_parser("replay", help="run a recorded trace through the analysis")
    rp.add_argument("dir")
    rp.add_argument("--json", action="store_true")
    rp.add_argument("--speed", type=float, default=0.0, help="N times real time (default: as fast as possible)")
    rp.set_defaults(func=cmd_replay)

    w = sub.add_parser("watch", help="follow the node: state changes and incidents as they happen")
    w.add_argument("--json", action="store_true", help="one JSON object a line")
    w.add_argument("--interval", type=float, default=None, help="seconds between samples (default 1)")
    w.add_argument("--seconds", type=float, default=0.0, help="stop after this long (default: never)")
    w.set_defaults(func=cmd_watch)

    fr = sub.add_parser("fr", help="PyTorch flight-recorder dumps")
    frs = fr.add_subparsers(dest="fr_cmd", required=True, parser_class=_Parser)
    fa = frs.add_parser("analyze", help="find who broke the collective, from dump files or directories",
                        epilog="exit status: 0 every rank read and in agreement, 1 a finding "
                               "(including a rank with no dump or an unreadable file), 2 no dump could be read")
    fa.add_argument("paths", nargs="+")
    fa.add_argument("--json", action="store_true")
    fa.set_defaults(func=cmd_fr_analyze)

    try:
        from hangd.server.cli import add_commands
    except ImportError:
        pass
    else:
        add_commands(sub)
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
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
