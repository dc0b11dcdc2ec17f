"""/metrics: a collector rebuilt on every scrape from the daemon's current view.

Like node_exporter, every part is isolated: a part that fails is logged and reported through
``hangd_collector_success{collector="metrics:<part>"}`` and the scrape still succeeds."""

from __future__ import annotations

import logging
import platform
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hangd import __version__
from hangd.analysis.model import STATES
from hangd.incidents import KINDS

if TYPE_CHECKING:
    from hangd.server.runtime import Daemon

log = logging.getLogger("hangd.metrics")
JOB_STATES = STATES


class HangdCollector(Collector):
    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon

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
        st = GaugeMetricFamily("hangd_process_state", "1 for the state each GPU process / rank is in, 0 for the others.",
                               labels=["job", "rank", "gpu", "pid", "state"])
        for p in procs:
            gpu = ",".join(map(str, p.get("gpus") or [])) or "none"
            for s in STATES:
                st.add_metric([p["job"], str(p["rank"]), gpu, str(p["pid"]), s], 1.0 if p["state"] == s else 0.0)
        yield st
        lp = GaugeMetricFamily("hangd_last_progress_timestamp_seconds",
                               "When each rank last showed evidence of work done (Unix seconds).", labels=["job", "rank"])
        for p in procs:
            if p.get("last_progress"):
                lp.add_metric([p["job"], str(p["rank"])], float(p["last_progress"]))
        yield lp
        mem = GaugeMetricFamily("hangd_process_gpu_memory_bytes", "GPU memory each rank holds.", labels=["job", "rank", "pid"])
        for p in procs:
            if p.get("gpu_mem_bytes") is not None:
                mem.add_metric([p["job"], str(p["rank"]), str(p["pid"])], float(p["gpu_mem_bytes"]))
        yield mem

    def _jobs(self) -> Iterator[Metric]:
        with self.d.lock:
            jobs = self.d.analyzer.jobs()
        js = GaugeMetricFamily("hangd_job_state", "1 for the state each distributed job is in, 0 for the others.",
                               labels=["job", "state"])
        for j in jobs:
            for s in JOB_STATES:
                js.add_metric([j["job"], s], 1.0 if j["state"] == s else 0.0)
        yield js
        ranks = GaugeMetricFamily("hangd_job_ranks", "Ranks of each job seen on this node.", labels=["job"])
        for j in jobs:
            ranks.add_metric([j["job"]], float(len(j["ranks"])))
        yield ranks

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
                                 labels=["id", "kind", "severity", "job", "culprit_ranks"])
        det = GaugeMetricFamily("hangd_incident_detection_seconds",
                                "Seconds from the last progress of the job to the incident opening (time to detect).",
                                labels=["id", "kind", "job"])
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
            if g.gpm:
                fams["sm"].add_metric(lab, g.gpm.get("SM_UTIL", 0.0) / 100.0)
                fams["tensor"].add_metric(lab, g.gpm.get("ANY_TENSOR_UTIL", 0.0) / 100.0)
                fams["dram"].add_metric(lab, g.gpm.get("DRAM_BW_UTIL", 0.0) / 100.0)
                nv = g.gpm.get("NVLINK_TOTAL_TX_PER_SEC", 0.0) + g.gpm.get("NVLINK_TOTAL_RX_PER_SEC", 0.0)
                fams["nvlink"].add_metric(lab, nv * 1024 * 1024)
            if g.mem_used is not None:
                fams["mem"].add_metric(lab, float(g.mem_used))
            if g.mem_total is not None:
                fams["memt"].add_metric(lab, float(g.mem_total))
            if g.power_mw is not None:
                fams["power"].add_metric(lab, g.power_mw / 1000.0)
        yield from fams.values()

    def _self(self) -> Iterator[Metric]:
        succ = GaugeMetricFamily("hangd_collector_success", "Whether each source read on the last tick (1) or not (0).",
                                 labels=["collector"])
        dur = GaugeMetricFamily("hangd_collector_duration_seconds", "How long each source took on the last tick.",
                                labels=["collector"])
        for name, st in sorted(self.d.collector_stats().items()):
            succ.add_metric([name], 1.0 if st.success else 0.0)
            dur.add_metric([name], float(st.duration_s))
        store_ok = 1.0 if self.d.store.healthy else 0.0
        succ.add_metric(["store"], store_ok)
        yield succ
        yield dur
        yield from self.d.tick_histogram.collect()
        yield CounterMetricFamily("hangd_ticks", "Ticks run since start.", value=float(self.d.ticks))
        yield CounterMetricFamily("hangd_tick_failures", "Ticks that failed since start.", value=float(self.d.tick_failures))
        yield GaugeMetricFamily("hangd_store_pending_batches", "Writes queued because the store could not take them.",
                                value=float(len(self.d.store.pending)))
        yield CounterMetricFamily("hangd_store_write_failures", "Store writes that failed (and will be retried).",
                                  value=float(self.d.store.write_failures_total))
        last = self.d.last_tick_at
        yield GaugeMetricFamily("hangd_last_tick_timestamp_seconds", "When the last tick finished (Unix seconds).",
                                value=float(last) if last else 0.0)
        yield GaugeMetricFamily("hangd_start_time_seconds", "When hangd started (Unix seconds).", value=self.d.started_at)
