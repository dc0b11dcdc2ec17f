"""Hardware causes: what the GPUs of a job's ranks reported (XID errors, clock-event (throttle)
reasons, ECC errors and row remapping), said in an incident on the GPU that reported it.

The meanings are data (``hardware.toml``). Everything here reads GPU readings of snapshots (fed
through ``HardwareLog``) and the node view; nothing reads NVML, nothing decides an incident: a hang
or a straggler is found on its own evidence, and this adds what the hardware said meanwhile.
"""

from __future__ import annotations

import math
import tomllib
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from hangd.snapshot import GpuSample, Snapshot

XID_LOOKBACK_S = 300.0  # an XID this long before a rank stopped progressing may be why
KEEP_S = 900.0  # how long XIDs and which GPU each process used are remembered
MAX_PIDS = 4096  # ... and for at most this many processes (a node that starts jobs all day)
THROTTLED_FRACTION = 0.1  # throttled in at least this share of the readings: worth saying
SEVERITIES = ("fatal", "error", "warning", "info", "unknown")


@dataclass(frozen=True, slots=True)
class Xid:
    code: int
    meaning: str
    severity: str
    cause: str
    note: str | None = None


@dataclass(frozen=True, slots=True)
class XidSeen:
    t: float
    gpu: int
    uuid: str | None
    xid: int


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    return tomllib.loads(resources.files("hangd.analysis").joinpath("hardware.toml").read_text())


def xid(code: int) -> Xid:
    """What an XID code means (NVIDIA's catalog), or that hangd's table does not know it."""
    d = _data()["xid"].get(str(code))
    if d is None:
        return Xid(code, "not in hangd's XID table", "unknown", "unknown")
    return Xid(code, d["meaning"], d["severity"], d["cause"], d.get("note"))


def clock_event_words(name: str) -> str:
    d = _data()["clock_event"].get(name)
    return d["words"] if d else name


def clock_event_names() -> list[str]:
    return list(_data()["clock_event"])


def throttle_reasons(names: list[str] | None) -> list[str]:
    """The clock-event reasons that slow the GPU down for power or heat."""
    table = _data()["clock_event"]
    return [n for n in names or [] if table.get(n, {}).get("throttle")]


class HardwareLog:
    """The XIDs the GPUs reported and which GPU each process used, for ``KEEP_S``: a GPU that fell
    off the bus has no readings (and no processes) after it, yet its XID explains the hang."""

    def __init__(self, keep_s: float = KEEP_S) -> None:
        self.keep_s = keep_s
        self.xids: deque[XidSeen] = deque(maxlen=1024)
        self.totals: dict[tuple[int, str, int], int] = {}  # (gpu, uuid, xid) -> events since start
        self.pid_gpus: dict[int, dict[int, float]] = {}  # pid -> {gpu index: last seen on it}
        self.uuids: dict[int, str] = {}
        self._pruned = 0.0

    def feed(self, snap: Snapshot) -> None:
        t = snap.t
        for g in snap.gpus:
            if g.uuid:
                self.uuids[g.index] = g.uuid
            for p in g.procs:
                self.pid_gpus.setdefault(p.pid, {})[g.index] = t
            for e in g.xid or []:
                code = e.get("xid") if isinstance(e, dict) else None
                if type(code) is not int:
                    continue  # a trace is untrusted: an entry without a code says nothing
                raw = e.get("t")
                at = float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw) else t
                uuid = g.uuid or self.uuids.get(g.index)
                self.xids.append(XidSeen(at, g.index, uuid, code))
                key = (g.index, uuid or "", code)
                self.totals[key] = self.totals.get(key, 0) + 1
        if t - self._pruned > 60.0 or len(self.pid_gpus) > MAX_PIDS:
            self._pruned = t
            while self.xids and t - self.xids[0].t > self.keep_s:
                self.xids.popleft()
            for pid in list(self.pid_gpus):
                seen = {i: at for i, at in self.pid_gpus[pid].items() if t - at <= self.keep_s}
                if seen:
                    self.pid_gpus[pid] = seen
                else:
                    del self.pid_gpus[pid]
            if len(self.pid_gpus) > MAX_PIDS:  # the ones seen longest ago go first
                by_age = sorted(self.pid_gpus, key=lambda p: max(self.pid_gpus[p].values()))
                for pid in by_age[: len(by_age) - MAX_PIDS // 2]:
                    del self.pid_gpus[pid]

    def gpus_of(self, pid: int) -> list[int]:
        return sorted(self.pid_gpus.get(pid, {}))

    def recent(self, gpu: int, since: float) -> list[XidSeen]:
        return [x for x in self.xids if x.gpu == gpu and x.t >= since]


def gpu_record(log: HardwareLog, index: int, g: GpuSample, now: float) -> dict[str, Any]:
    """The hardware fields of one GPU's record in the API, those known only (an unknown one is
    absent): its clock-event reasons, ECC, remapped rows, NVLink errors and its XIDs of the last
    ``KEEP_S``."""
    out: dict[str, Any] = {k: v for k in ("clock_events", "ecc_uncorrected", "ecc_corrected", "remap_pending",
                                          "remap_failure", "nvlink_errors") if (v := getattr(g, k)) is not None}
    xids = [{"xid": x.xid, "meaning": xid(x.xid).meaning, "severity": xid(x.xid).severity, "t": round(x.t, 3)}
            for x in log.recent(index, now - log.keep_s)]
    if xids:
        out["xids"] = xids
    return out
