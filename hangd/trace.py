"""The ``hangd-trace/1`` format: snapshots to events and back, a writer and a reader.

A trace directory holds ``meta.json``, ``trace.jsonl`` (events sorted by ``t``), optionally
``truth.jsonl``, and ``files/`` with the stack dumps, flight-recorder dumps and logs the events
point to. A reader ignores event kinds and fields it does not know.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import types
import typing
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union

from hangd.evidence import decode_evidence
from hangd.flightrec.reader import Dump
from hangd.flightrec.rows import from_rows, to_rows
from hangd.redact import filter_environ, redact_cmdline, redact_obj, redact_text
from hangd.snapshot import (
    Action,
    FileSample,
    FrDump,
    GpuProc,
    GpuSample,
    ProcInfo,
    ProcSample,
    RasReport,
    RemoteDump,
    RemoteRank,
    Snapshot,
    StackSample,
    ThreadStack,
)
from hangd.sources.stacks import parse_stack

FORMAT = "hangd-trace/1"
LOG_TAIL_BYTES = 4096
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_LINE_BYTES = 16 * 1024 * 1024  # one event; a recorded one is a few hundred bytes
MAX_INT = 2**63 - 1  # what a database column holds


class TraceError(Exception):
    """A trace that cannot be read (missing, malformed, mistyped): says which file, line and why."""


# A trace is untrusted input (attached to a bug, fetched from another host): every value is
# checked against the type its record declares before it reaches the analysis, so a malformed
# trace fails here, in one place, as a TraceError, never later as a TypeError deep in a detector.

def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a number a trace may hold")


def loads(text: str | bytes) -> Any:
    """``json.loads`` that refuses NaN and Infinity. A number that overflows (``1e999``) still
    parses to infinity: the field checks below refuse it wherever it lands."""
    return _DECODER.decode(text.decode("utf-8") if isinstance(text, bytes) else text)


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def _finite_json(v: Any, depth: int = 0) -> bool:
    if type(v) is float:
        return math.isfinite(v)
    if type(v) is list:
        return depth < 64 and all(_finite_json(x, depth + 1) for x in v)
    if type(v) is dict:
        return depth < 64 and all(_finite_json(x, depth + 1) for x in v.values())
    return True


Check = typing.Callable[[Any], bool]


def _is_int(v: Any) -> bool:
    return type(v) is int and -MAX_INT <= v <= MAX_INT


def _is_float(v: Any) -> bool:
    return (type(v) is float or type(v) is int) and math.isfinite(v)


def _compile(hint: Any) -> Check:
    """A fast predicate: whether a JSON value fits a (resolved) type hint of a snapshot record."""
    if hint is Any:
        return _finite_json
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        checks = [_compile(h) for h in args if h is not type(None)]
        nullable = type(None) in args
        if len(checks) == 1:
            one = checks[0]
            return (lambda v: v is None or one(v)) if nullable else one
        return lambda v: (nullable and v is None) or any(c(v) for c in checks)
    if hint is type(None):
        return lambda v: v is None
    if hint is bool:
        return lambda v: type(v) is bool
    if hint is int:
        return _is_int
    if hint is float:
        return _is_float
    if hint is str:
        return lambda v: type(v) is str
    if origin is list:
        item = _compile((typing.get_args(hint) or (Any,))[0])
        return lambda v: type(v) is list and all(item(x) for x in v)
    if origin is dict:
        kh, vh = typing.get_args(hint) or (Any, Any)
        kc, vc = _compile(kh), _compile(vh)
        return lambda v: type(v) is dict and all(kc(a) and vc(b) for a, b in v.items())
    raise TypeError(f"no check for {hint!r}")


_CHECKS: dict[Any, Check] = {}


def _conforms(v: Any, hint: Any) -> bool:
    c = _CHECKS.get(hint)
    if c is None:
        c = _CHECKS[hint] = _compile(hint)
    return c(v)


def _hints(cls: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name not in skip}


def _required(cls: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


_GPU_HINTS = _hints(GpuSample, skip=("procs",))
_PROC_HINTS = _hints(ProcSample)
_INFO_HINTS = _hints(ProcInfo)
_GPUPROC_HINTS = _hints(GpuProc)
_REMOTE_HINTS = _hints(RemoteRank)
_REMOTE_REQUIRED = _required(RemoteRank) - {"rank", "state", "reason", "waits", "last_progress"}
# the fields of the other event kinds, as the format (tests/data/traces/FORMAT.md) defines them
_EVENT_HINTS: dict[str, dict[str, Any]] = {
    "file": {"path": str, "size": int | None},
    "stack": {"pid": int, "tool": str, "native": bool | None, "format": str, "seconds": float | None,
              "file": str | None, "error": str | None},
    "fr_dump": {"pid": int | None, "rank": int | None, "format": str, "file": str | None, "source": str},
    "nccl_ras": {"format": str, "file": str | None},
    "action": {"what": str, "pid": int | None},
    "unavailable": {"source": str, "why": str},
    "remote": {"node": str | None, "ranks": list[dict[str, Any]]},
    "remote_dumps": {"dumps": list[dict[str, Any]]},
}
_EVENT_REQUIRED: dict[str, set[str]] = {
    "gpu": _required(GpuSample), "proc": _required(ProcSample), "proc_info": _required(ProcInfo),
    "file": {"path"}, "stack": {"pid"}, "fr_dump": set(), "nccl_ras": set(), "action": {"what"},
    "unavailable": {"source", "why"},
    "remote": {"ranks"},
    "remote_dumps": {"dumps"},
}
# one item of a remote_dumps event, and the file it names: a dump in the rows a shared store keeps
# (hangd.flightrec.rows), checked against the types hangd.flightrec.reader.normalize gives them
_RDUMP_HINTS: dict[str, Any] = {"job": str, "node": str, "rank": int, "read_at": float, "reported_at": float,
                                "file": str}
_RDUMP_HEAD_HINTS: dict[str, Any] = {"version": str | None, "pg_config": dict[str, dict[str, Any]] | None,
                                     "pg_status": dict[str, dict[str, int | None]] | None, "entries": int | None}
_RDUMP_PG_HINTS: dict[str, Any] = {"pg_id": str | int | None, "desc": str | None, "ranks": list[int] | None}
_RDUMP_ROW_HINTS: dict[str, Any] = {
    "pg": str, "pg_id": int | None, "seq": int | None, "p2p_seq": int | None, "op": str, "state": str,
    "completed": bool, "is_p2p": bool, "input_sizes": list[Any] | None, "input_dtypes": list[str] | None,
    "output_sizes": list[Any] | None, "time_created_ns": int | None,
}
_RDUMP_ROW_REQUIRED = {"pg", "op", "state", "completed", "is_p2p"}
_META_HINTS: dict[str, Any] = {
    "format": str, "t_start": float | None, "t_end": float | None, "log_files": dict[str, str] | None,
    "ranks": dict[str, int] | None, "world_size": int | None, "gpus": list[dict[str, Any]] | None,
    "sample_hz": float | None,
}


_COMPILED: dict[int, dict[str, Check]] = {}


def _check_fields(d: dict[str, Any], hints: dict[str, Any], required: set[str], where: str) -> None:
    for k in required:
        if d.get(k) is None:
            raise TraceError(f"{where}: missing field {k!r}")
    checks = _COMPILED.get(id(hints))
    if checks is None:
        checks = _COMPILED[id(hints)] = {k: _compile(h) for k, h in hints.items()}
    for k, v in d.items():
        c = checks.get(k)
        if c is not None and not c(v):
            raise TraceError(f"{where}: field {k!r} is {_kind_of(v)}, not {_hint_name(hints[k])}")


def _kind_of(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _hint_name(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("NoneType", "null")


def _pick(d: dict[str, Any], allowed: dict[str, Any] | set[str]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k in allowed}


def _thread(th: ThreadStack) -> ThreadStack:
    """A parsed thread with each field of the type it declares (stack files are untrusted too)."""
    th.tid = th.tid if isinstance(th.tid, int) and not isinstance(th.tid, bool) else None
    th.name = th.name if isinstance(th.name, str) else None
    th.active = th.active if isinstance(th.active, bool) else None
    th.owns_gil = th.owns_gil if isinstance(th.owns_gil, bool) else None
    return th


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _is_shape(v: Any, depth: int = 0) -> bool:
    """A tensor shape as the flight-recorder reader normalizes it: nested lists of numbers a
    64-bit counter holds (or names), so that it can be printed and compared."""
    if type(v) is list:
        if depth >= 16:
            return False
        for x in v:  # a loop, not all(): a dump has thousands of shapes, mostly of ints
            if type(x) is int:
                if not -MAX_INT <= x <= MAX_INT:
                    return False
            elif not _is_shape(x, depth + 1):
                return False
        return True
    return v is None or type(v) in (str, bool) or _is_int(v) or (type(v) is float and math.isfinite(v))


def _redact_strings(v: Any, memo: dict[str, str]) -> Any:
    """Every string of a JSON value through ``redact_text``, dict keys included: a dump's group
    names are keys of its pg_config and values of its entries, and must stay equal. Unlike
    ``redact_obj`` no value is replaced by its key's name: a group called "auth" keeps its shape.
    ``memo``: a dump repeats the same few names thousands of times."""
    if isinstance(v, str):
        out = memo.get(v)
        if out is None:
            out = memo[v] = redact_text(v)
        return out
    if isinstance(v, dict):
        return {_redact_strings(k, memo): _redact_strings(x, memo) for k, x in v.items()}
    if isinstance(v, list):
        return [_redact_strings(x, memo) for x in v]
    return v


def _has_text(v: Any) -> bool:
    if type(v) is list:
        return any(type(x) is not int and _has_text(x) for x in v)
    return isinstance(v, str)


def _redact_dump(head: dict[str, Any], rows: list[dict[str, Any]], memo: dict[str, str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A dump's rows (``hangd.flightrec.rows``) with every string through ``redact_text``: the
    same as ``_redact_strings`` over all of it, walking only the fields that hold text (a dump
    has up to a thousand rows, each mostly numbers)."""
    out = []
    for r in rows:
        r = dict(r)
        for k in ("pg", "op", "state"):
            if isinstance(r.get(k), str):
                r[k] = _redact_strings(r[k], memo)
        dtypes = r.get("input_dtypes")
        if type(dtypes) is list:
            r["input_dtypes"] = [_redact_strings(x, memo) for x in dtypes]
        for k in ("input_sizes", "output_sizes"):
            if _has_text(r.get(k)):
                r[k] = _redact_strings(r[k], memo)
        out.append(r)
    return _redact_strings(head, memo), out


