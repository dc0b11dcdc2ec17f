"""A dump as the rows a shared store keeps of it, and back: only what cross-rank analysis
compares (process groups' status, and per group the newest entries' op, sequence numbers, sizes,
dtypes and state). Frames stay on the node that read the dump: they are large, and name the job's
files and functions. Pure functions."""

from __future__ import annotations

from typing import Any

from hangd.flightrec.reader import Dump, Entry

# The newest entries kept per rank and process group. A hang or a desync shows at the newest
# collectives (ranks stop within one collective of each other; the missing rank's last one is
# in its pg_status), and the analysis compares only the window every rank still holds: 64 is
# several training steps of a few collectives each, with room for coalesced groups, at ~200 bytes
# a row (a 16-rank job with 4 groups: 4096 rows, under 1 MB) instead of a dump's thousands.
KEEP_PER_GROUP = 64
# and at most this many rows per rank, whatever number of groups a dump claims (newest first)
KEEP_PER_RANK = 1024

_LIMITS = {"pg": 255, "op": 128, "state": 32}


def _clip(s: str, field: str) -> str:
    # a text column refuses NUL (PostgreSQL): one hostile name must not fail the batch it is in
    return s.replace("\x00", "")[:_LIMITS[field]]


def storable_rank(rank: int) -> bool:
    """A rank the ``rank`` column holds (int4): a hostile dump's 2**40 is not written."""
    return 0 <= rank < 2**31


def to_rows(dump: Dump, keep: int = KEEP_PER_GROUP, cap: int = KEEP_PER_RANK) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the rank's row, its entries' rows oldest first). Entries are kept in the dump's order (the
    order they were enqueued), the newest ``keep`` of each group, then the newest ``cap`` of all."""
    per_group: dict[str, int] = {}
    kept: list[Entry] = []
    for e in reversed(dump.entries):
        n = per_group.get(e.pg, 0)
        if n >= keep:
            continue
        per_group[e.pg] = n + 1
        kept.append(e)
        if len(kept) >= cap:
            break
    head = {"version": dump.version.replace("\x00", "")[:32] if dump.version else None, "pg_config": dump.pg_config,
            "pg_status": dump.pg_status, "entries": len(dump.entries)}
    rows = [{"pg": _clip(e.pg, "pg"), "pg_id": e.pg_id, "seq": e.seq, "p2p_seq": e.p2p_seq, "op": _clip(e.op, "op"),
             "state": _clip(e.state, "state"), "completed": e.completed, "is_p2p": e.is_p2p,
             "input_sizes": e.input_sizes, "input_dtypes": e.input_dtypes, "output_sizes": e.output_sizes,
             "time_created_ns": e.time_created_ns} for e in reversed(kept)]
    return head, rows


def from_rows(rank: int, head: dict[str, Any], rows: list[dict[str, Any]]) -> Dump:
    """The Dump the analysis reads, rebuilt from a rank's rows (no frames, no record ids)."""
    dump = Dump(rank=rank, version=head.get("version") or "?", encoding="store",
                pg_config=dict(head.get("pg_config") or {}), pg_status=dict(head.get("pg_status") or {}))
    for r in rows:
        dump.entries.append(Entry(record_id=None, pg=r["pg"], pg_id=r["pg_id"], seq=r["seq"], p2p_seq=r["p2p_seq"],
                                  op=r["op"], state=r["state"], completed=bool(r["completed"]),
                                  input_sizes=list(r["input_sizes"] or []), input_dtypes=list(r["input_dtypes"] or []),
                                  output_sizes=list(r["output_sizes"] or []), is_p2p=bool(r["is_p2p"]), frames=[],
                                  time_created_ns=r["time_created_ns"], timeout_ms=None))
    return dump
