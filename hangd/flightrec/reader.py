"""Read PyTorch flight-recorder dumps of any schema version ("2.1" .. "2.10"), pickle or JSON,
into one normalized shape. Pure functions over bytes, plus a careful file opener."""

from __future__ import annotations

import json
import math
import os
import pwd
import re
from dataclasses import dataclass, field
from typing import Any

from hangd.flightrec.safepickle import (
    BadPickle,
    UnsafePickle,
    check_tree,
    max_nodes_for,
    safe_loads,
)
from hangd.safefile import NotRegularFile, TooLarge, read_regular

MAX_DUMP_BYTES = 64 * 1024 * 1024
_RANK_SUFFIX = re.compile(r"(\d+)$")
_NUMBER = re.compile(r"-?\d+")


class DumpError(ValueError):
    """A dump that cannot be read, with the reason a person can act on."""


@dataclass(slots=True)
class Entry:
    record_id: int | None
    pg: str
    pg_id: int | None
    seq: int | None  # collective_seq_id (0/None for p2p)
    p2p_seq: int | None
    op: str
    state: str
    completed: bool
    input_sizes: list[Any]
    input_dtypes: list[str]
    output_sizes: list[Any]
    is_p2p: bool
    frames: list[dict[str, Any]]
    time_created_ns: int | None
    timeout_ms: int | None
    # when its watchdog saw it complete (torch >= 2.3 records it; None before, or not completed)
    time_completed_ns: int | None = None

    def numel(self) -> int | None:
        total = 0
        for shape in self.input_sizes or []:
            n = 1
            for d in shape if isinstance(shape, list | tuple) else [shape]:
                if not isinstance(d, int):
                    return None
                n *= d
                if abs(n) >= INT64:  # no tensor is that large: a hostile shape, not a count
                    return None
            total += n
        return total if self.input_sizes else None


@dataclass(slots=True)
class Dump:
    rank: int | None
    version: str
    encoding: str  # "pickle" or "json"
    path: str | None = None
    owner: str | None = None
    pg_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    pg_status: dict[str, dict[str, int | None]] = field(default_factory=dict)
    entries: list[Entry] = field(default_factory=list)
    comm_lib_version: str | None = None


INT64 = 2**63


def _int(v: Any) -> int | None:
    """A whole number from an int, float or digit string; None for anything else. A number no
    64-bit counter can hold (inf, NaN, 1e999, a 5000-digit int) is a hostile dump: DumpError."""
    if v is None:
        return None
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise DumpError(f"{v!r} is not a finite number; a flight-recorder dump holds counters")
        v = int(v)
    elif isinstance(v, str):
        v = v.strip()
        if not _NUMBER.fullmatch(v):
            return None
        if len(v) > 21:  # int() of a 5000-digit string raises ValueError
            raise DumpError("a number beyond 64 bits; a flight-recorder dump holds 64-bit counters")
        v = int(v)
    if not isinstance(v, int):
        return None
    if not -INT64 <= v < INT64:
        raise DumpError("a number beyond 64 bits; a flight-recorder dump holds 64-bit counters")
    return v


def _str(v: Any, default: str = "?") -> str:
    """Text for a name field; other types (a list, a huge int) become ``default``."""
    if isinstance(v, str):
        return v
    if isinstance(v, int | float) and not isinstance(v, bool):
        _int(v)  # a 5000-digit int cannot even be printed; inf and NaN are refused like counters
        return repr(v)
    return default


def _opt_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _dict(v: Any) -> dict[Any, Any]:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list[Any] | tuple[Any, ...]:
    return v if isinstance(v, list | tuple) else []


def _ranks(v: Any) -> list[int]:
    if isinstance(v, list | tuple):
        return [r for r in (_int(x) for x in v) if r is not None]
    if isinstance(v, str):
        return [r for r in (_int(x) for x in _NUMBER.findall(v)) if r is not None]
    return []


def _listify(v: Any) -> Any:
    """Tuples become lists (pickle and JSON then compare equal); numbers are range-checked so a
    shape can be printed and compared."""
    if isinstance(v, tuple | list):
        return [_listify(x) for x in v]
    if isinstance(v, int | float) and not isinstance(v, bool):
        _int(v)
    if v is not None and not isinstance(v, str | int | float):
        return None  # bytes, a set, a dict: no shape holds one, and a JSON column refuses bytes and sets
    return v


def _pg_key(name: Any, desc: Any, pg_id: Any) -> str:
    """A group's identity across ranks. Gloo leaves the name empty: fall back to desc, then id."""
    for v in (name, desc):
        if isinstance(v, str) and v:
            return v
    return str(pg_id) if pg_id is not None else "?"


