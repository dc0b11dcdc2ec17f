"""/proc's files parsed: each reader takes a path or the bytes read and returns the values, or
None when the file vanished, was denied or is malformed (absent, not an error). No state: the
``ProcSource`` (procfs.py) decides what to read and when.
"""

from __future__ import annotations

import os
import re

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


# A read shorter than this of a file rendered as one record (stat, status, io) is the whole file.
_PAGE = 4096


def _read_bytes(path: str, small: bool = False) -> bytes | None:
    """One /proc file, whole, with plain os calls (the hot path: several files per process per
    tick). A short read is not the end: some kernels (sandboxed ones among them) hand a seq_file
    such as ``maps`` or ``net/tcp`` out a page at a time, so the reads go on until one says "end".
    ``small``: the file is one record well under a page (stat, status, io), which every kernel
    hands out in one read, so a read of less than a page is all of it and the read that would say
    "end" is saved (three per process per tick)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # vanished, denied, zombie: absent, not an error
        return None
    try:
        b = os.read(fd, 65536)
        if not b or (small and len(b) < _PAGE):
            return b
        chunks = [b]
        while True:
            b = os.read(fd, 65536)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read(path: str) -> str | None:
    b = _read_bytes(path)
    return b.decode("utf-8", "replace") if b is not None else None


def _stat_fields(b: bytes) -> tuple[bytes, list[bytes]] | None:
    """(comm, the fields after it) of a /proc/PID/stat read as bytes; None if malformed. The one
    parser of the file; the hot path (``read_sample``) takes the fields as they are: no text
    decoding, no dict."""
    lp, rp = b.find(b"("), b.rfind(b")")
    if lp < 0 or rp < 0:
        return None
    rest = b[rp + 2 :].split()
    if len(rest) < 22:
        return None
    return b[lp + 1 : rp], rest


def parse_stat(text: str | bytes) -> dict[str, object] | None:
    """Fields of /proc/PID/stat that hangd uses; None if malformed."""
    f = _stat_fields(text.encode() if isinstance(text, str) else text)
    if f is None:
        return None
    comm, rest = f
    return {
        "comm": comm.decode("utf-8", "replace"),
        "state": rest[0].decode(),
        "ppid": int(rest[1]),
        "utime": int(rest[11]),
        "stime": int(rest[12]),
        "threads": int(rest[17]),
        "starttime_ticks": int(rest[19]),
        "rss_bytes": int(rest[21]) * PAGE_SIZE,
    }


def _status_field(b: bytes, key: bytes) -> int | None:
    """The number after ``key`` (b"\\nVmSwap:") in /proc/PID/status, found without splitting the
    file into its ~55 lines."""
    i = b.find(key)
    if i < 0:
        return None
    j = b.find(b"\n", i + len(key))
    v = b[i + len(key) : j if j >= 0 else None].split()
    return int(v[0]) if v and v[0].isdigit() else None


def _parse_io(b: bytes) -> dict[str, int]:
    out = {}
    for line in b.split(b"\n"):
        k, sep, v = line.partition(b":")
        v = v.strip()
        if sep and v.isdigit():
            out[k.decode()] = int(v)
    return out


def parse_kv(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep:
            out[k.strip()] = v.strip()
    return out


def parse_environ(raw: bytes) -> dict[str, str]:
    env = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k:
            env[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return env


_SLURM_RE = re.compile(r"job_(\d+)")
_POD_RE = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER_RE = re.compile(r"([0-9a-f]{64})")


def describe_cgroup(text: str) -> str | None:
    """A short name for the cgroup: ``slurm:<job>``, ``k8s-pod:<uid>``, ``container:<id12>``, or
    the cgroup path."""
    path = ""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2]:
            path = parts[2]
            if parts[0] == "0":
                break
    if not path:
        return None
    if m := _SLURM_RE.search(path):
        return f"slurm:{m.group(1)}"
    if m := _POD_RE.search(path):
        return f"k8s-pod:{m.group(1).replace('_', '-')}"
    if m := _CONTAINER_RE.search(path):
        return f"container:{m.group(1)[:12]}"
    return path
