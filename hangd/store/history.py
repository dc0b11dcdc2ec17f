"""The history tables: the state timeline (every state change of a process, as the analysis
reported it, redacted) and the GPUs' history, one row per GPU per minute (``gpu_minutes``: the
means of that minute's readings, written once the minute is over)."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Table, insert, select
from sqlalchemy.orm import Session

from hangd.analysis import gpuminutes
from hangd.redact import redact_text
from hangd.store import models as m
from hangd.store.base import StoreBase

STATE_CHANGES = cast(Table, m.StateChange.__table__)


class History(StoreBase):
    # (gpu index, minute) -> the readings of that minute so far (the writer thread's)
    _gpu_acc: dict[tuple[int, int], list[gpuminutes.Reading]]

    def _write_changes(self, s: Session, changes: list[dict[str, Any]]) -> None:
        s.execute(insert(STATE_CHANGES), [
            {"node_id": self.node_id, "t": c["t"], "pid": c["pid"], "rank": c.get("rank"), "job": c.get("job"),
             "state": c["state"], "reason": redact_text(c["reason"])} for c in changes])

    def _gpu_minutes(self, s: Session, gpus: list[dict[str, Any]], t: float) -> None:
        """Downsample GPU readings to one row per GPU per minute (written when the minute ends)."""
        minute = int(t // 60)
        for g in gpus:
            self._gpu_acc.setdefault((g["index"], minute), []).append(gpuminutes.reading(g))
        for (idx, mn) in [k for k in self._gpu_acc if k[1] < minute]:
            means = gpuminutes.minute_means(self._gpu_acc.pop((idx, mn)))
            exists = s.scalar(select(m.GpuMinute.id).where(m.GpuMinute.node_id == self.node_id,
                                                           m.GpuMinute.gpu_index == idx, m.GpuMinute.minute == mn))
            if exists is None:
                s.add(m.GpuMinute(node_id=self.node_id, gpu_index=idx, minute=mn, **means))

    def timeline(self, pid: int | None = None, since: float | None = None, limit: int = 500) -> list[dict[str, Any]]:
        q = select(m.StateChange)
        if pid is not None:
            q = q.where(m.StateChange.pid == pid)
        if since is not None:
            q = q.where(m.StateChange.t >= since)
        with self.Session() as s:
            rows = s.scalars(q.order_by(m.StateChange.t.desc()).limit(limit))
            return [{"t": r.t, "pid": r.pid, "rank": r.rank, "job": r.job, "state": r.state, "reason": r.reason}
                    for r in rows][::-1]


    def gpu_history(self, since: float, index: int | None = None, limit: int = 100_000) -> list[dict[str, Any]]:
        """This node's GPU history from ``since`` (Unix seconds) on, oldest first per GPU: one row
        per GPU and minute over, ``t`` its start, the means of its readings (None: not read).
        The minute under way is not in it yet."""
        q = select(m.GpuMinute).where(m.GpuMinute.node_id == self.node_id, m.GpuMinute.minute >= int(since // 60))
        if index is not None:
            q = q.where(m.GpuMinute.gpu_index == index)
        with self.Session() as s:
            rows = s.scalars(q.order_by(m.GpuMinute.gpu_index, m.GpuMinute.minute).limit(limit))
            return [{"gpu": r.gpu_index, "t": r.minute * 60, "util": r.util, "sm": r.sm, "power_w": r.power_w,
                     "mem_used": r.mem_used} for r in rows]
