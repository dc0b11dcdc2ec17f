"""The daemon's moving parts: the loop thread (live node or replayed trace), the store, and what
the API and /metrics read. The analyzer is behind ``hangd.front.Front``, which owns its lock."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import Histogram
from sqlalchemy.exc import SQLAlchemyError

from hangd.analysis.engine import StateChange
from hangd.config import Settings
from hangd.daemon import Feed, Loop, TraceFeed, configured_front
from hangd.humanize import gpus_unseen
from hangd.incidents import Incident
from hangd.snapshot import Snapshot
from hangd.sources.base import CollectorStats
from hangd.sources.live import LiveNode
from hangd.store.db import ID_STRIDE, Batch, Store

log = logging.getLogger("hangd.serve")


def _severity(state: str) -> int:
    from hangd.analysis.model import SEVERITY_ORDER, State
    try:
        return int(SEVERITY_ORDER[State(state)])
    except (ValueError, KeyError):
        return -1
ADOPT_GRACE_S = 60.0  # an incident open before a restart that is not seen again this long is resolved
RETENTION_EVERY_S = 3600.0


@dataclass(frozen=True)
class StoreHealth:
    """How the store is doing, as /metrics reports it."""

    healthy: bool
    pending: int  # batches queued because the store could not take them
    write_failures: int
    superseded: int  # process lists a newer one replaced before they were written


class Daemon:
    def __init__(self, settings: Settings, store: Store | None = None) -> None:
        self.settings = settings
        self.store = store if store is not None else Store(settings.db)
        self.front = configured_front(settings)
        self.replay = settings.replay
        self.stop = threading.Event()
        feed: Feed = TraceFeed(self.replay, settings.speed) if self.replay else LiveNode(settings)
        self.node = feed if isinstance(feed, LiveNode) else None  # what can capture on demand
        self.loop = Loop(feed, self.front, interval=None if self.replay else settings.interval, stop=self.stop)
        self.started_at = time.time()
        self.last_tick_at: float | None = None
        self.last_snapshot_t: float | None = None
        self.ticks = 0
        self.tick_seconds: list[float] = []
        self.tick_histogram = Histogram("hangd_tick_duration_seconds", "Cost of one sampling + analysis tick.",
                                        registry=None, buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))
        self.replay_done = False
        self._last_retention = 0.0
        self._last_full_write = 0.0
        self.thread: threading.Thread | None = None
        try:
            self.front.adopt(self.store.open_incidents(), self.store.max_incident_id() + 1)
        except SQLAlchemyError as e:
            # the database cannot even be read (a full disk leaves no room for SQLite's shared-memory
            # file): serve anyway; number incidents from the clock so that they cannot take the ids
            # of incidents already in the file when it comes back
            self.front.adopt([], int(time.time()))
            log.error("store not readable at start: not adopting open incidents, numbering new ones from %d: %s",
                      int(time.time()), str(e).splitlines()[0][:200])
        self._spanning: set[str] = set()
        if self.store.shared:
            # nodes sharing the database number their incidents apart
            self.front.number_by(ID_STRIDE, self.store.node_id)
            if self.node is not None:
                self.loop.before_step = self._attach_remote

    # ------------------------------------------------------------------ loop

    def start(self) -> None:
        self.store.start_writer()
        self.thread = threading.Thread(target=self._run, name="hangd-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.loop.run(self._after_tick)
        if not self.replay or self.stop.is_set():
            return
        self.replay_done = True
        while not self.stop.wait(1.0):  # the store's writer catches up; a recreated file gets the open incidents
            if self.store.needs_rewrite:
                self.store.submit(self._rewrite_batch(self.last_snapshot_t or time.time()))

    def _attach_remote(self, snap: Snapshot) -> None:
        """The ranks other nodes report for this node's jobs that span nodes: the snapshot's
        remote part, as the store's writer thread last read them (never a read on this thread).
        While the database cannot be read (nothing read for node_stale_s), there are none: this
        node then diagnoses alone rather than call the other nodes silent."""
        snap.node = self.store.hostname
        self.store.want_remote(self._spanning)
        if not self._spanning:
            return
        got = self.store.cached_remote()
        fresh = got is not None and time.time() - got[0] <= self.settings.node_stale_s
        snap.remote = [r for r in got[1] if r.job in self._spanning] if got is not None and fresh else []
        dumps = self.store.cached_remote_dumps()
        fresh = dumps is not None and time.time() - dumps[0] <= self.settings.node_stale_s
        snap.remote_dumps = [d for d in dumps[1] if d.job in self._spanning] if dumps is not None and fresh else []

    @property
    def tick_failures(self) -> int:
        """Ticks that failed since start."""
        return self.loop.tick_failures

    def failing(self) -> str | None:
        """Why ticks fail, while the newest tick failed (None when the last one worked)."""
        last = self.loop.last_failure
        if last is None or (self.last_tick_at is not None and self.last_tick_at > last[0]):
            return None
        return f"ticks are failing ({self.tick_failures} since start): {last[1]}"

    def _after_tick(self, snap: Snapshot, changes: list[StateChange], incidents: list[Incident]) -> None:
        now = time.time()
        self.ticks += 1
        self.last_tick_at = now
        self.last_snapshot_t = snap.t
        if self.loop.tick_seconds:
            self.tick_histogram.observe(self.loop.tick_seconds[-1])
            self.tick_seconds = self.loop.tick_seconds
        rewrite = self.store.needs_rewrite
        if now - self.started_at >= ADOPT_GRACE_S:
            self.front.resolve_adopted(snap.t)
        incidents = incidents + self.front.drain()
        batch = self._rewrite_batch(snap.t, incidents) if rewrite else Batch(t=snap.t, incidents=[i.to_dict() for i in incidents])
        batch.changes = [{k: v for k, v in c.to_dict().items() if k != "evidence"} for c in changes]
        self._spanning = batch.spanning = self.front.spanning_jobs()
        fr = self.front.take_fr_dumps()
        if self.store.shared:  # the other nodes compare their ranks' dumps with these
            batch.fr = fr
        # a shared database: every batch carries the ranks (the store writes those that changed
        # and moves the others' last_seen with the heartbeat)
        if now - self._last_full_write >= 10 or changes or rewrite or (self.store.shared and self._spanning):
            self._last_full_write = now
            batch.processes = [p.to_dict() for p in self.front.processes()]
            batch.jobs = [j.to_dict() for j in self.front.jobs()]
        if snap.gpus:
            batch.gpus = [{"index": g.index, "uuid": g.uuid, "name": g.name, "mem_total": g.mem_total,
                           "util_gpu": g.util_gpu, "gpm": g.gpm, "mem_used": g.mem_used,
                           "power_w": g.power_w} for g in snap.gpus]
        self.store.submit(batch)
        if now - self._last_retention >= RETENTION_EVERY_S:
            self._last_retention = now
            self.store.retention(self.settings.retention_days)

    def _rewrite_batch(self, t: float, changed: list[Incident] | None = None) -> Batch:
        """After the database file was recreated: every incident still open (and those that just
        changed), the processes and the jobs, so the new file tells the current story."""
        self.store.needs_rewrite = False
        incs = {i.id: i for i in [*self.front.incidents(open_only=True), *(changed or [])]}
        return Batch(t=t, incidents=[i.to_dict() for i in incs.values()],
                     processes=[p.to_dict() for p in self.front.processes()],
                     jobs=[j.to_dict() for j in self.front.jobs()], spanning=self.front.spanning_jobs())

    def shutdown(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=10)

    # ------------------------------------------------------------------ views for the API

    def jobs_view(self, key: str | None = None) -> list[dict[str, Any]]:
        """This node's jobs; with a shared database, a job that spans nodes as the whole fleet
        reports it (every node's ranks, where each is, when its node last reported, the nodes that
        stopped reporting), and such jobs that have no rank on this node too. One job asked for
        by its key also has where each rank stands in its flight recorder, every node's dumps."""
        local = [j.to_dict() for j in self.front.jobs() if key is None or j.job == key]
        open_by_job: dict[str, list[int]] = {}
        for inc in self.front.incidents(open_only=True):
            open_by_job.setdefault(inc.job, []).append(inc.id)
        out = [{**j, "open_incidents": sorted(open_by_job.get(j["job"], []))} for j in local]
        if not self.store.shared:
            return out
        try:
            fleet = self.store.fleet_jobs(key)
        except SQLAlchemyError as e:
            log.warning("could not read the fleet's jobs: %s", str(e).splitlines()[0][:200])
            return out
        here = {j["job"]: j for j in out}
        for k, f in fleet.items():
            j = here.get(k)
            if j is None:  # no rank of it on this node
                j = {"job": k, "name": f["name"], "state": None, "ranks": {}, "rank_from": {}, "identity": f["identity"],
                     "world_size": f["world_size"], "launcher": None, "last_progress": None,
                     "spans_nodes": f["spans_nodes"], "open_incidents": []}
                out.append(j)
            states = [s for s in [j.get("state"), *f["states"]] if s]
            j["state"] = max(states, key=_severity) if states else None
            ranks = f["fleet_ranks"]
            j["ranks"] = {**{r: x["pid"] for r, x in ranks.items()}, **j["ranks"]}
            j["rank_nodes"] = {r: x["node"] for r, x in ranks.items()}
            j["fleet_ranks"] = ranks
            lasts = [x for x in [j.get("last_progress"), *(r["last_progress"] for r in ranks.values())] if x]
            j["last_progress"] = max(lasts) if lasts else None
            j["nodes"] = f["nodes"]
            j["stopped_reporting"] = [f"{n['node']}: no report since {time.strftime('%H:%M:%S', time.localtime(n['last_report']))}"
                                      for n in f["nodes"] if n["stale"]]
            # the fleet's open incidents (one per job and family, whichever node opened it)
            j["open_incidents"] = sorted(f["open_incidents"])
            if key is not None:  # one job asked for: where each rank stands in its flight recorder
                try:
                    fr = self.store.fleet_flight_recorder(k)
                except SQLAlchemyError as e:
                    log.warning("could not read the fleet's flight-recorder dumps: %s", str(e).splitlines()[0][:200])
                    continue
                j["flight_recorder"], j["fr_findings"] = fr["ranks"], fr["findings"]
        return out

    def gpu_history(self, minutes: float, gpu: int | None = None) -> list[dict[str, Any]]:
        """This node's GPU history over the last ``minutes`` (of the newest snapshot's clock: a
        replay's is the trace's), one row per GPU and minute. Raises SQLAlchemyError when the
        database cannot be read."""
        return self.store.gpu_history((self.last_snapshot_t or time.time()) - minutes * 60, gpu)

    def collector_stats(self) -> dict[str, CollectorStats]:
        if self.node is None:
            return {"replay": CollectorStats(success=True, duration_s=0.0)}
        return dict(self.node.runner.stats)

    def request_snapshot(self) -> dict[str, Any]:
        if self.node is None:
            return {"accepted": False, "why": "hangd runs a replay: there is no live node to capture"}
        pids = self.front.job_pids()
        self.node.dump_stacks(pids)
        # none of a job that may be capturing CUDA graphs: the dump would kill the capturing rank
        self.node.request_fr_dumps(p for p in self.front.dumpable_pids() if self.node.flight.has_pipe(p))
        return {"accepted": True, "pids": pids, "note": "stacks (py-spy, non-blocking) and flight-recorder dumps are "
                "captured on the next tick and attached to the processes' evidence"}

    def gpus_unseen(self) -> str | None:
        """Why the live node's GPUs cannot be seen (NVML missing, broken, turned off); None otherwise."""
        if self.node is None:
            return None
        st = self.node.runner.stats.get("nvml")
        return gpus_unseen({"nvml": st.error}) if st is not None and not st.success and st.error else None

    def sources_failing(self) -> list[str]:
        """The live node's other sources (/proc, logs, flight recorder) whose last read failed, each
        with its reason and HINT. The GPUs and the store have sentences of their own."""
        if self.node is None:
            return []
        return [f"source {name} {st.error}" for name, st in sorted(self.node.runner.stats.items())
                if name not in ("nvml", "store") and not st.success and st.error]

    # ------------------------------------------------------------------ the store, for the API

    def list_incidents(self, **query: Any) -> tuple[int, list[dict[str, Any]]]:
        """Incidents from the store, newest first: (how many match, the page asked for)."""
        return self.store.list_incidents(**query)

    def incident(self, incident_id: int) -> dict[str, Any] | None:
        """One incident as the analysis has it now (else as the store keeps it), acked as stored."""
        live = self.front.incident(incident_id)
        d = live.to_dict() if live is not None else None
        if d is None:
            d = self.store.get_incident(incident_id)
        if d is None:
            return None
        stored = self.store.get_incident(incident_id)
        if stored is not None:
            d["acked"] = stored["acked"]
        return d

    def ack(self, incident_id: int) -> dict[str, Any] | None:
        """Acknowledge an incident in the store and in the analysis; None when there is none."""
        d = self.store.ack(incident_id)
        if d is not None:
            self.front.ack(incident_id)
        return d

    def timeline(self, pid: int | None = None, since: float | None = None, limit: int = 500) -> list[dict[str, Any]]:
        return self.store.timeline(pid=pid, since=since, limit=limit)

    @property
    def node_name(self) -> str:
        """This node's name as the store knows it (labels, links)."""
        return self.store.hostname

    def store_health(self) -> StoreHealth:
        return StoreHealth(healthy=self.store.healthy, pending=len(self.store.pending),
                           write_failures=self.store.write_failures_total, superseded=self.store.superseded)

    def ready(self) -> tuple[bool, str]:
        """Ready once the loop has sampled (or the replay ran). A degraded store, GPUs that cannot be
        seen or another source failing still serve (what the rest shows is worth having) but say
        ``degraded: <why>``."""
        degraded = []
        if not self.store.healthy:
            degraded.append(f"store degraded: {self.store.last_error} ({len(self.store.pending)} batches queued)")
        if self.store.recreated:
            degraded.append(f"database file was removed or replaced {self.store.recreated} time(s) and recreated")
        if self.replay_done:
            return True, "; ".join(["replay finished", *degraded])
        if self.thread is None or not self.thread.is_alive():
            return False, "loop not running"
        if self.last_tick_at is None:
            return False, "no tick yet"
        degraded[:0] = self.sources_failing()
        unseen = self.gpus_unseen()
        if unseen:
            degraded.insert(0, unseen)
        failing = self.failing()
        if failing:
            degraded.insert(0, failing)
        return True, ("degraded: " + "; ".join(degraded)) if degraded else "ok"
