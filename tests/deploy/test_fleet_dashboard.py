"""The fleet board (dashboards/hangd-fleet.json) against a real Prometheus scraping two real
`hangd serve`, each a node of its own (tests/fleet/nodes.py: a PID namespace per node), sharing one
real PostgreSQL, while a real 2-rank gloo job spans them (torchrun --nnodes 2, one rank per node)
and hangs: rank 1, on node-b, stops calling collectives; rank 0, on node-a, waits in all_reduce.
Both nodes' hangd export the job; the board shows it once."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest
import yaml
from sqlalchemy import create_engine, text

from hangd.analysis.model import SEVERITY_ORDER, State
from hangd.config import Settings

from ..conftest import ROOT, postgres_url, torch_available  # noqa: F401 - imported, postgres_url is a PostgreSQL of this module alone
from ..fleet.nodes import torchrun, two_nodes, wait_for
from ..realpg import free_port
from .prom import FLEET, RULES, exprs, prometheus, query, query_range, subst

pytestmark = [pytest.mark.skipif(not torch_available(), reason="torch is a test dependency"),
              pytest.mark.torchrun, pytest.mark.postgres, pytest.mark.prometheus]
BOARD = json.loads(FLEET.read_text())
PANELS = {p["title"]: p for p in BOARD["panels"]}


def _panel(word: str) -> dict:
    (p,) = [p for t, p in PANELS.items() if word in t]
    return p


def _fresh_db(url: str, name: str) -> str:
    """A database of its own on the tests' PostgreSQL: what other fleet tests left is not seen here."""
    eng = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with eng.connect() as c:
            c.execute(text(f"DROP DATABASE IF EXISTS {name}"))
            c.execute(text(f"CREATE DATABASE {name}"))
    finally:
        eng.dispose()
    return url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="module")
def fleet_stack(tmp_path_factory, postgres_url) -> Iterator[dict]:  # noqa: F811 - the fixture
    tmp = tmp_path_factory.mktemp("fleet-board")
    db = _fresh_db(postgres_url, "hangd_fleet_board")
    with two_nodes(tmp, db) as (nodes, served), prometheus(tmp, [s.url for s, _ in served.values()]) as prom:
        start = time.time()
        port = free_port()
        key = f"rdzv:127.0.0.1:{port}"
        jobs = [torchrun(nodes[n], i, port, "board", "deadlock", "--steps", "20", "--step-sleep", "0.05",
                         "--culprit", "1", nproc=1) for i, n in enumerate(nodes)]
        logs = [tmp / f"job-board-{n}.log" for n in nodes] + [s.log for s, _ in served.values()] + [tmp / "prom.log",
                                                                                                 tmp / "missing.txt"]
        try:
            # every panel has something to show for this job, both nodes' hangd export it, and it is hung
            def ready() -> bool:
                both = f'count(hangd_job_state{{hangd_job="{key}"}} == 1) == 2'
                hung = f'hangd:job_state:worst{{hangd_job="{key}", state="hung"}}'
                missing = [w for w, e in [*exprs([FLEET]), ("the job on both nodes", both), ("the job hung", hung)]
                           if not query(prom, subst(e, key))]
                (tmp / "missing.txt").write_text("".join(f"no data yet: {w}\n" for w in missing))
                return not missing
            wait_for(ready, 120, "the hung job from both nodes, in Prometheus", logs)
            yield {"prom": prom, "key": key, "start": start, "nodes": nodes, "served": served, "logs": logs}
        finally:
            for n, p in zip(nodes, jobs, strict=True):
                nodes[n].kill_tree(p)


def test_jobs_by_state_counts_a_job_on_two_nodes_once(fleet_stack):
    prom, key = fleet_stack["prom"], fleet_stack["key"]
    expr = _panel("Jobs by state")["targets"][0]["expr"]
    # both nodes export the job, each in the state it sees from its own ranks: summed over nodes (as
    # the node board does) it is 2 jobs, maybe in two states
    naive = query(prom, f'sum by (state) (hangd_job_state{{hangd_job="{key}"}} == 1)')
    seen = query(prom, f'hangd_job_state{{hangd_job="{key}"}} == 1')
    node_of = {s.url.removeprefix("http://"): n for n, (s, _) in fleet_stack["served"].items()}
    print("\nthe job as each node exports it:", {node_of[r["metric"]["instance"]]: r["metric"]["state"] for r in seen})
    assert sum(float(r["value"][1]) for r in naive) == 2, naive
    now = query(prom, subst(expr, key))
    assert [(r["metric"], r["value"][1]) for r in now] == [({"state": "hung"}, "1")], now
    # and at every moment since the job started, whatever state each node saw it in: one job
    per_step: dict[float, float] = {}
    for r in query_range(prom, subst(expr, key), fleet_stack["start"]):
        for t, v in r["values"]:
            per_step[t] = per_step.get(t, 0.0) + float(v)
    assert per_step and set(per_step.values()) == {1.0}, per_step
    # all jobs selected: never more than there are job keys (the recorded series may lag the
    # scraped ones by an evaluation, at either end)
    (total,) = query_range(prom, f"sum({subst(expr)})", fleet_stack["start"])
    (keys,) = query_range(prom, "count(count by (hangd_job) (hangd_job_state == 1))", fleet_stack["start"])
    n_keys = dict(keys["values"])
    assert all(float(v) <= float(n_keys.get(t, v)) for t, v in total["values"]), (total, keys)
    assert float(total["values"][-1][1]) == float(keys["values"][-1][1])


