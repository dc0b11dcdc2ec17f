"""NCCL's RAS thread (NCCL >= 2.24): every NCCL process answers plain-text queries on
localhost:28028 (or ``NCCL_RAS_ADDR``) without any change to the job.

hangd asks only when a job is already suspected, on a worker thread, with a deadline: with a rank
stopped a query can take over 10 s. The parser is a pure function over the text NCCL returns.
"""

from __future__ import annotations

import socket
import time

from hangd.evidence import RasStatus, parse_ras_text

__all__ = ["DEFAULT_ADDR", "RasStatus", "parse_ras_text", "query", "ras_addr"]

DEFAULT_ADDR = ("127.0.0.1", 28028)
QUERY = b"CLIENT PROTOCOL 2\nTIMEOUT 5\nVERBOSE STATUS\n"


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
