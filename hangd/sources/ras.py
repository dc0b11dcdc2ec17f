"""NCCL's RAS thread (NCCL >= 2.24): every NCCL process answers plain-text queries on
localhost:28028 (or ``NCCL_RAS_ADDR``) without any change to the job.

hangd asks only when a job is already suspected, on a worker thread, with a deadline: with a rank
stopped a query can take over 10 s. The parser is a pure function over the text NCCL returns.
"""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass, field

DEFAULT_ADDR = ("127.0.0.1", 28028)
QUERY = b"CLIENT PROTOCOL 2\nTIMEOUT 5\nVERBOSE STATUS\n"

_LAUNCHED = re.compile(r"Rank (\d+) has launched up to operation (\d+) -- GPU (\d+) managed by process (\d+)")
_MISSING = re.compile(r"Missing communicator data from (\d+) ranks? -- GPU (\d+) managed by process (\d+)")
_STATUS = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([A-Z_]+)\s+([A-Z_]+)?\s*$", re.M)
_OPCOUNT = re.compile(r"different (\w+) operation counts")


@dataclass
class RasStatus:
    version: str | None = None
    groups: list[dict[str, object]] = field(default_factory=list)  # {"group", "status", "errors"}
    launched: list[dict[str, int]] = field(default_factory=list)  # {"rank", "op", "gpu", "pid"}
    op: str | None = None  # the collective whose counts differ (AllReduce, ...)
    missing: list[dict[str, int]] = field(default_factory=list)  # {"ranks", "gpu", "pid"}

    def behind(self) -> list[dict[str, int]]:
        """The ranks that launched fewer operations than the others: the ones the others wait for."""
        if not self.launched:
            return []
        top = max(x["op"] for x in self.launched)
        return [x for x in self.launched if x["op"] < top]

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "groups": self.groups, "launched": self.launched, "op": self.op,
                "missing": self.missing, "behind": self.behind()}


def parse_ras_text(text: str) -> RasStatus:
    st = RasStatus()
    m = re.search(r"NCCL version (\S+)", text)
    st.version = m.group(1) if m else None
    for g in _STATUS.finditer(text):
        st.groups.append({"group": int(g.group(1)), "status": g.group(7), "errors": g.group(8) or ""})
    for m in _LAUNCHED.finditer(text):
        st.launched.append({"rank": int(m.group(1)), "op": int(m.group(2)), "gpu": int(m.group(3)), "pid": int(m.group(4))})
    m = _OPCOUNT.search(text)
    st.op = m.group(1) if m else None
    for m in _MISSING.finditer(text):
        st.missing.append({"ranks": int(m.group(1)), "gpu": int(m.group(2)), "pid": int(m.group(3))})
    return st


def query(addr: tuple[str, int] = DEFAULT_ADDR, deadline_s: float = 15.0) -> str | None:
    """One VERBOSE STATUS query; None when nothing listens (no NCCL >= 2.24 process here)."""
    t_end = time.monotonic() + deadline_s
    try:
        with socket.create_connection(addr, timeout=min(3.0, deadline_s)) as s:
            s.sendall(QUERY)
            chunks = []
            while time.monotonic() < t_end:
                s.settimeout(max(0.1, t_end - time.monotonic()))
                try:
                    b = s.recv(65536)
                except TimeoutError:
                    break
                if not b:
                    break
                chunks.append(b)
            return b"".join(chunks).decode("utf-8", "replace") or None
    except OSError:
        return None


def ras_addr(env: dict[str, str]) -> tuple[str, int]:
    v = env.get("NCCL_RAS_ADDR")
    if v and ":" in v:
        host, _, port = v.rpartition(":")
        if port.isdigit():
            return host.strip("[]") or "127.0.0.1", int(port)
    return DEFAULT_ADDR
