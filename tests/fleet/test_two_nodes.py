"""Two nodes on one machine, one real PostgreSQL: each "node" is a PID namespace of its own
(``unshare --pid --fork --mount-proc``) holding a real ``hangd serve`` and one real
``torchrun --nnodes 2 --nproc-per-node 2`` of a 4-rank gloo job; the two torchruns meet at one
rendezvous. Each hangd sees only its namespace's ranks and shares what it sees through the
database. Checked: a healthy job raises nothing; rank 3 on node-b deadlocking (it stops calling
collectives and waits on an event) is one hang incident in the database, seen through both
nodes' APIs, naming rank 3 and node-b; node-b's hangd killed, node-a's view says node-b stopped
reporting and blames nobody on what node-b said last. The nodes are made as tests/fleet/nodes.py says;
the same checks run on GPUs, with NCCL and one GPU per node, in scripts/fleet_gpu.py."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from ..conftest import postgres_url, run_hangd, torch_available  # noqa: F401 - imported, postgres_url is a PostgreSQL of this module alone
from ..realpg import free_port
from ..served import Served
from .nodes import torchrun, two_nodes, wait_for

pytestmark = [pytest.mark.skipif(not torch_available(), reason="torch is a test dependency"),
              pytest.mark.torchrun, pytest.mark.postgres, pytest.mark.prometheus]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, postgres_url) -> Iterator[dict]:  # noqa: F811 - the fixture
    tmp = tmp_path_factory.mktemp("fleet")
    with two_nodes(tmp, postgres_url) as (nodes, served):
        yield {"nodes": nodes, "served": served, "db": postgres_url, "tmp": tmp}


def _job(s: Served, key: str) -> dict:
    r = s.get(f"/jobs/{key}")
    return r.json() if r.status_code == 200 else {}


def _db_hangs(db: str, key: str) -> list[tuple]:
    eng = create_engine(db)
    try:
        with eng.connect() as c:
            return list(c.execute(text("SELECT id, kind, status, culprit_ranks, summary, node_id FROM incidents "
                                       "WHERE job = :k AND family = 'hang'"), {"k": key}))
    finally:
        eng.dispose()


def test_a_healthy_job_on_two_nodes_is_one_job_on_both_and_raises_nothing(fleet):
    nodes, served = fleet["nodes"], fleet["served"]
    port = free_port()
    key = f"rdzv:127.0.0.1:{port}"
    jobs = [torchrun(nodes[n], i, port, "healthy", "train", "--steps", "400", "--step-sleep", "0.05")
            for i, n in enumerate(nodes)]
    logs = [fleet["tmp"] / f"job-healthy-{n}.log" for n in nodes] + [s.log for s, _ in served.values()]
    try:
        for n, (s, _) in served.items():
            view = wait_for(lambda s=s: (j := _job(s, key)) and len(j.get("fleet_ranks") or {}) == 4 and j, 90,
                         f"the whole job on {n}", logs)
            assert view["rank_nodes"] == {"0": "node-a", "1": "node-a", "2": "node-b", "3": "node-b"}, view
            assert view["identity"] == {"rendezvous": f"127.0.0.1:{port}"} and view["world_size"] == 4
            assert [x["node"] for x in view["nodes"]] == ["node-a", "node-b"] and not view["stopped_reporting"]
        time.sleep(8)  # longer than the hang thresholds, while the job trains
        assert _db_hangs(fleet["db"], key) == []
        for s, _ in served.values():
            assert s.get("/incidents", params={"job": key}).json()["total"] == 0
    finally:
        for n, p in zip(nodes, jobs, strict=True):
            nodes[n].kill_tree(p)


def test_a_rank_on_node_b_deadlocks_one_incident_then_node_b_stops_reporting(fleet):
    nodes, served = fleet["nodes"], fleet["served"]
    port = free_port()
    key = f"rdzv:127.0.0.1:{port}"
    # every rank records its collectives and dumps them once it is stuck (gloo's flight recorder)
    dumps = fleet["tmp"] / "fr-deadlock"
    dumps.mkdir()
    fr = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": str(dumps / "fr_rank_")}
    jobs = [torchrun(nodes[n], i, port, "deadlock", "deadlock", "--steps", "60", "--step-sleep", "0.05", "--culprit", "3",
                     "--fr-watchdog", "8", env=fr)
            for i, n in enumerate(nodes)]
    logs = [fleet["tmp"] / f"job-deadlock-{n}.log" for n in nodes] + [s.log for s, _ in served.values()]
    a, b = served["node-a"][0], served["node-b"][0]
    try:
        def named() -> list:
            rows = _db_hangs(fleet["db"], key)
            return rows if any(3 in (r.culprit_ranks or []) for r in rows) else []
        rows = wait_for(named, 120, "a hang incident naming rank 3", logs)
        time.sleep(4)  # both nodes have judged by now: still one
        rows = _db_hangs(fleet["db"], key)
        assert len(rows) == 1, rows
        (row,) = rows
        assert row.status == "open" and row.culprit_ranks == [3], row
        for s in (a, b):  # the one incident, through either node's API
            listed = s.get("/incidents", params={"job": key}).json()
            assert listed["total"] == 1 and listed["incidents"][0]["id"] == row.id, listed
            detail = s.get(f"/incidents/{row.id}").json()
            assert detail["culprit_ranks"] == [3], (detail["summary"], detail["timeline"], s.get("/processes").json())
        detail = a.get(f"/incidents/{row.id}").json()
        summary = detail["summary"]
        assert "rank 3 on node-b (pid " in summary, summary  # whichever node wrote it first
        assert [(c["rank"], c["node"]) for c in detail["evidence"]["culprits"]] == [(3, "node-b")], detail["evidence"]
        print(f"\nthe one incident #{row.id} ({row.kind}): {summary}")
        # the flight recorder's word, from the entries of both nodes' ranks: ranks 0, 1 (node-a) and
        # 2 (node-b) entered the next all_reduce, rank 3 (node-b) never did

        def fr_missing(s: Served) -> dict | None:
            found = s.get(f"/incidents/{row.id}").json()["findings"]
            return next((f for f in found if f["kind"] == "missing_rank" and f["ranks"] == [0, 1, 2]), None)
        for s in (a, b):
            f = wait_for(lambda s=s: fr_missing(s), 60, "a flight-recorder finding over both nodes' ranks", logs)
            assert f["missing_ranks"] == [3] and f["op"].endswith("all_reduce"), f
            # the ranks of the other node than the one that wrote the incident are named with their node
            assert f["nodes"] in ({"0": "node-a", "1": "node-a"}, {"2": "node-b", "3": "node-b"}), f
            assert "rank 3 on node-b never entered" in f["message"] or "; ranks 0, 1 on node-a and 2 entered" in f["message"], f
            print(f"flight recorder: {f['message']}")
        view = _job(a, key)
        assert view["open_incidents"] == [row.id] and view["rank_nodes"]["3"] == "node-b"
        assert view["fleet_ranks"]["3"]["node"] == "node-b"
        # where each rank stands in its flight recorder, from both nodes' real dumps: rank 3 is
        # behind ranks 0-2 in the group they wait in, and the finding says who never entered
        fr_view = view["flight_recorder"]
        assert {r: {x["node"] for x in xs} for r, xs in fr_view.items()} == \
            {"0": {"node-a"}, "1": {"node-a"}, "2": {"node-b"}, "3": {"node-b"}}, fr_view
        late = next(x for x in fr_view["3"] if x["behind"])
        peers = [next(x for x in fr_view[r] if x["pg"] == late["pg"]) for r in "012"]
        assert all(x["seq"] > late["seq"] and x["op"].endswith("all_reduce") for x in peers), (late, peers)
        assert [f["kind"] for f in view["fr_findings"]] == ["missing_rank"], view["fr_findings"]
        table = run_hangd("status", "--job", key, "--db", fleet["db"]).stdout
        assert any(line.split()[:3] == ["3", "node-b", late["pg"]] and "behind the furthest rank" in line
                   for line in table.splitlines()), table
        print(table)
        # the job-level alert rules read these: the job, each node, and its ranks, from either node
        for s, node in ((a, "node-a"), (b, "node-b")):
            text = s.get("/metrics").text
            for other in ("node-a", "node-b"):
                assert f'hangd_job_node_ranks{{hangd_job="{key}",node="{other}"}} 2.0' in text, (node, other)
                assert f'hangd_job_node_last_report_timestamp_seconds{{hangd_job="{key}",node="{other}"}}' in text
            lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
            assert lint.returncode == 0, lint.stdout + lint.stderr

        # node-b's hangd dies; the job (and the hang) go on
        hangd_b = served["node-b"][1]
        nodes["node-b"].kill_tree(hangd_b)
        view = wait_for(lambda: (j := _job(a, key)) and j["stopped_reporting"] and j, 30, "node-b named as stopped", logs)
        assert view["stopped_reporting"][0].startswith("node-b: no report since "), view
        stale = next(n for n in view["nodes"] if n["node"] == "node-b")
        assert stale["stale"] and stale["ranks"] == {"2": view["ranks"]["2"], "3": view["ranks"]["3"]}

        def carried_on() -> tuple | None:
            (r,) = _db_hangs(fleet["db"], key)
            return r if "node-b: no report since" in r.summary else None
        row = wait_for(carried_on, 40, "node-a carrying the incident on", logs)
        print(f"after node-b's hangd was killed: {row.summary}")
        assert row.status == "open" and not set(row.culprit_ranks or []) & {0, 1, 2}, row  # nobody blamed on stale words
        assert len(_db_hangs(fleet["db"], key)) == 1
    finally:
        for n, p in zip(nodes, jobs, strict=True):
            nodes[n].kill_tree(p)
