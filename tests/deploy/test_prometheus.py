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
from ..realpg import free_port
from ..served import serve
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
    """Each runbook_url is the guide a hangd serves (hangd_runbook_info: http(s), never file://)
    and a section of it that exists."""
    anchors = _anchors(GUIDE.read_text())
    alerts = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 9
    for a in alerts:
        url = a["annotations"].get("runbook_url", "")
        assert url.startswith('{{ with query "max by (url) (hangd_runbook_info)" }}'), a["alert"]
        assert url.split("#", 1)[1] in anchors, f"{a['alert']}: no section #{url.split('#', 1)[1]} in the operator guide"
    assert "file://" not in RULES.read_text()


def test_incident_alerts_are_keyed_on_the_incident_alone():
    """What may change while an incident is open (kind, culprit, severity) is never an alert label:
    the expressions keep only incident, hangd_job and node (promtool's tests change kind and
    culprit under a firing alert)."""
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]
    per_incident = [r for r in rules if "hangd_incident_opened_timestamp_seconds" in r["expr"] and "Fleet" not in r["alert"]]
    assert len(per_incident) == 5
    for r in per_incident:
        assert r["expr"].startswith("max by (incident, hangd_job, node) ("), r["alert"]
        assert "group_left" not in r["expr"], r["alert"]
        assert r["annotations"]["incident"].endswith('{{ label "url" $i }}{{ end }}'), r["alert"]


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
    """A real hangd serving a replayed nccl_stall with a write and a read token, links under its
    external URL, and a real Prometheus scraping it with the read token and our rules."""
    tmp = tmp_path_factory.mktemp("prom")
    (tmp / "token").write_text("write-" + "w" * 32 + "\n")
    (tmp / "read-token").write_text("read-" + "r" * 32 + "\n")
    port = free_port()
    s = serve(tmp, "--replay", str(TRACES / "nccl_stall"), "--speed", "0.5", "--token-file", str(tmp / "token"),
              "--read-token-file", str(tmp / "read-token"), "--node-name", "127.0.0.1",
              "--external-url", f"http://{{node}}:{port}", port=port)
    alerts_seen: list[dict] = []
    while_open: list[str] = []
    try:
        with prometheus(tmp, [s.url], bearer=READ) as base:
            t_end = time.time() + 150
            while time.time() < t_end:
                try:
                    a = httpx.get(base + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]
                    alerts_seen += [x for x in a if x["state"] == "firing"]
                    if alerts_seen and not while_open:  # what /metrics says while the incident is open
                        while_open.append(s.get("/metrics", headers={"Authorization": f"Bearer {READ}"}).text)
                    if s.get("/readyz").json()["detail"].startswith("replay finished") and alerts_seen:
                        break
                except (httpx.HTTPError, ValueError):  # Prometheus answers 503 in plain text while it starts
                    pass
                time.sleep(1)
            yield {"prom": base, "hangd": s, "alerts": alerts_seen, "start": time.time() - 160, "tmp": tmp,
                   "metrics_while_open": while_open[0] if while_open else ""}
    finally:
        s.stop()


READ = "read-" + "r" * 32
WRITE = "write-" + "w" * 32


def _metrics(stack) -> str:
    return stack["hangd"].get("/metrics", headers={"Authorization": f"Bearer {READ}"}).text


@pytest.mark.prometheus
def test_hung_job_alert_fires_from_a_real_scrape(stack):
    hung = [a for a in stack["alerts"] if a["labels"]["alertname"] == "HangdJobHung"]
    assert hung, (stack["tmp"] / "prom.log").read_text()[-2000:]
    # one alert for the incident, every time Prometheus was asked, keyed on the incident alone
    assert {tuple(sorted(a["labels"].items())) for a in hung} == {tuple(sorted(hung[0]["labels"].items()))}
    a = hung[0]
    assert set(a["labels"]) == {"alertname", "severity", "incident", "hangd_job", "node"}
    assert a["labels"]["node"] == "127.0.0.1"
    assert "(nccl_stall)" in a["annotations"]["summary"] and "rank(s) 1 " in a["annotations"]["description"]
    iid = a["labels"]["incident"]
    got = stack["hangd"].get(f"/incidents/{iid}", headers={"Authorization": f"Bearer {READ}"}).json()
    assert got["kind"] == "nccl_stall"