# ---------------------------------------------------------------- events -> snapshots


def events_file(root: Path) -> Path | None:
    """The trace's events: ``trace.jsonl``, or ``trace.jsonl.gz`` (gzip; committed traces are
    kept compressed, they shrink about 40 times)."""
    for name in ("trace.jsonl", "trace.jsonl.gz"):
        if (root / name).is_file():
            return root / name
    return None


class TraceReader:
    """Reads a trace directory as a stream of snapshots, one per distinct sample time."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.root = Path(path)
        meta_path = self.root / "meta.json"
        events_path = events_file(self.root)
        if events_path is None:
            raise TraceError(f"{self.root}: no trace.jsonl (is this a hangd trace directory?)")
        meta: Any = {}
        if meta_path.is_file():
            try:
                with meta_path.open("rb") as f:
                    meta = loads(f.read(MAX_LINE_BYTES))
            except (OSError, ValueError, RecursionError) as e:
                raise TraceError(f"{meta_path}: unreadable meta.json: {str(e)[:200]}") from e
        if not isinstance(meta, dict):
            raise TraceError(f"{meta_path}: meta.json is {_kind_of(meta)}, not an object")
        _check_fields(meta, _META_HINTS, set(), str(meta_path))
        self.meta: dict[str, Any] = meta
        fmt = self.meta.get("format", FORMAT)
        if not fmt.startswith("hangd-trace/"):
            raise TraceError(f"{meta_path}: format {fmt!r} is not a hangd trace")
        self.events_path = events_path
        self._log_map: dict[str, str] = dict(self.meta.get("log_files") or {})
        self._log_cache: dict[str, bytes | None] = {}
        self._remote_dumps: list[RemoteDump] | None = None
        self._remote_dump_files: dict[tuple[str, int], Dump] = {}

    def truth(self) -> list[dict[str, Any]]:
        p = self.root / "truth.jsonl"
        if not p.is_file():
            return []
        try:
            rows = [loads(line) for line in p.read_bytes().splitlines() if line.strip()]
        except (OSError, ValueError, RecursionError) as e:
            raise TraceError(f"{p}: unreadable: {str(e)[:200]}") from e
        if not all(isinstance(r, dict) for r in rows):
            raise TraceError(f"{p}: every line must be a JSON object")
        return rows

    def events(self) -> Iterator[dict[str, Any]]:
        """The events in file order; raises TraceError at the first malformed line."""
        try:
            f = gzip.open(self.events_path, "rb") if self.events_path.suffix == ".gz" else self.events_path.open("rb")
        except OSError as e:
            raise TraceError(f"{self.events_path}: {e.strerror}") from e
        with f:
            n = 0
            while True:
                n += 1
                try:
                    raw = f.readline(MAX_LINE_BYTES + 1)
                except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as e:
                    raise TraceError(f"{self.events_path}:{n}: {getattr(e, 'strerror', None) or str(e)[:200]}") from e
                if not raw:
                    return
                if len(raw) > MAX_LINE_BYTES:
                    raise TraceError(f"{self.events_path}:{n}: line longer than {MAX_LINE_BYTES} bytes")
                where = f"{self.events_path}:{n}"
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError as e:
                    raise TraceError(f"{where}: not UTF-8 (byte {e.start})") from e
                if not line:
                    continue
                try:
                    ev = loads(line)
                except RecursionError as e:
                    raise TraceError(f"{where}: JSON nested too deeply") from e
                except ValueError as e:
                    raise TraceError(f"{where}: not JSON: {str(e)[:200]}") from e
                if not isinstance(ev, dict):
                    raise TraceError(f"{where}: an event is a JSON object, not {_kind_of(ev)}")
                t, kind = ev.get("t"), ev.get("kind")
                if not _conforms(t, float) or float(t) < 0:  # type: ignore[arg-type]
                    raise TraceError(f"{where}: 't' must be a finite number of seconds, not {_kind_of(t)} {str(t)[:40]}")
                if not isinstance(kind, str):
                    raise TraceError(f"{where}: 'kind' must be a string, not {_kind_of(kind)}")
                if kind in _EVENT_REQUIRED:
                    hints = {"gpu": _GPU_HINTS, "proc": _PROC_HINTS, "proc_info": _INFO_HINTS}.get(kind) \
                        or _EVENT_HINTS[kind]
                    _check_fields(ev, hints, _EVENT_REQUIRED[kind], f"{where} ({kind})")
                    if kind == "gpu":
                        procs = ev.get("procs")
                        if procs is not None and not (isinstance(procs, list) and all(isinstance(p, dict) for p in procs)):
                            raise TraceError(f"{where} (gpu): 'procs' must be a list of objects")
                        for p in procs or []:
                            _check_fields(p, _GPUPROC_HINTS, {"pid"}, f"{where} (gpu procs)")
                    if kind == "remote":
                        if not all(isinstance(r, dict) for r in ev["ranks"]):
                            raise TraceError(f"{where} (remote): 'ranks' must be a list of objects")
                        for r in ev["ranks"]:
                            _check_fields(r, _REMOTE_HINTS, _REMOTE_REQUIRED, f"{where} (remote ranks)")
                    if kind == "remote_dumps":
                        if not all(isinstance(d, dict) for d in ev["dumps"]):
                            raise TraceError(f"{where} (remote_dumps): 'dumps' must be a list of objects")
                        for d in ev["dumps"]:
                            _check_fields(d, _RDUMP_HINTS, set(_RDUMP_HINTS), f"{where} (remote_dumps)")
                yield ev

    def snapshots(self) -> Iterator[Snapshot]:
        # the other nodes' dumps hold until the next remote_dumps event: the writer writes one
        # only when they change, and every snapshot of the live node had them
        self._remote_dumps, self._remote_dump_files = None, {}
        cur: Snapshot | None = None
        for ev in self.events():
            t = float(ev["t"])
            if cur is None or abs(t - cur.t) > 0.0005:
                if cur is not None:
                    yield decode_evidence(cur)
                cur = Snapshot(t=t)
                if self._remote_dumps is not None:
                    cur.remote_dumps = list(self._remote_dumps)
            self._add(cur, ev)
        if cur is not None:
            yield decode_evidence(cur)

    def check(self) -> int:
        """Read the whole trace once; returns the number of snapshots or raises TraceError."""
        return sum(1 for _ in self.snapshots())

    # -- helpers

    def _file(self, rel: str | None) -> Path | None:
        if not rel or not isinstance(rel, str) or "\0" in rel:
            return None
        p = (self.root / rel).resolve()
        # A trace is untrusted input: its events may only point inside the trace.
        if self.root.resolve() not in p.parents:
            return None
        return p

    def _read_bytes(self, rel: str | None) -> bytes | None:
        p = self._file(rel)
        try:
            if p is None or not p.is_file():  # not a FIFO, device or directory
                return None
            with p.open("rb") as f:
                return f.read(MAX_FILE_BYTES)
        except OSError:
            return None

    def _remote_dump(self, rel: str, rank: int, where: str) -> Dump:
        """A dump another node wrote, from the file a remote_dumps event names: the rows
        ``hangd.flightrec.rows.to_rows`` gives (``{"head": ..., "entries": [...]}``), each field
        checked, every string redacted, rebuilt with ``from_rows``."""
        where = f"{where}: {rel[:200]}"
        data = self._read_bytes(rel)
        if data is None:
            raise TraceError(f"{where}: missing, unreadable or outside the trace")
        try:
            doc = loads(data)
        except RecursionError as e:
            raise TraceError(f"{where}: JSON nested too deeply") from e
        except (ValueError, UnicodeDecodeError) as e:
            raise TraceError(f"{where}: not JSON: {str(e)[:200]}") from e
        if not isinstance(doc, dict) or not isinstance(doc.get("head"), dict) or not isinstance(doc.get("entries"), list):
            raise TraceError(f"{where}: a remote dump is an object with 'head' (an object) and 'entries' (a list)")
        head, rows = doc["head"], doc["entries"]
        _check_fields(head, _RDUMP_HEAD_HINTS, set(), f"{where} (head)")
        for cfg in (head.get("pg_config") or {}).values():
            _check_fields(cfg, _RDUMP_PG_HINTS, set(), f"{where} (head pg_config)")
        for i, r in enumerate(rows):
            if not isinstance(r, dict):
                raise TraceError(f"{where}: entry {i} is {_kind_of(r)}, not an object")
            _check_fields(r, _RDUMP_ROW_HINTS, _RDUMP_ROW_REQUIRED, f"{where} (entry {i})")
            for k in ("input_sizes", "output_sizes"):
                if not _is_shape(r.get(k)):
                    raise TraceError(f"{where} (entry {i}): field {k!r} is not a list of shapes of 64-bit sizes")
        head, rows = _redact_dump(head, [{k: r.get(k) for k in _RDUMP_ROW_HINTS} for r in rows], {})
        return from_rows(rank, head, rows)

    def _log_bytes(self, path: str) -> bytes | None:
        if path not in self._log_cache:
            rel = self._log_map.get(path) or f"files/{os.path.basename(path)}"
            self._log_cache[path] = self._read_bytes(rel)
        return self._log_cache[path]

    def _add(self, snap: Snapshot, ev: dict[str, Any]) -> None:
        kind = ev["kind"]
        if kind == "gpu":
            d = _pick(ev, _GPU_HINTS)
            d["procs"] = [GpuProc(pid=int(p["pid"]), used=p.get("used")) for p in ev.get("procs") or []]
            snap.gpus.append(GpuSample(**d))
        elif kind == "proc":
            snap.procs.append(ProcSample(**_pick(ev, _PROC_HINTS)))
        elif kind == "proc_info":
            info = ProcInfo(**_pick(ev, _INFO_HINTS))
            # a replayed trace is a source like any other: secrets are dropped where data enters
            if isinstance(info.environ, dict):
                info.environ = filter_environ({str(k): str(v) for k, v in info.environ.items()})
            if isinstance(info.cmdline, list):
                info.cmdline = redact_cmdline(str(a) for a in info.cmdline)
            snap.infos.append(info)
        elif kind == "file":
            size = ev.get("size")
            tail = None
            data = self._log_bytes(ev["path"])
            if data is not None and isinstance(size, int):
                tail = data[max(0, size - LOG_TAIL_BYTES) : size].decode("utf-8", "replace")
            snap.files.append(FileSample(path=ev["path"], size=size, tail=tail))
        elif kind == "stack":
            data = self._read_bytes(ev.get("file"))
            raw = data.decode("utf-8", "replace") if data is not None else ""
            fmt = ev.get("format", "py-spy-json")
            st = StackSample(
                pid=int(ev["pid"]),
                tool=ev.get("tool", "py-spy"),
                native=bool(ev.get("native")),
                format=fmt,
                seconds=ev.get("seconds"),
                raw=raw,
                error=ev.get("error") if data is not None else (ev.get("error") or "file missing"),
            )
            if data is not None:
                try:
                    st.threads = [_thread(th) for th in parse_stack(raw, fmt)]
                except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
                    st.threads, st.error = [], f"unparseable stack dump: {str(e)[:100]}"
            snap.stacks.append(st)
        elif kind == "fr_dump":
            snap.fr_dumps.append(
                FrDump(
                    pid=ev.get("pid"),
                    rank=ev.get("rank"),
                    format=ev.get("format", "torch-fr-pickle"),
                    path=str(ev.get("file")),
                    data=self._read_bytes(ev.get("file")),
                    source=ev.get("source", "file"),
                )
            )
        elif kind == "nccl_ras":
            data = self._read_bytes(ev.get("file"))
            snap.ras.append(RasReport(format=ev.get("format", "text"), text=(data or b"").decode("utf-8", "replace")))
        elif kind == "action":
            snap.actions.append(Action(what=str(ev.get("what")), pid=ev.get("pid")))
        elif kind == "unavailable":
            snap.unavailable[str(ev.get("source"))] = str(ev.get("why"))
        elif kind == "remote":
            # what other nodes reported of the jobs that span nodes, as the live daemon read it
            snap.node = ev.get("node")
            snap.remote = [RemoteRank(**_pick(r, _REMOTE_HINTS)) for r in ev["ranks"]]
        elif kind == "remote_dumps":
            where = f"{self.events_path} (remote_dumps at t={ev['t']})"
            files: dict[tuple[str, int], Dump] = {}
            memo: dict[str, str] = {}
            dumps = []
            for d in ev["dumps"]:
                key = (d["file"], d["rank"])
                dump = files.get(key) or self._remote_dump_files.get(key) or self._remote_dump(d["file"], d["rank"], where)
                files[key] = dump
                dumps.append(RemoteDump(job=_redact_strings(d["job"], memo), node=_redact_strings(d["node"], memo),
                                        rank=d["rank"], read_at=float(d["read_at"]),
                                        reported_at=float(d["reported_at"]), dump=dump))
            self._remote_dump_files = files  # only the newest event's: a long trace does not pile them up
            self._remote_dumps = snap.remote_dumps = dumps


# ---------------------------------------------------------------- snapshots -> events


def redact_line_same_size(line: bytes) -> bytes:
    """One log line through ``redact_text``, padded with spaces or cut to its original length.
    ``file`` events give log sizes as byte offsets into the copy, so every line keeps its size;
    text that is not UTF-8 passes through as it was (surrogateescape)."""
    body = line.rstrip(b"\r\n")
    end = line[len(body):]
    out = redact_text(body.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
    if out == body:
        return line
    return out[: len(body)].ljust(len(body), b" ") + end


def copy_redacted(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Copy a log for a recording, every line redacted, every byte offset kept."""
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        for line in fi:
            fo.write(redact_line_same_size(line))


