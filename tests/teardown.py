"""Tearing down a job that a test or a recording script started. Only the tests and the scripts
signal jobs; hangd itself never does."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable

import psutil


def kill_all(pids: Iterable[int], launcher: subprocess.Popen) -> None:
    """Tear a job down now: every pid and its descendants (a rank's DataLoader worker blocked for
    good does not notice its rank die), a stopped one resumed first so that it dies at once; then
    the launcher's process group (it was started in a session of its own), and reap the launcher."""
    pids = sorted(set(pids))
    descendants: list[int] = []
    for pid in pids:
        try:
            descendants += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            pass
    for pid in pids + descendants:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    try:
        os.killpg(launcher.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    launcher.wait()
