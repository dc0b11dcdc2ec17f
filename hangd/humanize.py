"""Words and times for people: local ISO-8601 times, "N s ago", a command line worth reading,
and what to say when the GPUs cannot be seen. Pure functions, shared by status, watch and replay."""

from __future__ import annotations

import os
import re
from datetime import datetime

# the interpreter is not what a person recognises a process by: its script or module is
_INTERPRETER = re.compile(r"^(python[0-9.]*|pypy[0-9.]*)$")
# launchers whose own name matters (they are the command), when started as `python .../torchrun`
_LAUNCHERS = {"torchrun", "accelerate", "deepspeed", "vllm", "sglang"}


def iso_local(t: float | None) -> str:
    """Unix seconds -> ISO-8601 in the local time zone, to the second (``-`` when unknown)."""
    if t is None:
        return "-"
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def iso_field(t: float | None) -> str | None:
    """The ``*_iso`` field next to a Unix-seconds number in JSON: local time with its offset, so it
    is both readable and exact; None when the number is None."""
    if t is None:
        return None
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="milliseconds")


def ago(t: float | None, now: float) -> str:
    """How long before ``now`` ``t`` was, in the largest unit that reads well: ``41 s ago``."""
    if t is None:
        return "-"
    s = int(round(now - t))
    if s < 0:
        return f"in {-s} s"
    if s < 120:
        return f"{s} s ago"
    if s < 7200:
        return f"{s // 60} min ago"
    if s < 172800:
        return f"{s // 3600} h {(s % 3600) // 60} min ago"
    return f"{s // 86400} days ago"


def when(t: float | None, now: float) -> str:
    """``2026-11-30T13:40:01+01:00 (41 s ago)``."""
    return f"{iso_local(t)} ({ago(t, now)})" if t is not None else "-"


def command_line(cmdline: list[str] | None) -> str:
    """The script or module a process runs and its arguments, without the interpreter's path:
    ``['/root/.pyenv/versions/3.11.7/bin/python', '-m', 'sglang.launch_server', '--tp', '2']`` ->
    ``-m sglang.launch_server --tp 2``; ``python /usr/bin/torchrun train.py`` -> ``torchrun train.py``.
    Empty when unknown (a kernel thread, a process gone)."""
    if not cmdline:
        return ""
    args = list(cmdline)
    exe = os.path.basename(args[0])
    if _INTERPRETER.match(exe) and len(args) > 1:
        args = args[1:]
        # interpreter options before the script or -m/-c (-u, -X dev, -W ignore, ...)
        while args and args[0].startswith("-") and args[0] not in ("-m", "-c"):
            takes_value = args[0] in ("-X", "-W", "-Q")
            args = args[2:] if takes_value else args[1:]
        if not args:
            return exe
        if args[0] not in ("-m", "-c"):
            args[0] = os.path.basename(args[0]) if os.path.basename(args[0]) in _LAUNCHERS else \
                _short_path(args[0])
    else:
        args[0] = exe
    return " ".join(args)


def _short_path(p: str) -> str:
    """A script path as a person would type it: the file name, with its folder when that helps
    (``examples/train.py`` rather than ``/home/u/src/proj/examples/train.py``)."""
    parts = p.split("/")
    return "/".join(parts[-2:]) if len(parts) > 2 else p


def unavailable_why(value: str) -> str:
    """A source's ``unavailable: <why> HINT: ...`` without the prefix."""
    return value.removeprefix("unavailable: ")


def gpus_unseen(unavailable: dict[str, str] | None) -> str | None:
    """Why the GPUs cannot be seen (NVML missing, broken or turned off), with its HINT; None
    when NVML reads. The one sentence status, watch, serve and /readyz all use."""
    why = (unavailable or {}).get("nvml")
    if why is None:
        return None
    return f"GPUs cannot be seen: {unavailable_why(why)}"
