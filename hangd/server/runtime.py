"""The daemon's moving parts: the loop thread (live node or replayed trace), the store, and what
the API and /metrics read. One lock guards the analyzer between the loop and the readers."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from prometheus_client import Histogram
from sqlalchemy.exc import SQLAlchemyError

from hangd.analysis.engine import Analyzer, StateChange
from hangd.config import Settings
from hangd.daemon import Loop, thresholds_from
from hangd.humanize import gpus_unseen
from hangd.incidents import Incident
from hangd.replay import paced
from hangd.snapshot import Snapshot
from hangd.sources.base import CollectorStats
from hangd.store.db import ID_STRIDE, Batch, Store
from hangd.trace import TraceReader

log = logging.getLogger("hangd.serve")


def _severity(state: str) -> int:
    from hangd.analysis.model import SEVERITY_ORDER, State
    try:
        return int(SEVERITY_ORDER[State(state)])
    except (ValueError, KeyError):
        return -1
ADOPT_GRACE_S = 60.0  # an incident open before a restart that is not seen again this long is resolved
RETENTION_EVERY_S = 3600.0


class Daemon:
    def __init__(self, settings: Settings, store: Store | None = None) -> None:
        self.settings = settings
        self.store = store if store is not None else Store(settings.db)
        self.analyzer = Analyzer(thresholds_from(settings))
        self.lock = threading.RLock()
        self.replay = settings.replay
        self.loop: Loop | None = None
        if not self.replay:
            self.loop = Loop(settings, analyzer=self.analyzer, lock=self.lock)
        self.stop = threading.Event()
        self.started_at = time.time()
        self.last_tick_at: float | None = None
        self.last_snapshot_t: float | None = None
        self.ticks = 0
        self._tick_failures = 0
        self.last_failure: tuple[float, str] | None = None
        self.tick_seconds: list[float] = []
        self.tick_histogram = Histogram("hangd_tick_duration_seconds", "Cost of one sampling + analysis tick.",
                                        registry=None, buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))
        self.replay_done = False
        self._last_retention = 0.0
        self._last_full_write = 0.0
        self.thread: threading.Thread | None = None
        try:
            self.analyzer.adopt(self.store.open_incidents(), self.store.max_incident_id() + 1)
        except SQLAlchemyError as e:
            # the database cannot even be read (a full disk leaves no room for SQLite's shared-memory
            # file): serve anyway; number incidents from the clock so that they cannot take the ids
            # of incidents already in the file when it comes back
            self.analyzer.adopt([], int(time.time()))
            log.error("store not readable at start: not adopting open incidents, numbering new ones from %d: %s",
                      int(time.time()), str(e).splitlines()[0][:200])
        self._spanning: set[str] = set()
        if self.store.shared:
            # nodes sharing the database number their incidents apart
            self.analyzer.book.number_by(ID_STRIDE, self.store.node_id)
            if self.loop is not None:
                self.loop.before_step = self._attach_remote

    # ------------------------------------------------------------------ loop

    def start(self) -> None:
        self.store.start_writer()
        self.thread = threading.Thread(target=self._run, name="hangd-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if self.replay:
            self._run_replay()
        else:
            assert self.loop is not None
            self.loop.stop = self.stop
            self.loop.run(self._after_tick)

    def _run_replay(self) -> None:
        reader = TraceReader(self.replay)  # type: ignore[arg-type]
        for snap in paced(reader.snapshots(), self.settings.speed):
            if self.stop.is_set():
                return
            t0 = time.perf_counter()
            try:
                with self.lock:
                    changes = self.analyzer.step(snap)
                    self.analyzer.take_requests()
                    incidents = self.analyzer.drain()
                self._record_tick(time.perf_counter() - t0)
                self._after_tick(snap, changes, incidents)
            except Exception:
                self._tick_failures += 1
                self.last_failure = (time.time(), "replay tick failed")
                log.exception("replay tick failed")
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
        """Ticks that failed since start: the live loop's, or the replay's."""
        return self.loop.tick_failures if self.loop is not None else self._tick_failures

    def failing(self) -> str | None:
        """Why ticks fail, while the newest tick failed (None when the last one worked)."""
        last = self.loop.last_failure if self.loop is not None else self.last_failure
        if last is None or (self.last_tick_at is not None and self.last_tick_at > last[0]):
            return None
        return f"ticks are failing ({self.tick_failures} since start): {last[1]}"

    def _record_tick(self, dt: float) -> None:
        self.tick_histogram.observe(dt)
        self.tick_seconds.append(dt)
        del self.tick_seconds[:-1000]

    def _after_tick(self, snap: Snapshot, changes: list[StateChange], incidents: list[Incident]) -> None:
        now = time.time()
        self.ticks += 1
        self.last_tick_at = now
        self.last_snapshot_t = snap.t
        if self.loop is not None and self.loop.tick_seconds:
            self.tick_histogram.observe(self.loop.tick_seconds[-1])
            self.tick_seconds = self.loop.tick_seconds
        rewrite = self.store.needs_rewrite
        with self.lock:
            self._resolve_stale_adopted(snap.t, now)
            incidents = incidents + self.analyzer.drain()
            batch = self._rewrite_batch(snap.t, incidents) if rewrite else Batch(t=snap.t, incidents=[i.to_dict() for i in incidents])
            batch.changes = [{k: v for k, v in c.to_dict().items() if k != "evidence"} for c in changes]
            self._spanning = batch.spanning = self.analyzer.spanning_jobs()
            fr = self.analyzer.take_fr_dumps()
            if self.store.shared:  # the other nodes compare their ranks' dumps with these
                batch.fr = fr
            # a shared database: every batch carries the ranks (the store writes those that changed
            # and moves the others' last_seen with the heartbeat)
            if now - self._last_full_write >= 10 or changes or rewrite or (self.store.shared and self._spanning):
                self._last_full_write = now
                batch.processes = self.analyzer.processes()
                batch.jobs = self.analyzer.jobs()
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
        with self.lock:
            incs = {i.id: i for i in [*self.analyzer.incidents(open_only=True), *(changed or [])]}
            return Batch(t=t, incidents=[i.to_dict() for i in incs.values()],
                         processes=self.analyzer.processes(), jobs=self.analyzer.jobs(),
                         spanning=self.analyzer.spanning_jobs())

    def _resolve_stale_adopted(self, t: float, now: float) -> None:
        if not self.analyzer.has_adopted() or now - self.started_at < ADOPT_GRACE_S:
            return
        self.analyzer.resolve_adopted(t)

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
        with self.lock:
            local = [j for j in self.analyzer.jobs() if key is None or j["job"] == key]
            open_by_job: dict[str, list[int]] = {}
            for inc in self.analyzer.incidents(open_only=True):
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

    def collector_stats(self) -> dict[str, CollectorStats]:
        if self.loop is None:
            return {"replay": CollectorStats(success=True, duration_s=0.0)}
        return dict(self.loop.node.runner.stats)

    def request_snapshot(self) -> dict[str, Any]:
        if self.loop is None:
            return {"accepted": False, "why": "hangd runs a replay: there is no live node to capture"}
        with self.lock:
            pids = self.analyzer.job_pids()
            self.loop.node.dump_stacks(pids)
            self.loop.node.request_fr_dumps(p for p in pids if self.loop.node.flight.has_pipe(p))
        return {"accepted": True, "pids": pids, "note": "stacks (py-spy, non-blocking) and flight-recorder dumps are "
                "captured on the next tick and attached to the processes' evidence"}

    def gpus_unseen(self) -> str | None:
        """Why the live node's GPUs cannot be seen (NVML missing, broken, turned off); None otherwise."""
        if self.loop is None:
            return None
        st = self.loop.node.runner.stats.get("nvml")
        return gpus_unseen({"nvml": st.error}) if st is not None and not st.success and st.error else None

    def sources_failing(self) -> list[str]:
        """The live node's other sources (/proc, logs, flight recorder) whose last read failed, each
        with its reason and HINT. The GPUs and the store have sentences of their own."""
        if self.loop is None:
            return []
        return [f"source {name} {st.error}" for name, st in sorted(self.loop.node.runner.stats.items())
                if name not in ("nvml", "store") and not st.success and st.error]

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
