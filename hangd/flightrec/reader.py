"""Read PyTorch flight-recorder dumps of any schema version ("2.1" .. "2.10"), pickle or JSON,
into one normalized shape. Pure functions over bytes, plus a careful file opener."""

from __future__ import annotations

import json
import os
import pwd
import re
import stat
from dataclasses import dataclass, field
from typing import Any

from hangd.flightrec.safepickle import BadPickle, UnsafePickle, safe_loads

MAX_DUMP_BYTES = 64 * 1024 * 1024
_RANK_SUFFIX = re.compile(r"(\d+)$")


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

    def numel(self) -> int | None:
        total = 0
        for shape in self.input_sizes or []:
            n = 1
            for d in shape if isinstance(shape, list | tuple) else [shape]:
                if not isinstance(d, int):
                    return None
                n *= d
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


def _int(v: Any) -> int | None:
    if v is None or isinstance(v, bool):
        return None if v is None else int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v)
    if isinstance(v, str) and re.fullmatch(r"-?\d+", v.strip()):
        return int(v)
    return None


def _ranks(v: Any) -> list[int]:
    if isinstance(v, list | tuple):
        return [int(x) for x in v if _int(x) is not None]
    if isinstance(v, str):
        return [int(x) for x in re.findall(r"-?\d+", v)]
    return []


def _listify(v: Any) -> Any:
    if isinstance(v, tuple | list):
        return [_listify(x) for x in v]
    return v


def _pg_key(name: Any, desc: Any, pg_id: Any) -> str:
    """A group's identity across ranks. Gloo leaves the name empty: fall back to desc, then id."""
    for v in (name, desc):
        if isinstance(v, str) and v:
            return v
    return str(pg_id) if pg_id is not None else "?"


def _entry(e: dict[str, Any], pg_names: dict[str, str]) -> Entry:
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
    state = str(e.get("state") or "")
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
        op=str(e.get("profiling_name") or "?"),
        state=state,
        completed=state == "completed" or retired,
        input_sizes=_listify(e.get("input_sizes") or []),
        input_dtypes=[str(x) for x in e.get("input_dtypes") or []],
        output_sizes=_listify(e.get("output_sizes") or []),
        is_p2p=is_p2p,
        frames=[{"name": f.get("name"), "filename": f.get("filename"), "line": _int(f.get("line"))}
                for f in e.get("frames") or [] if isinstance(f, dict)],
        time_created_ns=_int(e.get("time_created_ns")) or None,
        timeout_ms=_int(e.get("timeout_ms")),
    )


def normalize(raw: Any, rank: int | None, encoding: str) -> Dump:
    if not isinstance(raw, dict):
        raise DumpError("not a flight-recorder dump (top level is not a dict)")
    if "entries" not in raw and "pg_config" not in raw:
        raise DumpError("not a flight-recorder dump (no entries, no pg_config)")
    dump = Dump(rank=rank, version=str(raw.get("version", "?")), encoding=encoding,
                comm_lib_version=raw.get("comm_lib_version") or raw.get("nccl_version"))
    pg_names: dict[str, str] = {}
    statuses = [str(k) for k in (raw.get("pg_status") or {})]
    for pg_id, cfg in (raw.get("pg_config") or {}).items():
        if not isinstance(cfg, dict):
            continue
        if not cfg.get("name") and not str(pg_id) and len(statuses) == 1:
            # Gloo leaves the group's name empty in pg_config; its status and entries use the id
            pg_id = statuses[0]
            key = pg_id
        else:
            key = _pg_key(cfg.get("name"), cfg.get("desc"), pg_id)
        pg_names[str(pg_id)] = key
        dump.pg_config[key] = {"pg_id": str(pg_id), "desc": cfg.get("desc"), "ranks": _ranks(cfg.get("ranks"))}
    for pg_id, st in (raw.get("pg_status") or {}).items():
        if isinstance(st, dict):
            key = pg_names.get(str(pg_id), str(pg_id))
            dump.pg_status[key] = {k: _int(v) for k, v in st.items()}
    for e in raw.get("entries") or []:
        if isinstance(e, dict):
            dump.entries.append(_entry(e, pg_names))
    if rank is None:
        r = raw.get("rank")
        dump.rank = _int(r)
    return dump


def decode(data: bytes, rank: int | None = None) -> Dump:
    """Decode dump bytes: JSON if it looks like JSON, else a restricted pickle."""
    if not data:
        raise DumpError("empty file")
    head = data.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            return normalize(json.loads(data), rank, "json")
        except (ValueError, UnicodeDecodeError) as e:
            raise DumpError(f"bad JSON: {e}") from e
    try:
        return normalize(safe_loads(data), rank, "pickle")
    except UnsafePickle as e:
        raise DumpError(str(e)) from e
    except BadPickle as e:
        raise DumpError(f"not a readable dump: {e}") from e


def rank_from_name(path: str) -> int | None:
    m = _RANK_SUFFIX.search(os.path.basename(path))
    return int(m.group(1)) if m else None


def read_file(path: str, rank: int | None = None, cap: int = MAX_DUMP_BYTES) -> Dump:
    """Open without following symlinks, refuse non-regular and oversized files, report the owner."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise DumpError(f"cannot open: {os.strerror(e.errno) if e.errno else e}"
                        + (" (a symlink; hangd does not follow them)" if e.errno == 40 else "")) from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DumpError("not a regular file")
        if st.st_size > cap:
            raise DumpError(f"{st.st_size} bytes is over the {cap}-byte cap")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(cap + 1)
    finally:
        os.close(fd)
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    dump = decode(data, rank if rank is not None else rank_from_name(path))
    dump.path, dump.owner = path, owner
    return dump
