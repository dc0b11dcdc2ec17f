"""``hangd fr analyze``: dump files or directories in, findings out."""

from __future__ import annotations

import os
from typing import Any

from hangd.flightrec.analyze import analyze, summary
from hangd.flightrec.reader import Dump, DumpError, rank_from_name, read_file


def collect(paths: list[str]) -> tuple[list[Dump], dict[int | str, str]]:
    """Read every dump named or found in a directory (files named ``<prefix><rank>`` that decode
    as dumps; everything else in a directory is ignored)."""
    dumps: list[Dump] = []
    errors: dict[int | str, str] = {}
    for path in paths:
        if os.path.isdir(path):
            for name in sorted(os.listdir(path)):
                full = os.path.join(path, name)
                if rank_from_name(name) is None or not os.path.isfile(full) or os.path.islink(full):
                    continue
                try:
                    dumps.append(read_file(full))
                except DumpError:
                    continue  # not a dump: directories hold other files too
        else:
            rank = rank_from_name(path)
            try:
                dumps.append(read_file(path))
            except DumpError as e:
                errors[rank if rank is not None else path] = str(e)
    return dumps, errors


def analyze_paths(paths: list[str]) -> tuple[dict[str, Any], str]:
    dumps, errors = collect(paths)
    findings = analyze(dumps, errors)
    out = summary(dumps, findings)
    lines = [f"{len(dumps)} dump(s): " + ", ".join(f"rank {d.rank} ({d.encoding} v{d.version}, {len(d.entries)} entries"
                                                 f"{', owner ' + d.owner if d.owner else ''})" for d in dumps)]
    for g in out["groups"]:
        st = ", ".join(f"rank {r}: enqueued {s.get('last_enqueued_collective')}, completed {s.get('last_completed_collective')}"
                       for r, s in sorted(g["status"].items()))
        lines.append(f"group {g['pg']} ({g.get('desc') or '-'}), ranks {g.get('ranks')}: {st}")
    if not findings:
        lines.append("No findings: every rank issued the same collectives.")
    for f in findings:
        lines.append(f"{f.kind.upper()}: {f.message}")
        if f.frames:
            lines.append("    at " + " <- ".join(f"{fr.get('name')} ({os.path.basename(str(fr.get('filename')))}:{fr.get('line')})" for fr in f.frames[:4]))
    return out, "\n".join(lines)
