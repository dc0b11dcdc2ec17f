"""Shared by the benchmarks: output as a table or one JSON object."""

from __future__ import annotations

import json
import sys
from typing import Any


def emit(result: dict[str, Any], title: str) -> None:
    if "--json" in sys.argv:
        print(json.dumps(result))
        return
    print(title)
    width = max(len(k) for k in result)
    for k, v in result.items():
        if isinstance(v, float):
            v = f"{v:.4g}"
        print(f"  {k:<{width}}  {v}")


def wait_healthy(url: str, timeout_s: float = 60.0) -> bool:
    """Poll ``url``/healthz until it answers 200 (a ``hangd serve`` started by a benchmark)."""
    import time

    import httpx

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return False


def end(proc: Any, sig: int, timeout_s: float = 15.0) -> None:
    """Ask a process started by a benchmark to stop with ``sig``; kill it if it will not."""
    import subprocess

    proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
