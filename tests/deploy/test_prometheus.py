"""The shipped rules and dashboards against a real Prometheus scraping a real `hangd serve`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from ..conftest import ROOT, TRACES
from ..server.conftest import serve
from .prom import DASHBOARDS, FLEET, RULES, exprs, prometheus, query_range, subst

GUIDE = ROOT / "docs" / "operator-guide.md"


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    out = set()
    for h in re.findall(r"^#+ (.+)$", markdown, re.M):
        out.add(re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-"))
    return out


def promtool() -> str:
    p = shutil.which("promtool")
    assert p, "promtool (Debian's prometheus) is installed by `make test`"
    return p


@pytest.mark.prometheus
def test_promtool_checks_and_unit_tests_pass():
    out = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    tests = sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*.yml"))
    out = subprocess.run([promtool(), "test", "rules", *map(str, tests)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_has_a_runbook_url_to_a_section_that_exists():
    anchors = _anchors(GUIDE.read_text())
    alerts = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 9
    for a in alerts:
        url = a["annotations"].get("runbook_url", "")
        assert url.startswith("file:///opt/hangd/share/doc/operator-guide.md#"), a["alert"]
        assert url.split("#", 1)[1] in anchors, f"{a['alert']}: no section #{url.split('#', 1)[1]} in the operator guide"
    # the guide `make install` puts where the runbook_url points
    assert "docs/operator-guide.md $(PREFIX)/share/doc/operator-guide.md" in (ROOT / "Makefile").read_text()


def test_the_distributed_job_is_hangd_job_never_job():
    rules = RULES.read_text()
    assert "$labels.job " not in rules and "$labels.job}" not in rules and "(instance, job)" not in rules
    assert "honor_labels" not in (ROOT / "deploy" / "prometheus" / "scrape-config.yml").read_text().split("scrape_configs")[1]
    for where, expr in exprs(DASHBOARDS):
        assert not re.search(r"\bjob=~\"\$job\"|by \(job\b|\{\{job\}\}", expr), where
    for p in DASHBOARDS:
        d = json.loads(p.read_text())
        for pan in d["panels"]:
            assert "{{job}}" not in json.dumps(pan), f"{p.name}: {pan['title']}"
        for v in d["templating"]["list"]:
            if v["name"] == "job":
                assert v["definition"].endswith(", hangd_job)"), v


def test_every_panel_has_a_unit_and_a_description():
    for p in DASHBOARDS:
        for pan in json.loads(p.read_text())["panels"]:
            where = f"{p.name}: {pan['title']}"
            assert pan["fieldConfig"]["defaults"].get("unit"), where
            assert len(pan.get("description") or "") >= 20, where


def test_dashboards_are_current_schema_with_variables():
    assert {p.name for p in DASHBOARDS} == {"hangd-node.json", "hangd-incidents.json", "hangd-self.json", "hangd-fleet.json"}
    for p in DASHBOARDS:
        d = json.loads(p.read_text())
        assert d["schemaVersion"] >= 39
        names = {v["name"] for v in d["templating"]["list"]}
        assert {"datasource", "node"} <= names
        assert all(t["datasource"]["uid"] == "${datasource}" for pan in d["panels"] for t in pan["targets"])
    assert "job" in {v["name"] for v in json.loads((ROOT / "dashboards" / "hangd-node.json").read_text())["templating"]["list"]}
    # the JSON is what dashboards/build.py makes: no hand edits drifted from the code
    before = {p.name: p.read_text() for p in DASHBOARDS}
    subprocess.run(["python3", str(ROOT / "dashboards" / "build.py")], check=True)
    assert {p.name: p.read_text() for p in DASHBOARDS} == before


def _exprs() -> list[tuple[str, str]]:
    """The queries of the boards of one node (the fleet board's: test_fleet_dashboard.py)."""
    return exprs([p for p in DASHBOARDS if p != FLEET])


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A real hangd serving a replayed nccl_stall, and a real Prometheus scraping it with our rules."""
    tmp = tmp_path_factory.mktemp("prom")
    s = serve(tmp, "--replay", str(TRACES / "nccl_stall"), "--speed", "0.5")
    alerts_seen: list[dict] = []
    try:
        with prometheus(tmp, [s.url]) as base:
            t_end = time.time() + 150
            while time.time() < t_end:
                try:
                    a = httpx.get(base + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]
                    alerts_seen += [x for x in a if x["state"] == "firing"]
                    if s.get("/readyz").json()["detail"].startswith("replay finished") and alerts_seen:
                        break
                except (httpx.HTTPError, ValueError):  # Prometheus answers 503 in plain text while it starts
                    pass
                time.sleep(1)
            yield {"prom": base, "hangd": s, "alerts": alerts_seen, "start": time.time() - 160, "tmp": tmp}
    finally:
        s.stop()


@pytest.mark.prometheus
def test_hung_job_alert_fires_from_a_real_scrape(stack):
    hung = [a for a in stack["alerts"] if a["labels"]["alertname"] == "HangdJobHung"]
    assert hung, (stack["tmp"] / "prom.log").read_text()[-2000:]
    a = hung[0]
    assert a["labels"]["kind"] == "nccl_stall" and a["labels"]["culprit_ranks"] == "1"
    assert re.search(r"/incidents/\d+$", a["annotations"]["incident"])
    iid = a["labels"]["id"]
    assert stack["hangd"].get(f"/incidents/{iid}").json()["kind"] == "nccl_stall"


@pytest.mark.prometheus
@pytest.mark.parametrize("where,expr", _exprs(), ids=[w for w, _ in _exprs()])
def test_every_dashboard_query_returns_data(stack, where, expr):
    assert query_range(stack["prom"], subst(expr), stack["start"]), f"{where}: no data for {subst(expr)}"


@pytest.mark.prometheus
def test_every_metric_named_by_dashboards_and_rules_exists(stack):
    text = stack["hangd"].get("/metrics").text
    exported = set(re.findall(r"^# TYPE (\w+) ", text, re.M))
    names = set()
    for _, expr in _exprs():
        names |= set(re.findall(r"\b(hangd_[a-z_]+|process_[a-z_]+)\b", expr))
    names |= set(re.findall(r"\b(hangd_[a-z_]+)\b", RULES.read_text()))
    names -= {"hangd_job"}  # the label of the distributed job, not a metric
    # exported only by nodes sharing a database, for jobs that span nodes: tests/fleet scrapes them
    names -= {"hangd_job_node_last_report_timestamp_seconds", "hangd_job_node_ranks"}
    recorded = set(re.findall(r"record: (\S+)", RULES.read_text()))
    missing = set()
    for n in names:
        base = re.sub(r"_(bucket|count|sum|total)$", "", n)
        if n not in exported and base not in exported:
            missing.add(n)
    assert not missing, missing
    for _, expr in _exprs():
        for r in re.findall(r"\b(hangd:[a-z_:0-9]+)", expr):
            assert r in recorded, r
    assert Path(RULES).exists()


@pytest.mark.prometheus
def test_metrics_lint_and_carry_no_job_label(stack):
    text = stack["hangd"].get("/metrics").text
    res = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not re.search(r"[{,]job=", text), "a job label clashes with the scrape job's"
    # (the per-rank series carry hangd_job: the dashboards' queries above got data through it)
    assert re.search(r'^hangd_series_dropped_total\{reason="gone"\} ', text, re.M)


def test_series_of_gone_processes_go_after_the_setting_and_a_cap_holds():
    from hangd.server.metrics import SERIES_PER_PROCESS, SeriesBound

    b = SeriesBound(gone_after_s=300, cap=2)
    procs = [{"pid": 1, "state": "busy", "since": 0.0}, {"pid": 2, "state": "gone", "since": 1000.0},
             {"pid": 3, "state": "gone", "since": 100.0}]
    assert [p["pid"] for p in b.select(procs, now=1200.0)] == [1, 2]  # 3 exited 1100 s ago
    assert b.dropped_total == {"gone": SERIES_PER_PROCESS, "cap": 0}
    assert [p["pid"] for p in b.select(procs, now=1200.0)] == [1, 2]
    assert b.dropped_total["gone"] == SERIES_PER_PROCESS  # counted once, not per scrape
    many = [{"pid": 10 + i, "state": "busy", "since": float(i)} for i in range(5)]
    kept = b.select(many, now=1200.0)
    assert len(kept) == 2 and b.dropped_total["cap"] == 3 * SERIES_PER_PROCESS


@pytest.mark.prometheus
def test_the_fleet_board_shows_a_job_of_one_node_too(stack):
    """A job on one node has no per-node series: the fleet board's table still says its state, one
    node and its ranks (the 2-rank nccl_stall replay)."""
    board = json.loads(FLEET.read_text())
    (table,) = [p for p in board["panels"] if p["title"].startswith("Jobs: state")]
    state, nodes, ranks = (query_range(stack["prom"], subst(t["expr"]), stack["start"]) for t in table["targets"])
    jobs = {r["metric"]["hangd_job"] for r in state}
    assert len(jobs) == 1, state
    assert [(r["metric"]["hangd_job"], r["values"][-1][1]) for r in nodes] == [(jobs.pop(), "1")]
    assert [r["values"][-1][1] for r in ranks] == ["2"]
