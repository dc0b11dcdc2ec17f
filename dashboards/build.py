"""Builds the Grafana dashboards (JSON, current schema) from one place: `python dashboards/build.py`.

Every panel query is proven against a real Prometheus scraping a real hangd in
tests/deploy (test_prometheus.py, and test_fleet_dashboard.py for the fleet board, against two
nodes sharing a database); the metric names are checked against /metrics there too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SEL = 'instance=~"$node"'
JSEL = 'instance=~"$node", hangd_job=~"$job"'


def _query_var(name: str, label: str, query: str) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": query, "refId": name}, "definition": query, "refresh": 2, "includeAll": True,
            "multi": True, "allValue": ".+", "current": {}}


def templating(with_job: bool, fleet: bool = False) -> dict[str, Any]:
    lst: list[dict[str, Any]] = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus", "current": {},
         "hide": 0, "refresh": 1},
    ]
    if fleet:
        # a node of a job that spans nodes is the name its hangd writes under (--node-name), the
        # label `node`; every job, on one node or several, by its key
        lst += [_query_var("node", "Node", "label_values(hangd_job_node_ranks, node)"),
                _query_var("job", "Job", "label_values(hangd_job_state, hangd_job)")]
        return {"list": lst}
    lst.append(_query_var("node", "Node", "label_values(hangd_build_info, instance)"))
    if with_job:
        lst.append(_query_var("job", "Job", 'label_values(hangd_job_state{instance=~"$node"}, hangd_job)'))
    return {"list": lst}


class Board:
    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.y = 0
        self.x = 0
        self.row_h = 0

    def add(self, ptype: str, title: str, targets: list[tuple[str, str]], *, unit: str, description: str,
            w: int = 12, h: int = 8, options: dict[str, Any] | None = None,
            overrides: list[dict[str, Any]] | None = None, instant: bool = False, table: bool = False,
            transformations: list[dict[str, Any]] | None = None, defaults: dict[str, Any] | None = None) -> None:
        """One panel. ``unit`` (a Grafana unit id, "none" for a plain count) and ``description`` (what
        the panel tells a person on call) are required: a number without either is a guess."""
        assert unit and description, f"panel {title!r} needs a unit and a description"
        if self.x + w > 24:
            self.x, self.y = 0, self.y + self.row_h
            self.row_h = 0
        defaults = {"unit": unit, **(defaults or {})}
        panel = {
            "id": len(self.panels) + 1, "type": ptype, "title": title, "description": description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h},
            "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"},
                         **({"instant": True, "range": False} if instant else {}),
                         **({"format": "table"} if table else {})}
                        for i, (expr, legend) in enumerate(targets)],
            "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
            "options": options or {},
            **({"transformations": transformations} if transformations else {}),
        }
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def dashboard(uid: str, title: str, board: Board, with_job: bool, description: str, fleet: bool = False) -> dict[str, Any]:
    return {
        "uid": uid, "title": title, "description": description, "tags": ["hangd", "gpu"], "timezone": "browser",
        "schemaVersion": 39, "version": 1, "editable": True, "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
        "templating": templating(with_job, fleet), "annotations": {"list": []}, "panels": board.panels,
        "links": [{"title": "hangd incidents", "type": "dashboards", "tags": ["hangd"], "asDropdown": True}],
    }


STATE_COLORS = {"starting": "blue", "loading": "purple", "compiling": "orange", "graph_capture": "yellow",
                "busy": "green", "idle": "text", "waiting_peer": "light-orange", "straggler": "dark-orange",
                "hung": "red", "orphaned": "dark-red"}


def node_view() -> dict[str, Any]:
    b = Board()
    b.add("state-timeline", "What every rank is doing",
          [(f"max by (hangd_job, rank, state) (hangd_process_state{{{JSEL}}} == 1)", "{{hangd_job}} rank {{rank}}: {{state}}")],
          w=24, h=10, unit="none", description="One row per rank and state: the bar shows when the rank was in it. "
                                               "hung and orphaned need a person; see the operator guide's states table.",
          options={"mergeValues": True, "showValue": "never", "rowHeight": 0.8})
    b.add("timeseries", "GPU utilization vs SM activity",
          [(f"hangd_gpu_utilization_ratio{{{SEL}}}", "util gpu {{gpu}}"),
           (f"hangd_gpu_sm_active_ratio{{{SEL}}}", "SM active gpu {{gpu}}"),
           (f"hangd_gpu_tensor_active_ratio{{{SEL}}}", "tensor gpu {{gpu}}")],
          unit="percentunit", description="Utilization 100% with SM ~18% and no tensor work is a collective spinning on a "
                                          "peer, not work.")
    b.add("timeseries", "GPU power", [(f"hangd_gpu_power_watts{{{SEL}}}", "gpu {{gpu}}")], unit="watt",
          description="A spinning collective draws idle power (~120 W on an H200) at 100% utilization.")
    b.add("timeseries", "Spinning (utilization without SM work)",
          [(f"hangd:gpu_spinning:ratio{{{SEL}}}", "gpu {{gpu}}")], unit="percentunit",
          description="Utilization minus SM activity: high for long means a kernel waits on a peer (a collective "
                      "spinning), not work.")
    b.add("timeseries", "NVLink traffic", [(f"hangd_gpu_nvlink_bytes_per_second{{{SEL}}}", "gpu {{gpu}}")], unit="Bps",
          description="NVLink bytes per second, sent and received: collectives that move data; flat at 0 during a "
                      "GPU-side hang.")
    b.add("timeseries", "Seconds since each rank last progressed",
          [(f"time() - hangd_last_progress_timestamp_seconds{{{JSEL}}}", "{{hangd_job}} rank {{rank}}")], unit="s",
          description="Seconds since each rank last showed work done (output, I/O, memory, GPU work, collectives "
                      "advancing). All ranks of a job climbing together past 10 s is a hang.")
    b.add("timeseries", "GPU memory used", [(f"hangd_gpu_memory_used_bytes{{{SEL}}}", "gpu {{gpu}}"),
                                            (f"hangd_process_gpu_memory_bytes{{{JSEL}}}", "{{hangd_job}} rank {{rank}}")],
          unit="bytes", description="GPU memory per GPU and per rank: steps up while loading or capturing graphs; "
                                    "held memory with no live rank is orphaned.")
    b.add("stat", "Jobs by state", [(f"sum by (state) (hangd_job_state{{{JSEL}}} == 1)", "{{state}}")], w=24, h=4,
          instant=True, unit="none", description="How many distributed jobs are in each state now.")
    return dashboard("hangd-node", "hangd / node: what is every GPU doing", b, True,
                     "States per rank, GPU readings that tell work from spinning, progress per rank.")


def incidents_view() -> dict[str, Any]:
    b = Board()
    b.add("stat", "Open incidents", [(f"sum by (kind) (hangd_incidents_open{{{SEL}}})", "{{kind}}")], w=24, h=4,
          instant=True, unit="none", description="Incidents open now, by kind. Each is explained at /incidents/{id} "
                                                 "on its node.")
    b.add("table", "Open incidents (click to open in hangd)",
          [(f"hangd_incident_opened_timestamp_seconds{{{SEL}}} * on (instance, incident) "
            f"group_left (kind, severity, culprit_ranks, url) hangd_incident_info{{{SEL}}} * 1000", "")],
          w=24, h=8, instant=True,
          overrides=[{"matcher": {"id": "byName", "options": "incident"},
                      "properties": [{"id": "links", "value": [{"title": "incident", "targetBlank": True,
                                                                 "url": "${__data.fields.url}"}]}]}],
          unit="dateTimeAsIso", description="When each open incident opened, its kind and culprit ranks; the incident "
                                            "id opens it in hangd (summary, culprit rank, next step, evidence) "
                                            "through its signed link, without a token.")
    b.add("timeseries", "Incidents opened", [(f"sum by (kind) (increase(hangd_incidents_total{{{SEL}}}[$__rate_interval]))",
                                              "{{kind}}")], unit="none",
          description="Incidents opened per interval, by kind.")
    b.add("timeseries", "Time to detect p50 / p90 (last hour)",
          [(f"histogram_quantile(0.5, sum by (le, kind) (increase(hangd_incident_detection_seconds_bucket{{{SEL}}}[1h])))",
            "p50 {{kind}}"),
           (f"histogram_quantile(0.9, sum by (le, kind) (increase(hangd_incident_detection_seconds_bucket{{{SEL}}}[1h])))",
            "p90 {{kind}}")],
          unit="s", description="Seconds from a job's last progress to its incident opening, over the incidents "
                                "opened in the last hour, by kind.")
    b.add("timeseries", "Hung jobs", [(f'hangd_job_state{{{SEL}, state="hung"}} == 1', "{{hangd_job}}")], w=24,
          unit="bool_on_off", description="Jobs judged hung: no rank progresses and some rank is positively stuck.")
    return dashboard("hangd-incidents", "hangd / incidents", b, False, "Open and recent incidents, time to detect.")


def self_view() -> dict[str, Any]:
    b = Board()
    b.add("timeseries", "Sources reading (1) or failing (0)", [(f"hangd_collector_success{{{SEL}}}", "{{instance}} {{collector}}")],
          unit="bool_yes_no", description="Whether each source (nvml, proc, output, flight, stacks, store) read on the "
                                          "last tick. nvml at 0: GPUs cannot be seen; `hangd status` says why.")
    b.add("timeseries", "Source cost per tick", [(f"hangd_collector_duration_seconds{{{SEL}}}", "{{instance}} {{collector}}")],
          unit="s", description="Seconds each source took on the last tick.")
    b.add("timeseries", "Tick cost p50 / p99",
          [(f"histogram_quantile(0.5, sum by (le, instance) (rate(hangd_tick_duration_seconds_bucket{{{SEL}}}[$__rate_interval])))", "p50 {{instance}}"),
           (f"histogram_quantile(0.99, sum by (le, instance) (rate(hangd_tick_duration_seconds_bucket{{{SEL}}}[$__rate_interval])))", "p99 {{instance}}")],
          unit="s", description="Cost of one sample + analysis tick. Above 0.5 s detection gets late (HangdSlowTicks).")
    b.add("timeseries", "hangd CPU", [(f"rate(process_cpu_seconds_total{{{SEL}}}[$__rate_interval])", "{{instance}}")],
          unit="percentunit", description="CPU hangd itself uses, in cores (1 = 100% of one core). The systemd unit "
                                          "caps it at 50%.")
    b.add("timeseries", "hangd memory", [(f"process_resident_memory_bytes{{{SEL}}}", "{{instance}}")],
          unit="bytes", description="hangd's resident memory. The systemd unit caps it at 512 MB.")
    b.add("timeseries", "Store backlog and failed ticks",
          [(f"hangd_store_pending_batches{{{SEL}}}", "store queue {{instance}}"),
           (f"increase(hangd_tick_failures_total{{{SEL}}}[$__rate_interval])", "failed ticks {{instance}}")],
          unit="none", description="Writes queued because the store failed (they are retried), and ticks that "
                                   "failed. Both should stay at 0.")
    b.add("timeseries", "Series dropped", [(f"increase(hangd_series_dropped_total{{{SEL}}}[$__rate_interval])",
                                            "{{instance}} {{reason}}")],
          unit="none", description="Per-process series /metrics stopped exporting: of exited processes (gone) or "
                                   "beyond metrics_max_processes (cap).")
    b.add("stat", "Scraped", [(f'up{{job="hangd", {SEL}}}', "{{instance}}")], instant=True, unit="bool_yes_no",
          description="Whether Prometheus reaches hangd on each node (the scrape job is named hangd).")
    return dashboard("hangd-self", "hangd / health", b, False, "Is hangd itself healthy: sources, tick cost, store.")


# Seconds since a node of a job last reported: hangd itself names a node stopped after node_stale_s
# (its default); HangdJobNodeSilent fires past SILENT_S (tests/deploy checks the rule says the same).
NODE_STALE_S = 15
SILENT_S = 60
HANG_KINDS = "nccl_stall|host_stall|io_stall"
FJ = 'hangd_job=~"$job"'
FJN = 'hangd_job=~"$job", node=~"$node"'


def fleet_view() -> dict[str, Any]:
    """Jobs across every node. A job that spans nodes is exported by each of its nodes' hangd: every
    query here takes one value per job (or per job and node) across them, never a sum over nodes."""
    b = Board()
    b.add("stat", "Jobs by state, each job once across all nodes",
          [(f"count by (state) (hangd:job_state:worst{{{FJ}}})", "{{state}}")], w=24, h=4, instant=True, unit="none",
          description="How many jobs are in each state now, over the whole fleet. A job whose ranks run on several "
                      "nodes counts once (not once per node), in the worst state any of its nodes sees it in; "
                      "hung and orphaned need a person.",
          options={"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "background", "graphMode": "none"},
          overrides=[{"matcher": {"id": "byName", "options": st},
                      "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": c}}]}
                     for st, c in STATE_COLORS.items()])
    b.add("state-timeline", "Each job's state across its nodes",
          [(f"hangd:job_state:worst{{{FJ}}} == 1", "{{hangd_job}}: {{state}}")], w=24, h=8, unit="none",
          description="One row per job and state, the worst state any node of the job reports (a job on several "
                      "nodes is one row, not one per node): when it went hung, and whether it recovered.",
          options={"mergeValues": True, "showValue": "never", "rowHeight": 0.8})
    b.add("table", "Jobs: state, nodes, ranks",
          [(f"hangd:job_state:worst{{{FJ}}}", ""),
           # a job on one node has no per-node series: its node is the one hangd exporting it
           (f"count by (hangd_job) (max by (hangd_job, node) (hangd_job_node_ranks{{{FJ}}})) "
            f"or count by (hangd_job) (max by (hangd_job, instance) (hangd_job_ranks{{{FJ}}}))", ""),
           (f"sum by (hangd_job) (max by (hangd_job, node) (hangd_job_node_ranks{{{FJ}}})) "
            f"or max by (hangd_job) (hangd_job_ranks{{{FJ}}})", "")],
          w=24, h=7, instant=True, table=True, unit="none",
          description="Every job once: its key (the same on all its nodes), its worst state, how many nodes "
                      "run its ranks and how many ranks there are in all. More nodes than expected: two launches "
                      "share a key; fewer: a node never joined.",
          transformations=[{"id": "merge", "options": {}},
                           {"id": "organize", "options": {
                               "excludeByName": {"Time": True, "Value #A": True},
                               "renameByName": {"hangd_job": "job", "Value #B": "nodes", "Value #C": "ranks"},
                               "indexByName": {"hangd_job": 0, "state": 1, "Value #B": 2, "Value #C": 3}}}])
    b.add("timeseries", "Nodes reporting each job",
          [(f"count by (hangd_job) (hangd:job_node_seconds_since_report{{{FJ}}} <= {SILENT_S})", "{{hangd_job}}")],
          unit="none", options={"legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull"]}},
          description=f"Jobs that span nodes: how many of each job's nodes reported in the last {SILENT_S} s. "
                      "A drop is a node whose hangd died or lost the database (see the next panels); its ranks "
                      "are not judged meanwhile.")
    b.add("bargauge", "Ranks per node",
          [(f"max by (hangd_job, node) (hangd_job_node_ranks{{{FJN}}})", "{{hangd_job}} {{node}}")],
          instant=True, unit="none", options={"displayMode": "basic", "orientation": "horizontal", "showUnfilled": True},
          description="Jobs that span nodes: how many ranks each node runs for each job, as the job's nodes "
                      "report them. A node missing here never joined the job, or its ranks exited.")
    b.add("timeseries", "Seconds since each node last reported",
          [(f"hangd:job_node_seconds_since_report{{{FJN}}}", "{{hangd_job}} {{node}}")], w=24, unit="s",
          description=f"Jobs that span nodes: the age of each node's latest report. Past {NODE_STALE_S} s (orange) "
                      f"the other nodes name it stopped and never blame its ranks; past {SILENT_S} s (red) "
                      "HangdJobNodeSilent fires: check hangd on that node and its database connection.",
          defaults={"color": {"mode": "thresholds"}, "min": 0,
                    "thresholds": {"mode": "absolute", "steps": [
                        {"color": "green", "value": None}, {"color": "orange", "value": NODE_STALE_S},
                        {"color": "red", "value": SILENT_S}]},
                    "custom": {"thresholdsStyle": {"mode": "line+area"}}})
    b.add("table", "Open hang incidents and their culprit ranks",
          [(f"max by (hangd_job, kind, culprit_ranks) (hangd_incident_opened_timestamp_seconds{{{FJ}}} "
            f'* on (instance, incident) group_left (kind, culprit_ranks) hangd_incident_info{{kind=~"{HANG_KINDS}", '
            f"{FJ}}}) * 1000", "")],
          w=24, h=7, instant=True, table=True, unit="dateTimeAsIso",
          description="Every hung job once, with the global ranks hangd names as the ones the others wait for, "
                      "and when it opened. The incident (GET /incidents?job=<job> on any node of the job) says "
                      "which node runs the culprit and what it does: read it before killing anything.",
          transformations=[{"id": "organize", "options": {
              "excludeByName": {"Time": True},
              "renameByName": {"hangd_job": "job", "culprit_ranks": "culprit ranks", "Value": "opened"},
              "indexByName": {"hangd_job": 0, "culprit_ranks": 1, "kind": 2, "Value": 3}}}])
    return dashboard("hangd-fleet", "hangd / fleet: jobs across nodes", b, True,
                     "Every job once across all nodes: states, nodes and ranks per job, silent nodes, hangs and "
                     "their culprits.", fleet=True)


def main() -> None:
    for name, d in (("hangd-node.json", node_view()), ("hangd-incidents.json", incidents_view()),
                    ("hangd-self.json", self_view()), ("hangd-fleet.json", fleet_view())):
        (HERE / name).write_text(json.dumps(d, indent=2) + "\n")


if __name__ == "__main__":
    main()