class TraceWriter:
    """Writes snapshots as a trace directory. Close it to write ``meta.json`` and the logs."""

    def __init__(self, path: str | os.PathLike[str], meta: dict[str, Any] | None = None) -> None:
        self.root = Path(path)
        self.files = self.root / "files"
        try:
            self.files.mkdir(parents=True, exist_ok=True)
            self._out = (self.root / "trace.jsonl").open("w")
        except OSError as e:
            raise TraceError(f"{self.root}: cannot write a trace here: {e.strerror}") from e
        self.meta: dict[str, Any] = {"format": FORMAT, **(meta or {})}
        self._n = 0
        self._t_start: float | None = None
        self._t_end: float | None = None
        self._logs: dict[str, str] = {}
        self._ranks: dict[str, int] = {}
        self._gpus: dict[int, dict[str, Any]] = {}
        # the remote dumps last written: what each was (job, node, rank, read_at, reported_at),
        # and the file that holds each dump (a dump is its job, node, rank and read_at)
        self._remote_dumps: list[tuple[str, str, int, float, float]] | None = None
        self._remote_dump_files: dict[tuple[str, str, int, float], str] = {}

    def _emit(self, ev: dict[str, Any]) -> None:
        self._out.write(json.dumps(ev, separators=(",", ":")) + "\n")

    def _save(self, name: str, data: bytes) -> str:
        self._n += 1
        rel = f"files/{self._n:06d}_{name}"
        (self.root / rel).write_bytes(data)
        return rel

    def write(self, snap: Snapshot) -> None:
        try:
            self._write(snap)
        except OSError as e:  # disk full, directory removed: the recording cannot go on
            raise TraceError(f"{self.root}: writing the trace failed: {e.strerror}") from e

    def _write(self, snap: Snapshot) -> None:
        t = round(snap.t, 3)
        if self._t_start is None:
            self._t_start = t
        self._t_end = t
        for g in snap.gpus:
            d = _clean(dataclasses.asdict(g))
            d["procs"] = [_clean(p) for p in d.get("procs", [])]
            if g.uuid:
                self._gpus[g.index] = {"index": g.index, "uuid": g.uuid, "name": g.name}
            self._emit({"t": t, "kind": "gpu", **d})
        for info in snap.infos:
            # sources redact where data enters; a recording is shared in bug reports, so again here
            d = redact_obj(_clean(dataclasses.asdict(info)))
            if isinstance(info.cmdline, list):
                d["cmdline"] = redact_cmdline(str(a) for a in info.cmdline)
            rank = (info.environ or {}).get("RANK")
            if rank is not None and rank.isdigit():
                self._ranks[rank] = info.pid
            for target in info.log_files():
                self._logs.setdefault(target, "")
            self._emit({"t": t, "kind": "proc_info", **d})
        for p in snap.procs:
            d = _clean(dataclasses.asdict(p))
            if not p.gone:
                d.pop("gone", None)
            self._emit({"t": t, "kind": "proc", **d})
        for f in snap.files:
            self._emit({"t": t, "kind": "file", "path": f.path, "size": f.size})
        for s in snap.stacks:
            ext = "json" if s.format.endswith("json") else "txt"
            rel = self._save(f"stack_{s.pid}.{ext}", s.raw.encode())  # frames and file names, no values
            ev = {"t": t, "kind": "stack", "pid": s.pid, "tool": s.tool, "native": s.native,
                  "format": s.format, "seconds": s.seconds, "file": rel}
            if s.error:
                ev["error"] = s.error
            self._emit(ev)
        for fr in snap.fr_dumps:
            rel = self._save(f"fr_rank_{fr.rank}", fr.data or b"")
            self._emit({"t": t, "kind": "fr_dump", "pid": fr.pid, "rank": fr.rank,
                        "format": fr.format, "file": rel, "source": fr.source})
        for r in snap.ras:
            rel = self._save("nccl_ras." + ("json" if r.format == "json" else "txt"), r.text.encode())
            self._emit({"t": t, "kind": "nccl_ras", "format": r.format, "file": rel})
        for a in snap.actions:
            self._emit({"t": t, "kind": "action", "what": a.what, "pid": a.pid})
        for source, why in snap.unavailable.items():
            self._emit({"t": t, "kind": "unavailable", "source": source, "why": redact_text(why)})
        if snap.remote is not None:
            self._emit({"t": t, "kind": "remote", "node": snap.node,
                        "ranks": [redact_obj(_clean(dataclasses.asdict(r))) for r in snap.remote]})
        if snap.remote_dumps is not None:
            self._write_remote_dumps(t, [d for d in snap.remote_dumps if isinstance(d.dump, Dump)])

    def _write_remote_dumps(self, t: float, dumps: list[RemoteDump]) -> None:
        """The other nodes' flight-recorder dumps, only when they changed since the last event:
        a dump is a few hundred kB and changes when its node reads a newer one, while its
        node's heartbeat (``reported_at``) moves every few seconds. Each dump goes to a file of
        its own once; an event names the files of all of them (a reader keeps the newest event)."""
        now = [(d.job, d.node, d.rank, d.read_at, d.reported_at) for d in dumps]
        if now == self._remote_dumps:
            return
        files: dict[tuple[str, str, int, float], str] = {}
        items = []
        memo: dict[str, str] = {}
        for d in dumps:
            key = (d.job, d.node, d.rank, d.read_at)
            rel = files.get(key) or self._remote_dump_files.get(key)
            if rel is None:
                head, rows = _redact_dump(*to_rows(d.dump), memo)
                try:
                    text = json.dumps({"head": head, "entries": rows}, separators=(",", ":"), allow_nan=False)
                except (TypeError, ValueError):  # a set or NaN no reader would take: that dump is left out
                    continue
                rel = self._save(f"remote_fr_rank_{d.rank}.json", text.encode())
            files[key] = rel
            items.append({"job": _redact_strings(d.job, memo), "node": _redact_strings(d.node, memo), "rank": d.rank,
                          "read_at": d.read_at, "reported_at": d.reported_at, "file": rel})
        self._remote_dumps, self._remote_dump_files = now, files
        self._emit({"t": t, "kind": "remote_dumps", "dumps": items})

    def close(self) -> None:
        self._out.close()
        log_files: dict[str, str] = {}
        for i, path in enumerate(sorted(self._logs)):
            rel = f"files/log_{i}_{os.path.basename(path)}"
            try:
                copy_redacted(path, self.root / rel)
                log_files[path] = rel
            except OSError:
                continue
        self.meta.update(
            {
                "t_start": self._t_start,
                "t_end": self._t_end,
                "ranks": self._ranks,
                "world_size": len(self._ranks) or None,
                "gpus": [self._gpus[i] for i in sorted(self._gpus)],
                "log_files": log_files,
            }
        )
        (self.root / "meta.json").write_text(json.dumps(self.meta, indent=1) + "\n")

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
