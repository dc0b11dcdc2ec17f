"""A ``hangd-trace/1`` directory -> snapshots, every event checked (``hangd.trace.schema``) and
every file opened as untrusted: inside the trace, a regular file, never a FIFO or a symlink."""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from hangd.evidence import decode_evidence
from hangd.flightrec.reader import Dump
from hangd.flightrec.rows import from_rows
from hangd.redact import filter_environ, redact_cmdline
from hangd.snapshot import (
    Action,
    FdWait,
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
from hangd.trace.redaction import redact_dump, redact_strings
from hangd.trace.schema import (
    FDWAIT_FIELDS,
    FORMAT,
    GPU_FIELDS,
    INFO_FIELDS,
    PROC_FIELDS,
    REMOTE_FIELDS,
    ROW_FIELDS,
    DumpHead,
    DumpRows,
    Meta,
    TraceError,
    check,
    check_event,
    kind_of,
    loads,
)

LOG_TAIL_BYTES = 4096
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_LINE_BYTES = 16 * 1024 * 1024  # one event; a recorded one is a few hundred bytes


class NotRegular(OSError):
    """A FIFO, device, directory or socket where a file was expected."""


def open_regular(path: str | os.PathLike[str]) -> IO[bytes]:
    """Open an untrusted file for reading: never through a symlink, never blocking (a FIFO
    swapped in for the file after a check cannot hang the reader), only a regular file (checked
    on the open descriptor). Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(0, "not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _pick(d: dict[str, Any], allowed: dict[str, Any] | set[str]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k in allowed}


def _thread(th: ThreadStack) -> ThreadStack:
    """A parsed thread with each field of the type it declares (stack files are untrusted too)."""
    th.tid = th.tid if isinstance(th.tid, int) and not isinstance(th.tid, bool) else None
    th.name = th.name if isinstance(th.name, str) else None
    th.active = th.active if isinstance(th.active, bool) else None
    th.owns_gil = th.owns_gil if isinstance(th.owns_gil, bool) else None
    return th


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
        try:
            with open_regular(meta_path) as f:
                meta = loads(f.read(MAX_LINE_BYTES))
        except (FileNotFoundError, NotRegular):
            pass  # no meta.json: the defaults
        except (OSError, ValueError, RecursionError) as e:
            raise TraceError(f"{meta_path}: unreadable meta.json: {str(e)[:200]}") from e
        if not isinstance(meta, dict):
            raise TraceError(f"{meta_path}: meta.json is {kind_of(meta)}, not an object")
        check(Meta, meta, str(meta_path))
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
        try:
            with open_regular(p) as f:
                rows = [loads(line) for line in f.read().splitlines() if line.strip()]
        except (FileNotFoundError, NotRegular):
            return []
        except (OSError, ValueError, RecursionError) as e:
            raise TraceError(f"{p}: unreadable: {str(e)[:200]}") from e
        if not all(isinstance(r, dict) for r in rows):
            raise TraceError(f"{p}: every line must be a JSON object")
        return rows

    def events(self) -> Iterator[dict[str, Any]]:
        """The events in file order; raises TraceError at the first malformed line."""
        try:
            raw_f = open_regular(self.events_path)
        except OSError as e:
            raise TraceError(f"{self.events_path}: {e.strerror or e}") from e
        f: Any = gzip.GzipFile(fileobj=raw_f, mode="rb") if self.events_path.suffix == ".gz" else raw_f
        with raw_f, f:
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
                check_event(ev, where)
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
        if p is None:
            return None
        try:
            with open_regular(p) as f:  # not a FIFO, device, directory or symlink
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
        check(DumpHead, head, f"{where} (head)")
        check(DumpRows, rows, where)
        head, rows = redact_dump(head, [{k: r.get(k) for k in ROW_FIELDS} for r in rows], {})
        return from_rows(rank, head, rows)

    def _log_bytes(self, path: str) -> bytes | None:
        if path not in self._log_cache:
            rel = self._log_map.get(path) or f"files/{os.path.basename(path)}"
            self._log_cache[path] = self._read_bytes(rel)
        return self._log_cache[path]

    def _add(self, snap: Snapshot, ev: dict[str, Any]) -> None:
        kind = ev["kind"]
        if kind == "gpu":
            d = _pick(ev, GPU_FIELDS)
            d["procs"] = [GpuProc(pid=int(p["pid"]), used=p.get("used")) for p in ev.get("procs") or []]
            snap.gpus.append(GpuSample(**d))
        elif kind == "proc":
            d = _pick(ev, PROC_FIELDS)
            if ev.get("fd_waits") is not None:
                d["fd_waits"] = [FdWait(**_pick(w, FDWAIT_FIELDS)) for w in ev["fd_waits"]]
            snap.procs.append(ProcSample(**d))
        elif kind == "proc_info":
            info = ProcInfo(**_pick(ev, INFO_FIELDS))
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
            snap.remote = [RemoteRank(**_pick(r, REMOTE_FIELDS)) for r in ev["ranks"]]
        elif kind == "remote_dumps":
            where = f"{self.events_path} (remote_dumps at t={ev['t']})"
            files: dict[tuple[str, int], Dump] = {}
            memo: dict[str, str] = {}
            dumps = []
            for d in ev["dumps"]:
                key = (d["file"], d["rank"])
                dump = files.get(key) or self._remote_dump_files.get(key) or self._remote_dump(d["file"], d["rank"], where)
                files[key] = dump
                dumps.append(RemoteDump(job=redact_strings(d["job"], memo), node=redact_strings(d["node"], memo),
                                        rank=d["rank"], read_at=float(d["read_at"]),
                                        reported_at=float(d["reported_at"]), dump=dump))
            self._remote_dump_files = files  # only the newest event's: a long trace does not pile them up
            self._remote_dumps = snap.remote_dumps = dumps
