"""/metrics: a collector rebuilt on every scrape from the daemon's current view.

Like node_exporter, every part is isolated: a part that fails is logged and reported through
``hangd_metrics_part_success{part="<part>"}`` and the scrape still succeeds.

The distributed job is the label ``hangd_job``, never ``job``: Prometheus sets ``job`` to the scrape
job, and a clash would need ``honor_labels`` and hide which scrape a series came from.

Per-process series are bounded: a process that exited keeps its series ``metrics_gone_after_s``
(so the last state of a rank that died is still scraped), then they go; beyond
``metrics_max_processes`` processes the rest are not exported. Both are counted in
``hangd_series_dropped_total{reason="gone"|"cap"}``."""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hangd import __version__
from hangd.analysis.model import STATES
from hangd.incidents import KINDS

if TYPE_CHECKING:
    from hangd.server.runtime import Daemon

log = logging.getLogger("hangd.metrics")
JOB_STATES = STATES
# series one process contributes: a state series per state, last progress, GPU memory
SERIES_PER_PROCESS = len(STATES) + 2


class SeriesBound:
    """Which processes /metrics exports: exited ones only for ``gone_after_s``, at most ``cap``.
    Counts, once per process, the series it stopped exporting and why."""

    def __init__(self, gone_after_s: float = 300.0, cap: int = 1000) -> None:
        self.gone_after_s = gone_after_s
        self.cap = cap
        self.dropped_total = {"gone": 0.0, "cap": 0.0}
        self._dropped: dict[int, str] = {}  # pid -> why, so a process is counted once

    def select(self, procs: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
        keep = []
        for p in procs:
            if p.get("state") == "gone" and now - float(p.get("since") or now) > self.gone_after_s:
                self._drop(p["pid"], "gone")
            else:
                keep.append(p)
        # live processes first, then the newest exits: the cap cuts the least useful series
        keep.sort(key=lambda p: (p.get("state") == "gone", -float(p.get("since") or 0.0)))
        for p in keep[self.cap:]:
            self._drop(p["pid"], "cap")
        kept = keep[: self.cap]
        kept_pids = {p["pid"] for p in kept}
        for pid in [pid for pid, why in self._dropped.items() if why == "cap" and pid in kept_pids]:
            del self._dropped[pid]  # back under the cap: count it again if it is cut again
        if len(self._dropped) > 10 * max(self.cap, 1000):  # forget the oldest: pids are reused
            for pid in list(self._dropped)[: len(self._dropped) // 2]:
                del self._dropped[pid]
        return kept

    def _drop(self, pid: int, why: str) -> None:
        if self._dropped.get(pid) != why:
            self._dropped[pid] = why
            self.dropped_total[why] += SERIES_PER_PROCESS


class HangdCollector(Collector):
    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon
        self.bound = SeriesBound(daemon.settings.metrics_gone_after_s, daemon.settings.metrics_max_processes)

    def collect(self) -> Iterator[Metric]:
        failed: list[str] = []
        for part in (self._build, self._processes, self._jobs, self._incidents, self._gpus, self._self):
            try:
                yield from part()
            except Exception:
                log.exception("metrics part %s failed", part.__name__)
                failed.append(part.__name__.strip("_"))
        ok = GaugeMetricFamily("hangd_metrics_part_success", "Whether each part of /metrics could be built (1) or not (0).",
                               labels=["part"])
        for name in ("build", "processes", "jobs", "incidents", "gpus", "self"):
            ok.add_metric([name], 0.0 if name in failed else 1.0)
        yield ok

    def _build(self) -> Iterator[Metric]:
        g = GaugeMetricFamily("hangd_build_info", "hangd version and Python that run here.", labels=["version", "python"])
        g.add_metric([__version__, platform.python_version()], 1.0)
        yield g

    def _processes(self) -> Iterator[Metric]:
        with self.d.lock:
            procs = self.d.analyzer.processes()
        procs = self.bound.select(procs, self.d.last_snapshot_t or time.time())
        st = GaugeMetricFamily("hangd_process_state", "1 for the state each GPU process / rank is in, 0 for the others.",
                               labels=["hangd_job", "rank", "gpu", "pid", "state"])
        for p in procs:
            gpu = ",".join(map(str, p.get("gpus") or [])) or "none"
            for s in STATES:
                st.add_metric([p["job"], str(p["rank"]), gpu, str(p["pid"]), s], 1.0 if p["state"] == s else 0.0)
        yield st
        lp = GaugeMetricFamily("hangd_last_progress_timestamp_seconds",
                               "When each rank last showed evidence of work done (Unix seconds).", labels=["hangd_job", "rank"])
        for p in procs:
            if p.get("last_progress"):
                lp.add_metric([p["job"], str(p["rank"])], float(p["last_progress"]))
        yield lp
        mem = GaugeMetricFamily("hangd_process_gpu_memory_bytes", "GPU memory each rank holds.",
                                labels=["hangd_job", "rank", "pid"])
        for p in procs:
            if p.get("gpu_mem_bytes") is not None:
                mem.add_metric([p["job"], str(p["rank"]), str(p["pid"])], float(p["gpu_mem_bytes"]))
        yield mem
        dropped = CounterMetricFamily("hangd_series_dropped", "Per-process series no longer exported: of processes "
                                      "gone longer than metrics_gone_after_s, or beyond metrics_max_processes.",
                                      labels=["reason"])
        for why, n in sorted(self.bound.dropped_total.items()):
            dropped.add_metric([why], n)
        yield dropped

    def _jobs(self) -> Iterator[Metric]:
        with self.d.lock:
            jobs = self.d.analyzer.jobs()
        js = GaugeMetricFamily("hangd_job_state", "1 for the state each distributed job is in, 0 for the others.",
                               labels=["hangd_job", "state"])
        for j in jobs:
            for s in JOB_STATES:
                js.add_metric([j["job"], s], 1.0 if j["state"] == s else 0.0)
        yield js
        ranks = GaugeMetricFamily("hangd_job_ranks", "Ranks of each job seen on this node.", labels=["hangd_job"])
        for j in jobs:
            ranks.add_metric([j["job"]], float(len(j["ranks"])))
        yield ranks
        yield from self._fleet()

    def _fleet(self) -> Iterator[Metric]:
        """Jobs that span nodes, in a fleet sharing a database: each node of the job as this node
        knows it. Absent on a lone node (no series to keep for nothing)."""
        with self.d.lock:
            nodes = self.d.analyzer.job_nodes()
        if not nodes:
            return
        last = GaugeMetricFamily("hangd_job_node_last_report_timestamp_seconds",
                                 "Jobs that span nodes: when each node's hangd last reported the job (Unix seconds; "
                                 "this node: its last tick).", labels=["hangd_job", "node"])
        count = GaugeMetricFamily("hangd_job_node_ranks", "Jobs that span nodes: the ranks each node reports.",
                                  labels=["hangd_job", "node"])
        for job, per_node in sorted(nodes.items()):
            for node, (t, n) in sorted(per_node.items()):
                last.add_metric([job, node], float(t))
                count.add_metric([job, node], float(n))
        yield last
        yield count

    def _incidents(self) -> Iterator[Metric]:
        with self.d.lock:
            open_ = self.d.analyzer.incidents(open_only=True)
            opened = self.d.analyzer.opened_counts()
        op = GaugeMetricFamily("hangd_incidents_open", "Incidents open now, by kind.", labels=["kind"])
        tot = CounterMetricFamily("hangd_incidents", "Incidents opened since hangd started, by kind.", labels=["kind"])
        for k in KINDS:
            op.add_metric([k], float(sum(1 for i in open_ if i.kind == k)))
            tot.add_metric([k], float(opened.get(k, 0)))
        yield op
        yield tot
        info = GaugeMetricFamily("hangd_incident_opened_timestamp_seconds",
                                 "When each open incident was opened (Unix seconds); its id links to /incidents/{id}.",
                                 labels=["id", "kind", "severity", "hangd_job", "culprit_ranks"])
        det = GaugeMetricFamily("hangd_incident_detection_seconds",
                                "Seconds from the last progress of the job to the incident opening (time to detect).",
                                labels=["id", "kind", "hangd_job"])
        for i in open_:
            labels = [str(i.id), i.kind, i.severity, i.job, ",".join(map(str, i.culprit_ranks))]
            info.add_metric(labels, float(i.opened_at))
            if i.hang_started_at is not None:
                det.add_metric([str(i.id), i.kind, i.job], max(0.0, float(i.opened_at - i.hang_started_at)))
        yield info
        yield det

    def _gpus(self) -> Iterator[Metric]:
        with self.d.lock:
            latest = self.d.analyzer.latest_gpus()
        fams = {
            "util": GaugeMetricFamily("hangd_gpu_utilization_ratio", "NVML GPU utilization: a kernel was resident (0-1).", labels=["gpu", "uuid"]),
            "sm": GaugeMetricFamily("hangd_gpu_sm_active_ratio", "GPM SM activity (0-1): real work, unlike utilization.", labels=["gpu", "uuid"]),
            "tensor": GaugeMetricFamily("hangd_gpu_tensor_active_ratio", "GPM tensor-core activity (0-1).", labels=["gpu", "uuid"]),
            "dram": GaugeMetricFamily("hangd_gpu_dram_active_ratio", "GPM DRAM bandwidth use (0-1).", labels=["gpu", "uuid"]),
            "nvlink": GaugeMetricFamily("hangd_gpu_nvlink_bytes_per_second", "GPM NVLink traffic, tx+rx.", labels=["gpu", "uuid"]),
            "mem": GaugeMetricFamily("hangd_gpu_memory_used_bytes", "GPU memory in use.", labels=["gpu", "uuid"]),
            "memt": GaugeMetricFamily("hangd_gpu_memory_total_bytes", "GPU memory in total.", labels=["gpu", "uuid"]),
            "power": GaugeMetricFamily("hangd_gpu_power_watts", "GPU power draw.", labels=["gpu", "uuid"]),
        }
        for idx, g in sorted(latest.items()):
            lab = [str(idx), g.uuid or ""]
            if g.util_gpu is not None:
                fams["util"].add_metric(lab, g.util_gpu / 100.0)
            # a GPM value NVML did not give this time is left out, not exported as 0
            gpm = g.gpm or {}
            for fam, key in (("sm", "SM_UTIL"), ("tensor", "ANY_TENSOR_UTIL"), ("dram", "DRAM_BW_UTIL")):
                if key in gpm:
                    fams[fam].add_metric(lab, gpm[key] / 100.0)
            if "NVLINK_TOTAL_TX_PER_SEC" in gpm and "NVLINK_TOTAL_RX_PER_SEC" in gpm:
                nv = gpm["NVLINK_TOTAL_TX_PER_SEC"] + gpm["NVLINK_TOTAL_RX_PER_SEC"]
                fams["nvlink"].add_metric(lab, nv * 1024 * 1024)
            if g.mem_used is not None:
                fams["mem"].add_metric(lab, float(g.mem_used))
            if g.mem_total is not None:
                fams["memt"].add_metric(lab, float(g.mem_total))
            if (watts := g.power_w) is not None:
                fams["power"].add_metric(lab, watts)
        yield from fams.values()

    def _self(self) -> Iterator[Metric]:
        succ = GaugeMetricFamily("hangd_collector_success", "Whether each source read on the last tick (1) or not (0).",
                                 labels=["collector"])
        dur = GaugeMetricFamily("hangd_collector_duration_seconds", "How long each source took on the last tick.",
                                labels=["collector"])
        # a source turned off by a setting (nvml = false on a CPU node) reads nothing on purpose: the
        # collector-down alert leaves it out, or every such node would page for its configuration
        off = GaugeMetricFamily("hangd_collector_disabled", "Whether each source is turned off by a setting (1) or not (0).",
                                labels=["collector"])
        for name, st in sorted(self.d.collector_stats().items()):
            succ.add_metric([name], 1.0 if st.success else 0.0)
            dur.add_metric([name], float(st.duration_s))
            off.add_metric([name], 1.0 if st.disabled else 0.0)
        store_ok = 1.0 if self.d.store.healthy else 0.0
        succ.add_metric(["store"], store_ok)
        off.add_metric(["store"], 0.0)
        yield succ
        yield dur
        yield off
        yield from self.d.tick_histogram.collect()
        yield CounterMetricFamily("hangd_ticks", "Ticks run since start.", value=float(self.d.ticks))
        yield CounterMetricFamily("hangd_tick_failures", "Ticks that failed since start.", value=float(self.d.tick_failures))
        with self.d.lock:
            forgotten = self.d.analyzer.forgotten()
            unreadable = self.d.analyzer.unreadable
        yield CounterMetricFamily("hangd_evidence_unreadable", "Evidence files (flight-recorder dumps) refused or "
                                  "undecodable; each is reported as a finding and the analysis goes on.",
                                  value=float(unreadable))
        fc = CounterMetricFamily("hangd_analysis_forgotten", "What the analysis dropped from memory to stay bounded "
                                 "(the store keeps the history): state changes, findings, resolved incidents, "
                                 "processes and jobs long gone.", labels=["what"])
        for what, n in sorted(forgotten.items()):
            fc.add_metric([what], float(n))
        yield fc
        yield GaugeMetricFamily("hangd_store_pending_batches", "Writes queued because the store could not take them.",
                                value=float(len(self.d.store.pending)))
        yield CounterMetricFamily("hangd_store_write_failures", "Store writes that failed (and will be retried).",
                                  value=float(self.d.store.write_failures_total))
        yield CounterMetricFamily("hangd_store_process_lists_superseded", "Lists of the processes queued for the "
                                  "store that a newer list replaced before they were written (the store was slower "
                                  "than the ticks; the newest list is written).", value=float(self.d.store.superseded))
        last = self.d.last_tick_at
        yield GaugeMetricFamily("hangd_last_tick_timestamp_seconds", "When the last tick finished (Unix seconds).",
                                value=float(last) if last else 0.0)
        yield GaugeMetricFamily("hangd_start_time_seconds", "When hangd started (Unix seconds).", value=self.d.started_at)
