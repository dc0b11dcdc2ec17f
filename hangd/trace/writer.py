"""Snapshots -> a ``hangd-trace/1`` directory: ``meta.json``, ``trace.jsonl`` and ``files/``."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from hangd.flightrec.reader import Dump
from hangd.flightrec.rows import to_rows
from hangd.redact import redact_cmdline, redact_obj, redact_text
from hangd.snapshot import RemoteDump, Snapshot
from hangd.trace.redaction import copy_redacted, redact_dump, redact_strings
from hangd.trace.schema import FORMAT, TraceError


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


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
                head, rows = redact_dump(*to_rows(d.dump), memo)
                try:
                    text = json.dumps({"head": head, "entries": rows}, separators=(",", ":"), allow_nan=False)
                except (TypeError, ValueError):  # a set or NaN no reader would take: that dump is left out
                    continue
                rel = self._save(f"remote_fr_rank_{d.rank}.json", text.encode())
            files[key] = rel
            items.append({"job": redact_strings(d.job, memo), "node": redact_strings(d.node, memo), "rank": d.rank,
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
