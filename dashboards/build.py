"""Builds the Grafana dashboards (JSON, current schema) from one place: `python dashboards/build.py`.

Every panel query is proven against a real Prometheus scraping a real hangd in
tests/deploy/test_dashboards.py; the metric names are checked against /metrics there too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SEL = 'instance=~"$node"'
JSEL = 'instance=~"$node", job=~"$job"'


def templating(with_job: bool) -> dict[str, Any]:
    ds = {"type": "prometheus", "uid": "${datasource}"}
    lst: list[dict[str, Any]] = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus", "current": {},
         "hide": 0, "refresh": 1},
        {"name": "node", "label": "Node", "type": "query", "datasource": ds,
         "query": {"query": "label_values(hangd_build_info, instance)", "refId": "node"},
         "definition": "label_values(hangd_build_info, instance)", "refresh": 2, "includeAll": True, "multi": True,
         "allValue": ".+", "current": {}},
    ]
    if with_job:
        lst.append({"name": "job", "label": "Job", "type": "query", "datasource": ds,
                    "query": {"query": 'label_values(hangd_job_state{instance=~"$node"}, job)', "refId": "job"},
                    "definition": 'label_values(hangd_job_state{instance=~"$node"}, job)', "refresh": 2,
                    "includeAll": True, "multi": True, "allValue": ".+", "current": {}})
    return {"list": lst}


class Board:
    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.y = 0
        self.x = 0
        self.row_h = 0

    def add(self, ptype: str, title: str, targets: list[tuple[str, str]], w: int = 12, h: int = 8,
            description: str = "", unit: str | None = None, options: dict[str, Any] | None = None,
            overrides: list[dict[str, Any]] | None = None, instant: bool = False) -> None:
        if self.x + w > 24:
            self.x, self.y = 0, self.y + self.row_h
            self.row_h = 0
        defaults: dict[str, Any] = {}
        if unit:
            defaults["unit"] = unit
        panel = {
            "id": len(self.panels) + 1, "type": ptype, "title": title, "description": description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h},
            "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"},
                         **({"instant": True, "range": False} if instant else {})}
                        for i, (expr, legend) in enumerate(targets)],
            "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
            "options": options or {},
        }
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def dashboard(uid: str, title: str, board: Board, with_job: bool, description: str) -> dict[str, Any]:
    return {
        "uid": uid, "title": title, "description": description, "tags": ["hangd", "gpu"], "timezone": "browser",
        "schemaVersion": 39, "version": 1, "editable": True, "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
        "templating": templating(with_job), "annotations": {"list": []}, "panels": board.panels,
        "links": [{"title": "hangd incidents", "type": "dashboards", "tags": ["hangd"], "asDropdown": True}],
    }


STATE_COLORS = {"starting": "blue", "loading": "purple", "compiling": "orange", "graph_capture": "yellow",
                "busy": "green", "idle": "text", "waiting_peer": "light-orange", "straggler": "dark-orange",
                "hung": "red", "orphaned": "dark-red"}


def node_view() -> dict[str, Any]:
    b = Board()
    b.add("state-timeline", "What every rank is doing",
          [(f"max by (job, rank, state) (hangd_process_state{{{JSEL}}} == 1)", "{{job}} rank {{rank}}: {{state}}")],
          w=24, h=10, description="One row per rank and state: the bar shows when the rank was in it.",
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
          [(f"hangd:gpu_spinning:ratio{{{SEL}}}", "gpu {{gpu}}")], unit="percentunit")
    b.add("timeseries", "NVLink traffic", [(f"hangd_gpu_nvlink_bytes_per_second{{{SEL}}}", "gpu {{gpu}}")], unit="Bps")
    b.add("timeseries", "Seconds since each rank last progressed",
          [(f"time() - hangd_last_progress_timestamp_seconds{{{JSEL}}}", "{{job}} rank {{rank}}")], unit="s")
    b.add("timeseries", "GPU memory used", [(f"hangd_gpu_memory_used_bytes{{{SEL}}}", "gpu {{gpu}}"),
                                            (f"hangd_process_gpu_memory_bytes{{{JSEL}}}", "{{job}} rank {{rank}}")],
          unit="bytes")
    b.add("stat", "Jobs by state", [(f"sum by (state) (hangd_job_state{{{JSEL}}} == 1)", "{{state}}")], w=24, h=4,
          instant=True)
    return dashboard("hangd-node", "hangd / node: what is every GPU doing", b, True,
                     "States per rank, GPU readings that tell work from spinning, progress per rank.")


def incidents_view() -> dict[str, Any]:
    b = Board()
    b.add("stat", "Open incidents", [(f"sum by (kind) (hangd_incidents_open{{{SEL}}})", "{{kind}}")], w=24, h=4,
          instant=True)
    b.add("table", "Open incidents (click to open in hangd)",
          [(f"hangd_incident_opened_timestamp_seconds{{{SEL}}} * 1000", "")], w=24, h=8, instant=True,
          overrides=[{"matcher": {"id": "byName", "options": "id"},
                      "properties": [{"id": "links", "value": [{"title": "incident",
                                                                 "url": "http://${__data.fields.instance}/incidents/${__value.raw}"}]}]}],
          unit="dateTimeAsIso")
    b.add("timeseries", "Incidents opened", [(f"sum by (kind) (increase(hangd_incidents_total{{{SEL}}}[$__rate_interval]))",
                                              "{{kind}}")])
    b.add("timeseries", "Time to detect", [(f"hangd_incident_detection_seconds{{{SEL}}}", "#{{id}} {{kind}} {{job}}")],
          unit="s", description="Seconds from the job's last progress to the incident opening.")
    b.add("timeseries", "Hung jobs", [(f'hangd_job_state{{{SEL}, state="hung"}} == 1', "{{job}}")], w=24)
    return dashboard("hangd-incidents", "hangd / incidents", b, False, "Open and recent incidents, time to detect.")


def self_view() -> dict[str, Any]:
    b = Board()
    b.add("timeseries", "Sources reading (1) or failing (0)", [(f"hangd_collector_success{{{SEL}}}", "{{instance}} {{collector}}")])
    b.add("timeseries", "Source cost per tick", [(f"hangd_collector_duration_seconds{{{SEL}}}", "{{instance}} {{collector}}")],
          unit="s")
    b.add("timeseries", "Tick cost p50 / p99",
          [(f"histogram_quantile(0.5, sum by (le, instance) (rate(hangd_tick_duration_seconds_bucket{{{SEL}}}[$__rate_interval])))", "p50 {{instance}}"),
           (f"histogram_quantile(0.99, sum by (le, instance) (rate(hangd_tick_duration_seconds_bucket{{{SEL}}}[$__rate_interval])))", "p99 {{instance}}")],
          unit="s")
    b.add("timeseries", "hangd CPU and memory",
          [(f"rate(process_cpu_seconds_total{{{SEL}}}[$__rate_interval])", "cpu cores {{instance}}"),
           (f"process_resident_memory_bytes{{{SEL}}} / 1e9", "RSS GB {{instance}}")])
    b.add("timeseries", "Store backlog and failed ticks",
          [(f"hangd_store_pending_batches{{{SEL}}}", "store queue {{instance}}"),
           (f"increase(hangd_tick_failures_total{{{SEL}}}[$__rate_interval])", "failed ticks {{instance}}")])
    b.add("stat", "Scraped", [(f'up{{job="hangd", {SEL}}}', "{{instance}}")], instant=True)
    return dashboard("hangd-self", "hangd / health", b, False, "Is hangd itself healthy: sources, tick cost, store.")


def main() -> None:
    for name, d in (("hangd-node.json", node_view()), ("hangd-incidents.json", incidents_view()),
                    ("hangd-self.json", self_view())):
        (HERE / name).write_text(json.dumps(d, indent=2) + "\n")


if __name__ == "__main__":
    main()