@pytest.mark.parametrize("where,expr", exprs([FLEET]), ids=[w for w, _ in exprs([FLEET])])
def test_every_fleet_dashboard_query_returns_data(fleet_stack, where, expr):
    prom, start = fleet_stack["prom"], fleet_stack["start"]
    # the fixture saw every query answer at one instant: a range over the job's life that holds
    # that instant answers too; it is asked again for a few seconds before the test fails, and a
    # failure says what Prometheus held of the query's series then
    t_end = time.time() + 10
    while not (got := query_range(prom, subst(expr), start)) and time.time() < t_end:
        time.sleep(1)
    if not got:
        held = {m: query_range(prom, f"count by (__name__) ({{__name__=~\"{m}\"}})", start)
                for m in sorted(set(re.findall(r"\b(hangd[_:][a-z_:0-9]+)", expr)))}
        pytest.fail(f"{where}: no data for {subst(expr)}; now: {query(prom, subst(expr))}; series held: {held}")


def test_the_jobs_table_says_state_nodes_and_ranks(fleet_stack):
    prom, key = fleet_stack["prom"], fleet_stack["key"]
    state, nodes, ranks = (query(prom, subst(t["expr"], key)) for t in _panel("Jobs: state")["targets"])
    assert [r["metric"] for r in state] == [{"__name__": "hangd:job_state:worst", "hangd_job": key, "state": "hung"}]
    assert [(r["metric"], r["value"][1]) for r in nodes] == [({"hangd_job": key}, "2")]
    assert [(r["metric"], r["value"][1]) for r in ranks] == [({"hangd_job": key}, "2")]
    per_node = query(prom, subst(_panel("Ranks per node")["targets"][0]["expr"], key))
    assert sorted((r["metric"]["node"], r["value"][1]) for r in per_node) == [("node-a", "1"), ("node-b", "1")]
    reporting = query(prom, subst(_panel("Nodes reporting")["targets"][0]["expr"], key))
    assert [r["value"][1] for r in reporting] == ["2"]


def test_the_hang_shows_once_with_its_culprit_rank(fleet_stack):
    prom, key = fleet_stack["prom"], fleet_stack["key"]
    rows = query(prom, subst(_panel("Open hang incidents")["targets"][0]["expr"], key))
    assert [(r["metric"]["hangd_job"], r["metric"]["culprit_ranks"]) for r in rows] == [(key, "1")], rows
    assert rows[0]["metric"]["kind"] in ("nccl_stall", "host_stall", "io_stall")


def test_every_metric_the_fleet_board_names_is_exported(fleet_stack):
    (s, _) = fleet_stack["served"]["node-a"]
    exported = set(re.findall(r"^# TYPE (\w+) ", s.get("/metrics").text, re.M))
    named = {n for _, e in exprs([FLEET]) for n in re.findall(r"\b(hangd_[a-z_]+)\b", e)} - {"hangd_job"}
    assert named and named <= exported, named - exported
    recorded = set(re.findall(r"record: (\S+)", RULES.read_text()))
    assert {r for _, e in exprs([FLEET]) for r in re.findall(r"\b(hangd:[a-z_:0-9]+)", e)} <= recorded


def test_a_node_that_stops_reporting_stands_out(fleet_stack):
    """Last here: node-b's hangd dies. node-a goes on exporting node-b's last report, and the
    seconds-since panel climbs past the orange step for node-b alone."""
    prom, key, nodes = fleet_stack["prom"], fleet_stack["key"], fleet_stack["nodes"]
    nodes["node-b"].kill_tree(fleet_stack["served"]["node-b"][1])
    expr = subst(_panel("Seconds since")["targets"][0]["expr"], key)
    steps = _panel("Seconds since")["fieldConfig"]["defaults"]["thresholds"]["steps"]
    orange = steps[1]["value"]

    def ages() -> dict[str, float] | None:
        a = {r["metric"]["node"]: float(r["value"][1]) for r in query(prom, expr)}
        return a if a.get("node-b", 0.0) > orange else None
    got = wait_for(ages, 60, "node-b's age past the orange step", fleet_stack["logs"])
    assert isinstance(got, dict) and got["node-a"] < orange, got


def test_the_thresholds_are_the_alerts_and_hangds():
    """The red step is where HangdJobNodeSilent fires, the orange one where hangd names a node
    stopped (node_stale_s's default); the severity the rules rank states by is the analysis'."""
    steps = _panel("Seconds since")["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["color"] for s in steps] == ["green", "orange", "red"]
    rules = {r.get("alert") or r["record"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    # the alert computes what the panel shows (the recorded series) and fires past the red step
    silent = rules["HangdJobNodeSilent"]["expr"].strip()
    m = re.fullmatch(re.escape(rules["hangd:job_node_seconds_since_report"]["expr"].strip()) + r" > (\d+)", silent)
    assert m and steps[2]["value"] == int(m.group(1)), silent
    assert steps[1]["value"] == Settings.model_fields["node_stale_s"].default
    weights = dict(re.findall(r'vector\((\d+)\), "state", "(\w+)"', rules["hangd:state_severity"]["expr"]))
    assert {st: int(w) for w, st in weights.items()} == {str(s): w for s, w in SEVERITY_ORDER.items() if s != State.GONE}
    # the board and the docs point at each other
    assert "hangd-fleet" in (ROOT / "docs" / "operator-guide.md").read_text()
