"""Retention: history older than ``retention_days`` is deleted (hourly, by the daemon); open
incidents are kept whatever their age."""

from __future__ import annotations

import logging
import os
import time
from typing import Any, cast

from sqlalchemy import CursorResult, delete, select
from sqlalchemy.exc import SQLAlchemyError

from hangd.store import models as m
from hangd.store.base import StoreBase

log = logging.getLogger("hangd.store")


class Retention(StoreBase):
    def retention(self, days: float, now: float | None = None) -> int:
        """Delete history older than ``days``; open incidents are kept whatever their age."""
        cutoff = (now or time.time()) - days * 86400
        try:
            with self.Session.begin() as s:
                n = 0
                for stmt in (delete(m.StateChange).where(m.StateChange.t < cutoff),
                             delete(m.GpuMinute).where(m.GpuMinute.minute < int(cutoff // 60)),
                             delete(m.Incident).where(m.Incident.status == "resolved", m.Incident.resolved_at < cutoff),
                             delete(m.Process).where(m.Process.last_seen < cutoff),
                             delete(m.FrEntry).where(m.FrEntry.dump_id.in_(select(m.FrRank.id).where(m.FrRank.read_at < cutoff))),
                             delete(m.FrRank).where(m.FrRank.read_at < cutoff),
                             delete(m.Job).where(m.Job.last_seen < cutoff)):
                    n += cast(CursorResult[Any], s.execute(stmt)).rowcount or 0
            self._rows_stale = True  # the writer reads the rows it remembers again
            return int(n)
        except SQLAlchemyError as e:
            log.error("retention failed: %s", e)
            return 0

    def size_bytes(self) -> int | None:
        if self.engine.dialect.name == "sqlite" and self.engine.url.database:
            p = self.engine.url.database
            return sum(os.path.getsize(x) for x in (p, p + "-wal") if os.path.exists(x))
        return None