@pytest.mark.prometheus
def test_the_fired_alerts_links_open_without_a_token_and_cannot_ack(stack):
    """What a person on call clicks: the incident link of the fired alert opens in a browser (no
    header: its signature is the read-only credential), the runbook too; neither the link nor the
    read token acks (403), the write token does."""
    a = next(a for a in stack["alerts"] if a["labels"]["alertname"] == "HangdJobHung")
    link = a["annotations"]["incident"]
    iid = a["labels"]["incident"]
    assert link.startswith(f"{stack['hangd'].url}/incidents/{iid}?sig="), link  # the external URL, not a pod IP
    page = httpx.get(link, timeout=10)
    assert page.status_code == 200, page.text
    assert page.json()["id"] == int(iid) and page.json()["kind"] == "nccl_stall"
    assert httpx.get(link.split("?")[0], timeout=10).status_code == 401
    assert httpx.get(link[:-1] + ("0" if link[-1] != "0" else "1"), timeout=10).status_code == 401
    other = link.replace(f"/incidents/{iid}?", f"/incidents/{int(iid) + 1}?")
    assert httpx.get(other, timeout=10).status_code == 401  # the signature opens its own incident only
    assert httpx.get(f"{stack['hangd'].url}/incidents?{link.split('?')[1]}", timeout=10).status_code == 401
    runbook = httpx.get(a["annotations"]["runbook_url"], timeout=10)
    assert runbook.status_code == 200 and 'id="hangdjobhung"' in runbook.text
    assert a["annotations"]["runbook_url"].startswith(f"{stack['hangd'].url}/docs/runbook#")
    ack = f"{stack['hangd'].url}/incidents/{iid}/ack"
    refused = httpx.post(ack, headers={"Authorization": f"Bearer {READ}"}, timeout=10)
    assert refused.status_code == 403 and "write token" in refused.json()["detail"]
    assert httpx.post(ack + "?" + link.split("?")[1], timeout=10).status_code == 401
    assert httpx.get(link, timeout=10).json()["acked"] is False
    assert httpx.post(ack, headers={"Authorization": f"Bearer {WRITE}"}, timeout=10).status_code == 200
    assert httpx.get(link, timeout=10).json()["acked"] is True


@pytest.mark.prometheus
def test_time_to_detect_is_a_histogram(stack):
    text = _metrics(stack)
    assert re.search(r'^hangd_incident_detection_seconds_bucket\{kind="nccl_stall",le="\+Inf"\} 1\.0$', text, re.M)
    assert not re.search(r"^hangd_incident_detection_seconds\{", text, re.M)  # no gauge per incident


@pytest.mark.prometheus
@pytest.mark.parametrize("where,expr", _exprs(), ids=[w for w, _ in _exprs()])
def test_every_dashboard_query_returns_data(stack, where, expr):
    assert query_range(stack["prom"], subst(expr), stack["start"]), f"{where}: no data for {subst(expr)}"


@pytest.mark.prometheus
def test_every_metric_named_by_dashboards_and_rules_exists(stack):
    text = _metrics(stack)
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
    text = _metrics(stack)
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


METRICS_DOC = ROOT / "docs" / "metrics.md"


def _reference() -> dict[str, tuple[str, set[str], str]]:
    """family -> (type, labels, what) of the table in docs/metrics.md."""
    rows = re.findall(r"^\| `([a-z_]+)` \| (\w+) \|([^|]*)\|([^|]*)\|$", METRICS_DOC.read_text(), re.M)
    return {name: (typ, set(re.findall(r"`(\w+)`", labels)), what.strip()) for name, typ, labels, what in rows}


