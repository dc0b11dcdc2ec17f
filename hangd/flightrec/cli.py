"""``hangd fr analyze``: dump files or directories in, findings out.

Exit status (``exit_status``): 0 when every rank of every group was read and nothing is wrong,
1 when there is a finding (a mismatch, a missing rank, an unreadable file, a rank with no dump),
2 when no dump could be read at all.
"""

from __future__ import annotations

import os
from typing import Any

from hangd.flightrec.analyze import Finding, analyze, missing_dumps, summary
from hangd.flightrec.reader import Dump, DumpError, rank_from_name, read_file

EXIT_CLEAN, EXIT_FINDINGS, EXIT_NOTHING_READ = 0, 1, 2


def collect(paths: list[str], skipped: dict[str, str] | None = None) -> tuple[list[Dump], dict[int | str, str]]:
    """Read every dump named or found in a directory (files named ``<prefix><rank>`` that decode
    as dumps). A file named on the command line that cannot be read is an error; one found in a
    directory is only noted in ``skipped`` (path -> why), since directories hold other files too."""
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
                except DumpError as e:
                    if skipped is not None:
                        skipped[full] = str(e)
        else:
            rank = rank_from_name(path)
            try:
                dumps.append(read_file(path))
            except DumpError as e:
                errors[rank if rank is not None else path] = str(e)
    return dumps, errors


def exit_status(out: dict[str, Any]) -> int:
    """What ``hangd fr analyze`` exits with, from its ``--json`` document."""
    if not out["ranks"]:
        return EXIT_NOTHING_READ
    return EXIT_FINDINGS if out["findings"] else EXIT_CLEAN


def analyze_paths(paths: list[str]) -> tuple[dict[str, Any], str]:
    """The ``--json`` document and the text report for the dumps at ``paths``."""
    skipped: dict[str, str] = {}
    dumps, errors = collect(paths, skipped)
    return report(dumps, errors, skipped, paths)


def report(dumps: list[Dump], errors: dict[int | str, str], skipped: dict[str, str],
           paths: list[str]) -> tuple[dict[str, Any], str]:
    findings: list[Finding] = analyze(dumps, errors)
    findings += missing_dumps(dumps, errors)
    out = summary(dumps, findings)
    out["skipped"] = [{"path": p, "why": why} for p, why in skipped.items()]
    if dumps:
        lines = [f"{len(dumps)} dump(s): " + ", ".join(
            f"rank {d.rank} ({d.encoding} v{d.version}, {len(d.entries)} entries{', owner ' + d.owner if d.owner else ''})"
            for d in dumps)]
    else:
        lines = ["No flight-recorder dump could be read from " + ", ".join(paths) + "."]
    for p, why in skipped.items():
        lines.append(f"skipped {p}: {why}")
    for g in out["groups"]:
        st = ", ".join(f"rank {r}: enqueued {s.get('last_enqueued_collective')}, completed {s.get('last_completed_collective')}"
                       for r, s in sorted(g["status"].items()))
        lines.append(f"group {g['pg']} ({g.get('desc') or '-'}), ranks {g.get('ranks')}: {st}")
    if dumps and not findings:
        lines.append("No findings: every rank issued the same collectives.")
    for f in findings:
        lines.append(f"{f.kind.upper()}: {f.message}")
        if f.frames:
            lines.append("    at " + " <- ".join(f"{fr.get('name')} ({os.path.basename(str(fr.get('filename')))}:{fr.get('line')})" for fr in f.frames[:4]))
    return out, "\n".join(lines)