def _entry(e: dict[Any, Any], pg_names: dict[str, str]) -> Entry:
    pg = e.get("process_group")
    name = desc = None
    if isinstance(pg, list | tuple) and pg:
        name = pg[0]
        desc = pg[1] if len(pg) > 1 else None
    elif isinstance(pg, str):
        name = pg
    pg_id = _int(e.get("pg_id"))
    key = _pg_key(name, desc, pg_id)
    if not name and pg_id is not None and str(pg_id) in pg_names:
        key = pg_names[str(pg_id)]
    state = _str(e.get("state"), "")
    retired = bool(e.get("retired"))
    seq = _int(e.get("collective_seq_id", e.get("seq_id")))
    p2p = _int(e.get("p2p_seq_id"))
    is_p2p = bool(e.get("is_p2p")) or (seq in (None, 0) and bool(p2p))
    return Entry(
        record_id=_int(e.get("record_id")),
        pg=key,
        pg_id=pg_id,
        seq=seq,
        p2p_seq=p2p,
        op=_str(e.get("profiling_name")) or "?",
        state=state,
        completed=state == "completed" or retired,
        input_sizes=_listify(_list(e.get("input_sizes"))),
        input_dtypes=[_str(x) for x in _list(e.get("input_dtypes"))],
        output_sizes=_listify(_list(e.get("output_sizes"))),
        is_p2p=is_p2p,
        frames=[{"name": _opt_str(f.get("name")), "filename": _opt_str(f.get("filename")), "line": _int(f.get("line"))}
                for f in _list(e.get("frames")) if isinstance(f, dict)],
        time_created_ns=_int(e.get("time_created_ns")) or None,
        timeout_ms=_int(e.get("timeout_ms")),
        time_completed_ns=_int(e.get("time_discovered_completed_ns")) or None,
    )


def normalize(raw: Any, rank: int | None, encoding: str) -> Dump:
    """One shape for every schema version. Fields of the wrong type are dropped (a list where a
    name belongs reads as ``?``); numbers no counter can hold raise DumpError."""
    if not isinstance(raw, dict):
        raise DumpError("not a flight-recorder dump (top level is not a dict)")
    if "entries" not in raw and "pg_config" not in raw:
        raise DumpError("not a flight-recorder dump (no entries, no pg_config)")
    dump = Dump(rank=rank, version=_str(raw.get("version")), encoding=encoding,
                comm_lib_version=_opt_str(raw.get("comm_lib_version") or raw.get("nccl_version")))
    pg_names: dict[str, str] = {}
    statuses = [_str(k) for k in _dict(raw.get("pg_status"))]
    for pg_id, cfg in _dict(raw.get("pg_config")).items():
        if not isinstance(cfg, dict):
            continue
        pg_id = _str(pg_id)
        if not cfg.get("name") and not pg_id and len(statuses) == 1:
            # Gloo leaves the group's name empty in pg_config; its status and entries use the id
            pg_id = statuses[0]
            key = pg_id
        else:
            key = _pg_key(cfg.get("name"), cfg.get("desc"), pg_id)
        pg_names[pg_id] = key
        dump.pg_config[key] = {"pg_id": pg_id, "desc": _opt_str(cfg.get("desc")), "ranks": _ranks(cfg.get("ranks"))}
    for pg_id, st in _dict(raw.get("pg_status")).items():
        if isinstance(st, dict):
            key = pg_names.get(_str(pg_id), _str(pg_id))
            dump.pg_status[key] = {_str(k): _int(v) for k, v in st.items()}
    for e in _list(raw.get("entries")):
        if isinstance(e, dict):
            dump.entries.append(_entry(e, pg_names))
    if rank is None:
        dump.rank = _int(raw.get("rank"))
    return dump


def _refuse_constant(name: str) -> Any:
    raise DumpError(f"{name} is not a number a flight-recorder dump holds")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):  # 1e999 parses as inf
        raise DumpError(f"{text[:40]} is not a finite number")
    return v


def _load_json(data: bytes) -> Any:
    try:
        value = json.loads(data, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError as e:
        raise DumpError("bad JSON: nested too deep for a flight-recorder dump") from e
    except (ValueError, UnicodeDecodeError) as e:  # DumpError is a ValueError: keep its words
        raise DumpError(str(e) if isinstance(e, DumpError) else f"bad JSON: {e}") from e
    try:
        check_tree(value, max_nodes=max_nodes_for(len(data)))
    except BadPickle as e:
        raise DumpError(f"bad JSON: {e}") from e
    return value


def decode(data: bytes, rank: int | None = None, cap: int = MAX_DUMP_BYTES) -> Dump:
    """Decode dump bytes: JSON if it looks like JSON, else a restricted pickle. Every way a dump
    can be wrong (hostile, truncated, too large, too deep, out-of-range numbers) is a DumpError."""
    if not data:
        raise DumpError("empty file")
    if len(data) > cap:
        raise DumpError(f"{len(data)} bytes is over the {cap}-byte cap")
    head = data.lstrip()[:1]
    if head in (b"{", b"["):
        return normalize(_load_json(data), rank, "json")
    try:
        raw = safe_loads(data, max_bytes=cap)
    except UnsafePickle as e:
        raise DumpError(str(e)) from e
    except BadPickle as e:
        raise DumpError(f"not a readable dump: {e}") from e
    return normalize(raw, rank, "pickle")


def rank_from_name(path: str) -> int | None:
    m = _RANK_SUFFIX.search(os.path.basename(path))
    return int(m.group(1)) if m else None


def read_file(path: str, rank: int | None = None, cap: int = MAX_DUMP_BYTES) -> Dump:
    """Open without following symlinks, refuse non-regular and oversized files, report the owner."""
    try:
        data, st = read_regular(path, cap)
    except (NotRegularFile, TooLarge) as e:
        raise DumpError(str(e)) from e
    except OSError as e:
        raise DumpError(f"cannot open: {os.strerror(e.errno) if e.errno else e}"
                        + (" (a symlink; hangd does not follow them)" if e.errno == 40 else "")) from e
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    dump = decode(data, rank if rank is not None else rank_from_name(path), cap)
    dump.path, dump.owner = path, owner
    return dump
