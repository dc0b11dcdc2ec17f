"""Cross-rank analysis of flight-recorder dumps: who is missing from which collective, and which
ranks issued different ops, sizes or dtypes for the same one.

Per process group, entries are aligned on ``collective_seq_id`` (and ``p2p_seq_id`` for p2p).
Only the window every rank still holds is compared, so a ring buffer that dropped old records
gives no false ``missing_rank``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from hangd.flightrec.reader import Dump, Entry

# Ops whose inputs must agree across ranks (all_to_all, gather, scatter and p2p may differ).
SIZE_CHECKED = ("all_reduce", "broadcast", "reduce", "allreduce", "_allgather_base", "all_gather_into_tensor",
                "_reduce_scatter_base", "reduce_scatter_tensor", "all_gather", "reduce_scatter", "barrier")


def _base_op(op: str) -> str:
    return op.split(":", 1)[-1]


def _size_checked(op: str) -> bool:
    b = _base_op(op)
    return any(b == s or b.startswith(s + "_coalesced") for s in SIZE_CHECKED)


class FindingKind(StrEnum):
    """What a cross-rank finding says (``StrEnum``: stored findings keep their strings)."""

    MISSING_RANK = "missing_rank"  # ranks wait in a collective that others never entered
    OP_MISMATCH = "op_mismatch"  # ranks issued different ops at one sequence number
    SIZE_MISMATCH = "size_mismatch"
    DTYPE_MISMATCH = "dtype_mismatch"
    STUCK = "stuck"  # every rank entered the collective and none completed it
    UNREADABLE = "unreadable"  # a dump that could not be decoded
    MISSING_DUMP = "missing_dump"  # ranks of a group whose dumps are not there
    NODE_SILENT = "node_silent"  # a job that spans nodes: a node whose hangd stopped reporting


MISMATCH_KINDS = (FindingKind.OP_MISMATCH, FindingKind.SIZE_MISMATCH, FindingKind.DTYPE_MISMATCH)


@dataclass
class Finding:
    kind: str  # a FindingKind
    pg: str | None
    seq: int | None
    op: str | None
    ranks: list[int] = field(default_factory=list)
    missing_ranks: list[int] = field(default_factory=list)
    ops: dict[int, str] = field(default_factory=dict)
    sizes: dict[int, Any] = field(default_factory=dict)
    dtypes: dict[int, Any] = field(default_factory=dict)
    frames: list[dict[str, Any]] = field(default_factory=list)
    numel: int | None = None
    message: str = ""
    source: str = "file"
    created_ns: int | None = None  # when the entry in question was enqueued (for in-flight checks)
    nodes: dict[int, str] = field(default_factory=dict)  # the ranks on other nodes: rank -> node

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("ops", "sizes", "dtypes", "nodes"):
            d[k] = {str(r): v for r, v in d[k].items()}
        if not d["nodes"]:  # a job on one node: its findings read as they always did
            del d["nodes"]
        return d


class _Names:
    """Ranks in words: a rank on another node says where ("rank 3 on node-b")."""

    def __init__(self, nodes: dict[int, str] | None) -> None:
        self.nodes = nodes or {}

    def one(self, r: int) -> str:
        return f"{r} on {self.nodes[r]}" if r in self.nodes else str(r)

    def ranks(self, ranks: list[int]) -> str:
        """``rank 1``, ``ranks 0, 1``, ``ranks 0, 1 and 3 on node-b``, ``ranks 2, 3 on node-b``."""
        groups: dict[str | None, list[int]] = {}
        for r in ranks:
            groups.setdefault(self.nodes.get(r), []).append(r)
        parts = [", ".join(map(str, rs)) + (f" on {n}" if n is not None else "") for n, rs in groups.items()]
        return f"rank{'s' if len(ranks) > 1 else ''} " + " and ".join(parts)

    def relevant(self, ranks: Any) -> dict[int, str]:
        return {r: self.nodes[r] for r in ranks if r in self.nodes}


def _describe(e: Entry) -> str:
    n = e.numel()
    dt = e.input_dtypes[0].lower() if e.input_dtypes else "?"
    dt = {"float": "float32", "half": "float16", "bfloat16": "bfloat16", "double": "float64"}.get(dt, dt)
    return f"{_base_op(e.op)} #{e.seq} ({n} {dt})" if n is not None else f"{_base_op(e.op)} #{e.seq}"


def analyze(dumps: list[Dump], errors: dict[int | str, str] | None = None,
            nodes: dict[int, str] | None = None) -> list[Finding]:
    """Findings across the ranks of every process group in ``dumps``. ``errors`` are ranks whose
    file could not be read; they become ``unreadable`` findings and the rest is analyzed.
    ``nodes``: the ranks whose dump another node read (rank -> node), named so in the findings."""
    names = _Names(nodes)
    findings: list[Finding] = []
    for who, why in (errors or {}).items():
        findings.append(Finding(kind=FindingKind.UNREADABLE, pg=None, seq=None, op=None,
                                ranks=[who] if isinstance(who, int) else [],
                                message=f"rank {who}: {why}" if isinstance(who, int) else f"{who}: {why}"))
    by_rank = {d.rank: d for d in dumps if d.rank is not None}
    groups: dict[str, set[int]] = {}
    for r, d in by_rank.items():
        for pg, cfg in d.pg_config.items():
            groups.setdefault(pg, set()).add(r)
            for m in cfg.get("ranks") or []:
                if isinstance(m, int):
                    groups[pg].add(m)
        for e in d.entries:
            groups.setdefault(e.pg, set()).add(r)
    for pg in sorted(groups):
        members = sorted(r for r in groups[pg] if r in by_rank)
        if len(members) < 2:
            continue
        findings.extend(_analyze_group(pg, {r: by_rank[r] for r in members}, names))
    return findings


def missing_dumps(dumps: list[Dump], errors: dict[int | str, str] | None = None) -> list[Finding]:
    """Ranks that a group's ``pg_config`` lists but for which no dump was given (nor found
    unreadable): without them the group cannot be compared, whatever the others agree on."""
    by_rank = {d.rank: d for d in dumps if d.rank is not None}
    unreadable = {r for r in (errors or {}) if isinstance(r, int)}
    members: dict[str, set[int]] = {}
    desc: dict[str, Any] = {}
    for d in by_rank.values():
        for pg, cfg in d.pg_config.items():
            members.setdefault(pg, set()).update(r for r in cfg.get("ranks") or [] if isinstance(r, int))
            desc.setdefault(pg, cfg.get("desc"))
    out: list[Finding] = []
    for pg in sorted(members):
        missing = sorted(members[pg] - set(by_rank) - unreadable)
        if not missing:
            continue
        given = sorted(members[pg] & set(by_rank))
        label = f"{pg} ({desc[pg]})" if desc[pg] and desc[pg] != pg else pg
        out.append(Finding(
            kind=FindingKind.MISSING_DUMP, pg=pg, seq=None, op=None, ranks=given, missing_ranks=missing,
            message=(f"pg {label} has {len(members[pg])} ranks; no dump was given for "
                     f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}, so the "
                     f"collectives of rank{'s' if len(given) > 1 else ''} {', '.join(map(str, given))} "
                     "could not be compared with theirs"),
        ))
    return out


def _analyze_group(pg_key: str, dumps: dict[int, Dump], names: _Names | None = None) -> list[Finding]:
    names = names or _Names(None)
    out: list[Finding] = []
    pg = pg_key
    desc = next((d.pg_config[pg_key].get("desc") for d in dumps.values() if pg_key in d.pg_config), None)
    label = f"{pg_key} ({desc})" if desc and desc != pg_key else pg_key
    seqs: dict[int, dict[int, Entry]] = {}
    for r, d in dumps.items():
        seqs[r] = {e.seq: e for e in d.entries if e.pg == pg and not e.is_p2p and e.seq}
    # last enqueued per rank: pg_status when present, else the highest seq recorded
    last: dict[int, int] = {}
    first: dict[int, int] = {}
    for r, d in dumps.items():
        st = d.pg_status.get(pg) or {}
        recorded = max(seqs[r]) if seqs[r] else 0
        last[r] = max(st.get("last_enqueued_collective") or 0, recorded)
        first[r] = min(seqs[r]) if seqs[r] else last[r] + 1
    # Compare only what every rank still holds: older records may have left a ring buffer.
    lo = max(first.values())
    hi = max(last.values())
    reported_missing = False
    # Only sequence numbers some rank recorded can be compared; walking lo..hi instead would let a
    # dump claiming last_enqueued_collective = 2**62 keep this loop busy for ever.
    window = sorted({s for r in dumps for s in seqs[r] if lo <= s <= hi})
    for seq in window:
        have = {r: seqs[r][seq] for r in dumps if seq in seqs[r]}
        ref = have[min(have)]
        never = sorted(r for r in dumps if seq not in seqs[r] and last[r] < seq)
        if never and not reported_missing and not all(e.completed for e in have.values()):
            reported_missing = True
            waiting = sorted(have)
            out.append(Finding(
                kind=FindingKind.MISSING_RANK, pg=pg, seq=seq, op=ref.op, ranks=waiting, missing_ranks=never,
                ops={r: e.op for r, e in have.items()}, sizes={r: e.input_sizes for r, e in have.items()},
                dtypes={r: e.input_dtypes for r, e in have.items()}, frames=ref.frames, numel=ref.numel(),
                created_ns=max((e.time_created_ns or 0) for e in have.values()) or None,
                nodes=names.relevant(dumps),
                message=(f"{names.ranks(never)} never entered "
                         f"{_describe(ref)} in pg {label}; {names.ranks(waiting)} entered it and "
                         f"{'wait' if len(waiting) > 1 else 'waits'}"
                         + "; last enqueued per rank: " + ", ".join(f"{names.one(r)}:{last[r]}" for r in sorted(last))),
            ))
        if len(have) < 2:
            continue
        ops = {r: e.op for r, e in have.items()}
        kwargs: dict[str, Any] = dict(pg=pg, seq=seq, op=ref.op, ranks=sorted(have), ops=ops,
                                      sizes={r: e.input_sizes for r, e in have.items()},
                                      dtypes={r: e.input_dtypes for r, e in have.items()},
                                      frames=ref.frames, numel=ref.numel(), nodes=names.relevant(have))
        if len(set(ops.values())) > 1:
            out.append(Finding(kind=FindingKind.OP_MISMATCH, message=f"ranks issued different ops for seq {seq} in pg {label}: "
                               + ", ".join(f"rank {names.one(r)}: {o}" for r, o in sorted(ops.items())), **kwargs))
            continue
        if _size_checked(ref.op):
            sizes = {r: repr(e.input_sizes) for r, e in have.items()}
            if len(set(sizes.values())) > 1:
                out.append(Finding(kind=FindingKind.SIZE_MISMATCH, message=f"{_base_op(ref.op)} #{seq} in pg {label} has different sizes: "
                                   + ", ".join(f"rank {names.one(r)}: {e.input_sizes}" for r, e in sorted(have.items())),
                                   **kwargs))
        dts = {r: repr(e.input_dtypes) for r, e in have.items()}
        if len(set(dts.values())) > 1:
            out.append(Finding(kind=FindingKind.DTYPE_MISMATCH, message=f"{_base_op(ref.op)} #{seq} in pg {label} has different dtypes: "
                               + ", ".join(f"rank {names.one(r)}: {e.input_dtypes}" for r, e in sorted(have.items())),
                               **kwargs))
    # stuck: every rank enqueued the same seq, none completed it
    for seq in window:
        if not all(seq in seqs[r] for r in dumps):
            continue
        have = {r: seqs[r][seq] for r in dumps}
        if not any(e.completed for e in have.values()):
            ref = next(iter(have.values()))
            out.append(Finding(kind=FindingKind.STUCK, pg=pg, seq=seq, op=ref.op, ranks=sorted(have),
                               ops={r: e.op for r, e in have.items()},
                               sizes={r: e.input_sizes for r, e in have.items()},
                               dtypes={r: e.input_dtypes for r, e in have.items()},
                               frames=ref.frames, numel=ref.numel(),
                               created_ns=max((e.time_created_ns or 0) for e in have.values()) or None,
                               nodes=names.relevant(have),
                               message=f"all ranks entered {_describe(ref)} in pg {label} and none completed it"))
            break
    return out


def summary(dumps: list[Dump], findings: list[Finding]) -> dict[str, Any]:
    """The ``hangd fr analyze --json`` shape."""
    groups: dict[str, dict[str, Any]] = {}
    for d in dumps:
        for pg, cfg in d.pg_config.items():
            g = groups.setdefault(pg, {"pg": pg, "desc": cfg.get("desc"), "ranks": cfg.get("ranks"), "status": {}})
            if d.rank is not None:
                g["status"][str(d.rank)] = d.pg_status.get(pg, {})
    return {
        "ranks": [{"rank": d.rank, "path": d.path, "owner": d.owner, "version": d.version, "encoding": d.encoding,
                   "entries": len(d.entries)} for d in sorted(dumps, key=lambda d: (d.rank is None, d.rank or 0))],
        "groups": list(groups.values()),
        "findings": [f.to_dict() for f in findings],
    }