@pytest.mark.prometheus
def test_the_metrics_reference_is_what_metrics_exposes(stack):
    """docs/metrics.md names every family a real hangd exposes, with its type and labels, and
    nothing it does not (the families of jobs that span nodes: tests/fleet scrapes them)."""
    text = stack["metrics_while_open"]
    ref = _reference()
    assert len(ref) >= 40
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    histograms = {n for n, t in types.items() if t == "histogram"}
    exposed = {n: t for n, t in types.items() if not (n.endswith("_created") and n.removesuffix("_created") in histograms)}
    labels: dict[str, set[str]] = {}
    for name, body in re.findall(r"^([a-z_]+)\{([^}]*)\}", text, re.M):
        base = re.sub(r"_(bucket|sum|count|created)$", "", name) if re.sub(r"_(bucket|sum|count|created)$", "", name) in histograms else name
        labels.setdefault(base, set()).update(k for k in re.findall(r'(\w+)="', body) if k != "le")
    fleet_only = {n for n, (_, _, what) in ref.items() if what.startswith("Fleet only")}
    assert fleet_only == {"hangd_job_node_last_report_timestamp_seconds", "hangd_job_node_ranks"}
    assert set(exposed) == set(ref) - fleet_only
    source = (ROOT / "hangd" / "server" / "metrics.py").read_text()
    for n in fleet_only:
        assert f'"{n}"' in source, n
    for n, t in exposed.items():
        assert ref[n][0] == t, (n, t)
        if n in labels:  # (a family with no series in this replay, hardware errors say, shows no labels)
            assert labels[n] == ref[n][1], (n, labels[n])
    assert {"hangd_incident_opened_timestamp_seconds", "hangd_incident_info", "hangd_process_state"} <= set(labels)


@pytest.mark.prometheus
def test_the_dcgm_joins_of_the_reference_hold(tmp_path):
    """The two PromQL joins with dcgm-exporter's series in docs/metrics.md, on series shaped like
    both exporters' (dcgm-exporter labels a GPU UUID and gpu, hangd uuid and gpu)."""
    blocks = re.findall(r"```promql\n# [^\n]*DCGM[^\n]*\n(.*?)```", METRICS_DOC.read_text(), re.S)
    assert len(blocks) == 2, blocks
    dcgm = 'UUID="GPU-{u}",gpu="{g}",Hostname="n1",instance="n1:9400",job="dcgm",modelName="NVIDIA H200"'
    hangd = 'uuid="GPU-{u}",gpu="{g}",instance="n1:9877",job="hangd"'
    series = []
    for u, g, temp, sm_dcgm, util, sm in (("a", 0, 71, 0.5, 0.9, 0.25), ("b", 1, 55, 0.75, 0.75, 0.75)):
        series += [{"series": f"DCGM_FI_DEV_GPU_TEMP{{{dcgm.format(u=u, g=g)}}}", "values": f"{temp}x8"},
                   {"series": f"DCGM_FI_PROF_SM_ACTIVE{{{dcgm.format(u=u, g=g)}}}", "values": f"{sm_dcgm}x8"},
                   {"series": f"hangd_gpu_utilization_ratio{{{hangd.format(u=u, g=g)}}}", "values": f"{util}x8"},
                   {"series": f"hangd_gpu_sm_active_ratio{{{hangd.format(u=u, g=g)}}}", "values": f"{sm}x8"}]
    spinning, diff = (" ".join(b.split()) for b in blocks)
    a, b = dcgm.format(u="a", g=0).replace("UUID", 'uuid="GPU-a",UUID', 1), dcgm.format(u="b", g=1).replace("UUID", 'uuid="GPU-b",UUID', 1)
    test = {"rule_files": [str(RULES)], "evaluation_interval": "15s", "tests": [{
        "interval": "15s", "input_series": series,
        "promql_expr_test": [
            {"expr": spinning, "eval_time": "1m", "exp_samples": [{"labels": f"DCGM_FI_DEV_GPU_TEMP{{{a}}}", "value": 71}]},
            {"expr": diff, "eval_time": "1m", "exp_samples": [{"labels": f"{{{a}}}", "value": 0.25},
                                                              {"labels": f"{{{b}}}", "value": 0.0}]}]}]}
    (tmp_path / "dcgm.test.yml").write_text(yaml.safe_dump(test))
    out = subprocess.run([promtool(), "test", "rules", str(tmp_path / "dcgm.test.yml")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
