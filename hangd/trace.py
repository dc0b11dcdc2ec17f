"""The ``hangd-trace/1`` format: snapshots to events and back, a writer and a reader.

A trace directory holds ``meta.json``, ``trace.jsonl`` (events sorted by ``t``), optionally
``truth.jsonl``, and ``files/`` with the stack dumps, flight-recorder dumps and logs the events
point to. A reader ignores event kinds and fields it does not know.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    Snapshot,
    StackSample,
)
from hangd.sources.stacks import parse_stack

FORMAT = "hangd-trace/1"
LOG_TAIL_BYTES = 4096
MAX_FILE_BYTES = 64 * 1024 * 1024


class TraceError(Exception):
    """A trace that cannot be read: says which file and why."""


def _fields(cls: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


_GPU_FIELDS = _fields(GpuSample)
_PROC_FIELDS = _fields(ProcSample)
_INFO_FIELDS = _fields(ProcInfo)


def _pick(d: dict[str, Any], allowed: set[str]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k in allowed}


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


# ---------------------------------------------------------------- events -> snapshots


class TraceReader:
    """Reads a trace directory as a stream of snapshots, one per distinct sample time."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.root = Path(path)
        meta_path = self.root / "meta.json"
        events_path = self.root / "trace.jsonl"
        if not events_path.is_file():
            raise TraceError(f"{self.root}: no trace.jsonl (is this a hangd trace directory?)")
        try:
            self.meta: dict[str, Any] = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        except (OSError, ValueError) as e:
            raise TraceError(f"{meta_path}: unreadable meta.json: {e}") from e
        fmt = self.meta.get("format", FORMAT)
        if not str(fmt).startswith("hangd-trace/"):
            raise TraceError(f"{meta_path}: format {fmt!r} is not a hangd trace")
        self.events_path = events_path
        self._log_map: dict[str, str] = dict(self.meta.get("log_files") or {})
        self._log_cache: dict[str, bytes | None] = {}

    def truth(self) -> list[dict[str, Any]]:
        p = self.root / "truth.jsonl"
        if not p.is_file():
            return []
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]

    def events(self) -> Iterator[dict[str, Any]]:
        with self.events_path.open() as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    ev = json.loads(line)
                except ValueError as e:
                    raise TraceError(f"{self.events_path}:{n}: not JSON: {e}") from e
                if isinstance(ev, dict) and "t" in ev and "kind" in ev:
                    yield ev

    def snapshots(self) -> Iterator[Snapshot]:
        cur: Snapshot | None = None
        for ev in self.events():
            t = float(ev["t"])
            if cur is None or abs(t - cur.t) > 0.0005:
                if cur is not None:
                    yield cur
                cur = Snapshot(t=t)
            self._add(cur, ev)
        if cur is not None:
            yield cur

    # -- helpers

    def _file(self, rel: str | None) -> Path | None:
        if not rel:
            return None
        p = (self.root / rel).resolve()
        # A trace is untrusted input: its events may only point inside the trace.
        if self.root.resolve() not in p.parents:
            return None
        return p

    def _read_bytes(self, rel: str | None) -> bytes | None:
        p = self._file(rel)
        if p is None or not p.is_file():
            return None
        with p.open("rb") as f:
            return f.read(MAX_FILE_BYTES)

    def _log_bytes(self, path: str) -> bytes | None:
        if path not in self._log_cache:
            rel = self._log_map.get(path) or f"files/{os.path.basename(path)}"
            self._log_cache[path] = self._read_bytes(rel)
        return self._log_cache[path]

    def _add(self, snap: Snapshot, ev: dict[str, Any]) -> None:
        kind = ev["kind"]
        if kind == "gpu":
            d = _pick(ev, _GPU_FIELDS)
            d["procs"] = [GpuProc(pid=int(p["pid"]), used=p.get("used")) for p in ev.get("procs") or []]
            snap.gpus.append(GpuSample(**d))
        elif kind == "proc":
            snap.procs.append(ProcSample(**_pick(ev, _PROC_FIELDS)))
        elif kind == "proc_info":
            info = ProcInfo(**_pick(ev, _INFO_FIELDS))
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
                st.threads = parse_stack(raw, fmt)
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
        self.files.mkdir(parents=True, exist_ok=True)
        self.meta: dict[str, Any] = {"format": FORMAT, **(meta or {})}
        self._out = (self.root / "trace.jsonl").open("w")
        self._n = 0
        self._t_start: float | None = None
        self._t_end: float | None = None
        self._logs: dict[str, str] = {}
        self._ranks: dict[str, int] = {}
        self._gpus: dict[int, dict[str, Any]] = {}

    def _emit(self, ev: dict[str, Any]) -> None:
        self._out.write(json.dumps(ev, separators=(",", ":")) + "\n")

    def _save(self, name: str, data: bytes) -> str:
        self._n += 1
        rel = f"files/{self._n:06d}_{name}"
        (self.root / rel).write_bytes(data)
        return rel

    def write(self, snap: Snapshot) -> None:
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
            for fd in ("1", "2"):
                target = (info.fds or {}).get(fd)
                if target and target.startswith("/") and target not in self._logs:
                    self._logs[target] = ""
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
