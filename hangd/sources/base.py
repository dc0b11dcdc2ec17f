"""The small interface every source implements, and the runner that isolates their failures.

Like node_exporter's collectors: each source is timed, a source that cannot read (no driver, no
permission) says ``unavailable: <why>`` with a ``HINT:`` and the others go on; a source that breaks
unexpectedly is logged and counted, never allowed to stop the loop. A source going unavailable is
logged once at warning, and again only when its reason changes or it reads again: a node without
GPUs must be loud once, not every tick.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

from hangd.snapshot import Snapshot

log = logging.getLogger("hangd.sources")


class Unavailable(Exception):
    """A source that cannot read on this node; ``hint`` says what the operator can do."""

    def __init__(self, why: str, hint: str = "") -> None:
        super().__init__(why)
        self.why = why
        self.hint = hint

    def __str__(self) -> str:
        return f"unavailable: {self.why}" + (f" {self.hint}" if self.hint else "")


class Disabled:
    """A source turned off by a setting: it still says so on every snapshot, so "turned off" is
    never mistaken for "nothing there"."""

    def __init__(self, name: str, why: str, hint: str = "") -> None:
        self.name = name
        self.why = why
        self.hint = hint

    def collect(self, snap: Snapshot) -> None:
        raise Unavailable(self.why, self.hint)


class Source(Protocol):
    name: str

    def collect(self, snap: Snapshot) -> None:
        """Add what this source sees now to ``snap``; raise Unavailable if it cannot read."""


@dataclass
class CollectorStats:
    success: bool = True
    duration_s: float = 0.0
    error: str | None = None
    failures_total: int = 0
    disabled: bool = False  # turned off by a setting: not reading, on purpose


@dataclass
class SourceRunner:
    """Runs sources in order into one snapshot, timing each and isolating failures."""

    sources: list[Source]
    stats: dict[str, CollectorStats] = field(default_factory=dict)

    def collect(self, t: float | None = None) -> Snapshot:
        snap = Snapshot(t=t if t is not None else time.time())
        for src in self.sources:
            st = self.stats.setdefault(src.name, CollectorStats(disabled=isinstance(src, Disabled)))
            t0 = time.perf_counter()
            try:
                src.collect(snap)
                if st.error is not None:
                    log.warning("source %s reads again", src.name)
                st.success, st.error = True, None
            except Unavailable as e:
                if st.error != str(e):
                    log.warning("source %s %s", src.name, e)
                st.success, st.error = False, str(e)
                snap.unavailable[src.name] = str(e)
            except Exception as e:  # a broken source must never stop the loop
                log.exception("source %s failed", src.name)
                st.success, st.error = False, f"error: {type(e).__name__}: {e}"
                st.failures_total += 1
                snap.unavailable[src.name] = st.error
            st.duration_s = time.perf_counter() - t0
        return snap
