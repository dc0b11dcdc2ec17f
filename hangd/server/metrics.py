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

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hangd import __version__
from hangd.analysis import hardware, owner
from hangd.analysis.model import STATES
from hangd.incidents import KINDS
from hangd.server.links import RUNBOOK_PATH, incident_url

if TYPE_CHECKING:
    from hangd.incidents import Incident
    from hangd.server.runtime import Daemon

log = logging.getLogger("hangd.metrics")
JOB_STATES = STATES
# series one process contributes: a state series per state, last progress, GPU memory
SERIES_PER_PROCESS = len(STATES) + 2
# time to detect: the thresholds are 10-30 s of no progress, a late verdict takes minutes
DETECTION_BUCKETS = (5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 300.0, 600.0)


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
    def __init__(self, daemon: Daemon, base: str = "http://127.0.0.1:9877", link_key: bytes | None = None) -> None:
        self.d = daemon
        self.bound = SeriesBound(daemon.settings.metrics_gone_after_s, daemon.settings.metrics_max_processes)
        self.base = base  # where browsers reach this hangd: the links in alerts
        self.link_key = link_key
        self.detection = Histogram("hangd_incident_detection_seconds", "Seconds from a job's last progress to its "
                                   "incident opening (time to detect), once per incident, by the kind it opened as.",
                                   labelnames=["kind"], registry=None, buckets=DETECTION_BUCKETS)
        self._detected: set[int] = set()

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
        procs = self.bound.select([p.to_dict() for p in self.d.front.processes()], self.d.last_snapshot_t or time.time())
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
        jobs = self.d.front.jobs()
        js = GaugeMetricFamily("hangd_job_state", "1 for the state each distributed job is in, 0 for the others.",
                               labels=["hangd_job", "state", *owner.LABELS])
        for j in jobs:
            who = owner.labels(j.who)
            for s in JOB_STATES:
                js.add_metric([j.job, s, *who], 1.0 if j.state == s else 0.0)
        yield js
        ranks = GaugeMetricFamily("hangd_job_ranks", "Ranks of each job seen on this node.", labels=["hangd_job", *owner.LABELS])
        for j in jobs:
            ranks.add_metric([j.job, *owner.labels(j.who)], float(len(j.ranks)))
        yield ranks
        info = GaugeMetricFamily("hangd_job_owner_info", "Whom to page about each job: its owner, Slurm job and "
                                 "Kubernetes pod (a label is empty where unknown); 1.", labels=["hangd_job", *owner.INFO_LABELS])
        for j in jobs:
            if j.who:
                info.add_metric([j.job, *owner.labels(j.who, owner.INFO_LABELS)], 1.0)
        yield info
        yield from self._fleet()

    def _fleet(self) -> Iterator[Metric]:
        """Jobs that span nodes, in a fleet sharing a database: each node of the job as this node
        knows it. Absent on a lone node (no series to keep for nothing)."""
        nodes = self.d.front.job_nodes()
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
        open_ = self.d.front.incidents(open_only=True)
        known = self.d.front.incidents()
        opened = self.d.front.opened_counts()
        op = GaugeMetricFamily("hangd_incidents_open", "Incidents open now, by kind.", labels=["kind"])
        tot = CounterMetricFamily("hangd_incidents", "Incidents opened since hangd started, by kind.", labels=["kind"])
        for k in KINDS:
            op.add_metric([k], float(sum(1 for i in open_ if i.kind == k)))
            tot.add_metric([k], float(opened.get(k, 0)))
        yield op
        yield tot
        yield from self._incident_series(open_)
        self._observe_detection([*known, *open_])
        yield from self.detection.collect()
        rb = GaugeMetricFamily("hangd_runbook_info", "Where this hangd serves the operator guide, the runbook of "
                               "every alert (its runbook_url).", labels=["url"])
        rb.add_metric([self.base + RUNBOOK_PATH], 1.0)
        yield rb

    def _incident_series(self, open_: list[Incident]) -> Iterator[Metric]:
        """Each open incident's identity (incident id, job, node: what an alert is keyed on) apart
        from what may change while it is open (kind, culprit, severity, in the info series): a
        culprit found later or a kind refined changes no alert's identity."""
        node = self.d.node_name
        ident = ["incident", "hangd_job", "node"]
        # who to page (user, Slurm job, pod) is the job's for its whole life: a label to route on
        opened = GaugeMetricFamily("hangd_incident_opened_timestamp_seconds",
                                   "When each open incident was opened (Unix seconds); one series per incident.",
                                   labels=[*ident, *owner.LABELS])
        info = GaugeMetricFamily("hangd_incident_info", "What each open incident is now (1): kind, severity, culprit, "
                                 "and the link that opens its page (url, signed: no token needed).",
                                 labels=[*ident, "kind", "severity", "culprit_ranks", "culprit_pids", "url"])
        for i in open_:
            key = [str(i.id), i.job, node]
            opened.add_metric([*key, *owner.labels(i.who)], float(i.opened_at))
            info.add_metric([*key, i.kind, i.severity, ",".join(map(str, i.culprit_ranks)),
                             ",".join(map(str, i.culprit_pids)), incident_url(self.base, i.id, self.link_key)], 1.0)
        yield opened
        yield info

    def _observe_detection(self, incidents: list[Incident]) -> None:
        """Time to detect, once per incident: from the job's last progress to the incident opening."""
        now_known = set()
        for i in incidents:
            now_known.add(i.id)
            if i.id not in self._detected and i.hang_started_at is not None:
                self.detection.labels(i.kind).observe(max(0.0, float(i.opened_at - i.hang_started_at)))
                self._detected.add(i.id)
        self._detected &= now_known  # bounded: the analysis forgets old incidents, so does this

    def _gpus(self) -> Iterator[Metric]:
        latest = self.d.front.latest_gpus()
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
        yield from self._gpu_health(latest)

    def _gpu_health(self, latest: dict[int, Any]) -> Iterator[Metric]:
        """XIDs, clock-event (throttle) reasons, ECC, row remapping, NVLink errors: only what NVML said."""
        xids = self.d.front.xid_totals()
        xid = CounterMetricFamily("hangd_gpu_xid_events", "XID errors each GPU reported since hangd started, by XID "
                                  "code (hangd/analysis/hardware.toml says what each means).", labels=["gpu", "uuid", "xid"])
        for (idx, uuid, code), n in sorted(xids.items()):
            xid.add_metric([str(idx), uuid, str(code)], float(n))
        yield xid
        ce = GaugeMetricFamily("hangd_gpu_clock_event_active", "1 for each clock-event (throttle) reason NVML reports "
                               "for the GPU now, 0 for the others.", labels=["gpu", "uuid", "reason"])
        ecc = CounterMetricFamily("hangd_gpu_ecc_errors", "Volatile ECC errors the GPU counted since its driver loaded.",
                                  labels=["gpu", "uuid", "type"])
        remap = GaugeMetricFamily("hangd_gpu_row_remap", "1 where a row remapping is pending (a GPU reset applies "
                                  "it) or failed (bad memory), else 0.", labels=["gpu", "uuid", "status"])
        nvl = CounterMetricFamily("hangd_gpu_nvlink_errors", "NVLink errors counted over the GPU's links, by counter.",
                                  labels=["gpu", "uuid", "counter"])
        for idx, g in sorted(latest.items()):
            lab = [str(idx), g.uuid or ""]
            if g.clock_events is not None:
                for r in hardware.clock_event_names():
                    ce.add_metric([*lab, r], 1.0 if r in g.clock_events else 0.0)
            for kind, v in (("uncorrected", g.ecc_uncorrected), ("corrected", g.ecc_corrected)):
                if v is not None:
                    ecc.add_metric([*lab, kind], float(v))
            for status, v in (("pending", g.remap_pending), ("failed", g.remap_failure)):
                if v is not None:
                    remap.add_metric([*lab, status], 1.0 if v else 0.0)
            for counter, n in sorted((g.nvlink_errors or {}).items()):
                nvl.add_metric([*lab, counter], float(n))
        yield from (ce, ecc, remap, nvl)

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
        store = self.d.store_health()
        store_ok = 1.0 if store.healthy else 0.0
        succ.add_metric(["store"], store_ok)
        off.add_metric(["store"], 0.0)
        yield succ
        yield dur
        yield off
        yield from self.d.tick_histogram.collect()
        yield CounterMetricFamily("hangd_ticks", "Ticks run since start.", value=float(self.d.ticks))
        yield CounterMetricFamily("hangd_tick_failures", "Ticks that failed since start.", value=float(self.d.tick_failures))
        forgotten = self.d.front.forgotten()
        unreadable = self.d.front.unreadable()
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
                                value=float(store.pending))
        yield CounterMetricFamily("hangd_store_write_failures", "Store writes that failed (and will be retried).",
                                  value=float(store.write_failures))
        yield CounterMetricFamily("hangd_store_process_lists_superseded", "Lists of the processes queued for the "
                                  "store that a newer list replaced before they were written (the store was slower "
                                  "than the ticks; the newest list is written).", value=float(store.superseded))
        last = self.d.last_tick_at
        yield GaugeMetricFamily("hangd_last_tick_timestamp_seconds", "When the last tick finished (Unix seconds).",
                                value=float(last) if last else 0.0)
        yield GaugeMetricFamily("hangd_start_time_seconds", "When hangd started (Unix seconds).", value=self.d.started_at)
