"""Stacks of Python processes through py-spy, and pure parsers of its two output formats.

``py-spy dump --nonblocking`` reads the target's memory without stopping it (~10-16 ms); with
``--native`` it must pause the target to walk native frames (0.3-1.3 s), so hangd asks for native
frames only for processes already judged stuck.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

from hangd.snapshot import Frame, Snapshot, StackSample, ThreadStack
from hangd.sources.base import Unavailable

PTRACE_HINT = "HINT: run as root or grant CAP_SYS_PTRACE"

_THREAD_RE = re.compile(r"^Thread (?P<tid>0x[0-9a-fA-F]+|\d+) \((?P<status>[^)]*)\)(?::\s*\"(?P<name>.*)\")?")
_FRAME_RE = re.compile(r"^\s+(?P<name>.+?) \((?P<where>[^()]*)\)\s*$")
_PYLOC_RE = re.compile(r"^(?P<file>.+):(?P<line>\d+)$")
# a library's file, by its full path: the stdlib or an installed package (py-spy's short name drops
# the sys.path entry it lies under, the job's own directory as well as site-packages)
LIBRARY_PATH = re.compile(r"/(site-packages|dist-packages)/|/lib/python3[.\d]*/|^<")


def parse_pyspy_json(raw: str) -> list[ThreadStack]:
    """Threads from ``py-spy dump --json``; frames innermost first. Raises ValueError on bad input."""
    data = json.loads(raw)
    if not isinstance(data, list):
        raise ValueError("py-spy JSON is not a list of threads")
    threads = []
    for th in data:
        if not isinstance(th, dict):
            continue
        frames = [
            Frame(
                name=str(f.get("name", "?")),
                filename=str(f.get("short_filename") or f.get("filename") or "?"),
                line=f.get("line") if isinstance(f.get("line"), int) else None,
                library=bool(LIBRARY_PATH.search(str(f.get("filename") or ""))),
            )
            for f in th.get("frames") or []
            if isinstance(f, dict)
        ]
        threads.append(
            ThreadStack(
                tid=th.get("os_thread_id") or th.get("thread_id"),
                name=th.get("thread_name"),
                active=th.get("active"),
                owns_gil=th.get("owns_gil"),
                frames=frames,
            )
        )
    return threads


def parse_pyspy_text(raw: str) -> list[ThreadStack]:
    """Threads from ``py-spy dump`` text output (with or without ``--native``)."""
    threads: list[ThreadStack] = []
    cur: ThreadStack | None = None
    for line in raw.splitlines():
        m = _THREAD_RE.match(line)
        if m:
            tid_s = m.group("tid")
            status = m.group("status")
            cur = ThreadStack(
                tid=int(tid_s, 16) if tid_s.startswith("0x") else int(tid_s),
                name=m.group("name"),
                active="active" in status,
                owns_gil="gil" in status,
                frames=[],
            )
            threads.append(cur)
            continue
        if cur is None:
            continue
        fm = _FRAME_RE.match(line)
        if not fm:
            continue
        name, where = fm.group("name"), fm.group("where")
        loc = _PYLOC_RE.match(where)
        if loc and (loc.group("file").endswith(".py") or loc.group("file").startswith("<")):
            cur.frames.append(Frame(name=name, filename=loc.group("file"), line=int(loc.group("line"))))
        else:
            cur.frames.append(Frame(name=name, filename=where, native=True))
    return threads


def parse_stack(raw: str, fmt: str) -> list[ThreadStack]:
    """Parse either format; a dump that does not parse gives no threads."""
    try:
        return parse_pyspy_json(raw) if fmt.endswith("json") else parse_pyspy_text(raw)
    except (ValueError, TypeError):
        return []


def find_pyspy() -> str | None:
    """py-spy beside this Python (a virtualenv), on PATH, or where pip installed it into a folder on
    sys.path (``pip install --target DIR`` puts its record in DIR and the program in DIR/bin). Only
    a folder holding pip's record of py-spy is trusted: never a ``bin`` of the working directory."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("py-spy")
    if found:
        return found
    for d in sys.path:
        if d and os.path.isabs(d) and glob.glob(os.path.join(glob.escape(d), "py_spy-*.dist-info")):
            cand = os.path.join(d, "bin", "py-spy")
            if os.access(cand, os.X_OK):
                return cand
    return None


class StackSource:
    """Takes py-spy dumps of given processes on request (never on every tick)."""

    name = "stacks"

    SEARCH_EVERY_S = 10.0  # looking again for a missing py-spy stats PATH: not on every tick (NFS)

    def __init__(self, timeout_s: float = 5.0, pyspy: str | None = None) -> None:
        self.timeout_s = timeout_s
        self.pyspy = pyspy or find_pyspy()
        self._searched = time.monotonic()
        self.last_error: str | None = None  # of the newest captures, set by the node that takes them

    def check(self) -> None:
        if not self.pyspy and time.monotonic() - self._searched >= self.SEARCH_EVERY_S:
            self.pyspy = find_pyspy()  # installed since: found without a restart
            self._searched = time.monotonic()
        if not self.pyspy:
            raise Unavailable("py-spy not found: without stacks a rank blocked in a collective cannot be told "
                              "from an idle one, and host-side hangs go unseen",
                              "HINT: pip install py-spy (hangd depends on it) where hangd runs, or put it on PATH")

    def collect(self, snap: Snapshot) -> None:
        """Every tick: say when stacks cannot be taken, as the other sources say they cannot read
        (/readyz, ``hangd status``, hangd_collector_success), and that the newest captures failed
        (ptrace refused) until captures work again. Dumps are taken on request only."""
        self.check()
        if self.last_error is not None:
            raise Unavailable(f"the last stack capture failed: {self.last_error}")

    def dump(self, pid: int, native: bool = False) -> StackSample:
        """One dump. ``native`` pauses the target while it walks native frames: only for
        processes already judged stuck. Errors come back in ``StackSample.error``."""
        self.check()
        assert self.pyspy is not None
        cmd = [self.pyspy, "dump", "--pid", str(pid)]
        if native:
            cmd.append("--native")
            fmt = "py-spy-text"
        else:
            cmd += ["--json", "--nonblocking"]
            fmt = "py-spy-json"
        t0 = time.monotonic()
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return StackSample(pid=pid, native=native, format=fmt, seconds=self.timeout_s,
                               error=f"py-spy took over {self.timeout_s:.0f} s")
        seconds = round(time.monotonic() - t0, 4)
        if out.returncode != 0:
            err = (out.stderr or out.stdout).strip().splitlines()
            msg = err[-1] if err else f"py-spy exit {out.returncode}"
            low = (out.stderr or "").lower()
            if "permission" in low or "not permitted" in low:
                msg = f"{msg}; {PTRACE_HINT}"
            return StackSample(pid=pid, native=native, format=fmt, seconds=seconds, error=msg)
        return StackSample(pid=pid, native=native, format=fmt, seconds=seconds, raw=out.stdout,
                           threads=parse_stack(out.stdout, fmt))
