"""Several nodes' hangd on one real PostgreSQL: each writes its own ranks with a heartbeat, reads
the other nodes' ranks of the jobs that span nodes, and a hang of such a job is one incident in
the database whichever node writes it first."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from sqlalchemy import func, select

from hangd.store import models as m
from hangd.store.db import ID_STRIDE, Batch, Store, StoreInUse


def _ranks(job: str, ranks: dict[int, tuple[int, str, bool]], t: float) -> list[dict]:
    """rank -> (pid, state, waits), as Analyzer.processes() gives the ranks of a job that spans nodes."""
    return [{"pid": pid, "job": job, "rank": r, "state": st, "since": t, "reason": f"rank {r} {st}", "world_size": 4,
             "last_progress": t - 30, "waits": waits, "reading": f"rank {r} on its own",
             "local": "waiting" if waits else "serving"}
            for r, (pid, st, waits) in ranks.items()]


def _job(job: str, state: str, ranks: dict[int, tuple[int, str, bool]]) -> dict:
    return {"job": job, "name": job, "state": state, "ranks": {str(r): v[0] for r, v in ranks.items()}, "world_size": 4,
            "identity": {"rendezvous": job[5:]}, "spans_nodes": "WORLD_SIZE 4 > LOCAL_WORLD_SIZE 2"}


def _hang(iid: int, job: str, t: float, summary: str, resolved: bool = False) -> dict:
    return {"id": iid, "kind": "host_stall", "severity": "critical", "job": job, "opened_at": t, "updated_at": t,
            "resolved_at": t + 1 if resolved else None, "summary": summary, "next_step": "", "pids": [1], "ranks": [0, 1],
            "culprit_pids": [], "culprit_ranks": [3], "evidence": {}, "findings": [], "timeline": [{"t": t, "event": "opened"}]}


@pytest.fixture
def fleet(postgres_url):
    tag = uuid.uuid4().hex[:8]
    stores = [Store(postgres_url, hostname=f"node-{x}-{tag}", exclusive=True, heartbeat_s=0.5, node_stale_s=3)
              for x in "ab"]
    yield stores, f"rdzv:10.0.0.1:{tag}"
    for s in stores:
        s.close()


def _hangs_in_db(st: Store, job: str) -> list[m.Incident]:
    with st.Session() as s:
        return list(s.scalars(select(m.Incident).where(m.Incident.job == job)))


def test_each_node_reads_the_other_nodes_ranks_of_a_job_that_spans_nodes(fleet):
    (a, b), job = fleet
    t = time.time()
    a_ranks, b_ranks = {0: (101, "waiting_peer", True), 1: (102, "waiting_peer", True)}, \
        {2: (701, "waiting_peer", True), 3: (702, "straggler", False)}
    a.submit(Batch(t=t, processes=_ranks(job, a_ranks, t), jobs=[_job(job, "waiting_peer", a_ranks)], spanning={job}))
    b.submit(Batch(t=t, processes=_ranks(job, b_ranks, t), jobs=[_job(job, "straggler", b_ranks)], spanning={job}))
    seen = {(r.node, r.rank): r for r in a.remote_ranks([job], t)}
    assert set(seen) == {(b.hostname, 2), (b.hostname, 3)}
    assert seen[(b.hostname, 3)].waits is False and seen[(b.hostname, 3)].pid == 702
    assert seen[(b.hostname, 3)].reading == "rank 3 on its own"
    # what the rank does as a kind: a rank waiting for requests is not a culprit (an idle server)
    assert seen[(b.hostname, 3)].local == "serving" and seen[(b.hostname, 2)].local == "waiting"
    assert abs(seen[(b.hostname, 3)].reported_at - t) < 1 and seen[(b.hostname, 3)].last_progress == pytest.approx(t - 30)
    assert {r.rank for r in b.remote_ranks([job], t)} == {0, 1}
    view = a.fleet_jobs(job, t)[job]
    assert [n["node"] for n in view["nodes"]] == sorted([a.hostname, b.hostname])
    assert {r: x["node"] for r, x in view["fleet_ranks"].items()} == {"0": a.hostname, "1": a.hostname, "2": b.hostname,
                                                                      "3": b.hostname}
    assert not any(n["stale"] for n in view["nodes"])
    # node b's hangd stops: its rows stay, its node is reported as stopped
    assert a.fleet_jobs(job, t + 10)[job]["nodes"][[n["node"] for n in view["nodes"]].index(b.hostname)]["stale"]


def test_a_hang_of_a_job_that_spans_nodes_is_one_incident_whichever_node_writes_first(fleet):
    (a, b), job = fleet
    t = time.time()
    for st in (a, b):  # both alive
        st.submit(Batch(t=t))
    ia, ib = ID_STRIDE + a.node_id, ID_STRIDE + b.node_id  # each numbers apart, as the daemon sets it
    b.submit(Batch(t=t, incidents=[_hang(ib, job, t, "rank 3 (pid 702) is not in the collective")], spanning={job}))
    a.submit(Batch(t=t + 0.1, incidents=[_hang(ia, job, t + 0.1, "rank 3 on node-b (pid 702) is not in the collective")],
                   spanning={job}))
    a.submit(Batch(t=t + 0.2, incidents=[_hang(ia, job, t + 0.1, "updated by a")], spanning={job}))
    assert a.healthy and b.healthy, (a.last_error, b.last_error)
    (row,) = _hangs_in_db(a, job)
    assert row.id == ib and row.summary.startswith("rank 3 (pid 702)") and row.status == "open"
    assert any(f"also seen by {a.hostname}" in e.get("event", "") for e in row.timeline), row.timeline
    total, listed = a.list_incidents(job=job)
    assert total == 1 and listed[0]["id"] == ib  # node a's API lists the one row
    # the owner resolves it: the key is free for the next episode
    b.submit(Batch(t=t + 2, incidents=[_hang(ib, job, t, "over", resolved=True)], spanning={job}))
    (row,) = _hangs_in_db(a, job)
    assert row.status == "resolved" and row.open_key is None


def _joined_hang(a: Store, b: Store, job: str, n: int) -> tuple[int, int, float]:
    """Node b opens a hang of the job, node a then writes the same hang and joins b's row:
    (a's id, b's id, when)."""
    t = time.time()
    for st in (a, b):
        st.submit(Batch(t=t))
    ia, ib = n * ID_STRIDE + a.node_id, n * ID_STRIDE + b.node_id
    b.submit(Batch(t=t, incidents=[_hang(ib, job, t, "from b")], spanning={job}))
    a.submit(Batch(t=t + 0.1, incidents=[_hang(ia, job, t + 0.1, "from a")], spanning={job}))  # joins b's row
    return ia, ib, t


def test_a_hang_joined_to_another_node_s_row_is_listed_once_while_its_update_is_queued(fleet):
    (a, b), job = fleet
    ia, ib, t = _joined_hang(a, b, job, 5)
    a.start_writer()
    try:
        with a._lock:  # the writer is busy: a's next update of the hang waits in the queue
            a.submit(Batch(t=t + 1, incidents=[_hang(ia, job, t + 0.1, "from a, updated")], spanning={job}))
            total, listed = a.list_incidents(job=job)
            assert (total, [i["id"] for i in listed]) == (1, [ib]), listed
    finally:
        a.stop_writer()


def test_a_node_takes_over_the_incident_of_a_node_that_stopped_reporting(fleet):
    (a, b), job = fleet
    t = time.time()
    b.submit(Batch(t=t - 60))  # node b's last heartbeat was a minute ago
    ib, ia = 2 * ID_STRIDE + b.node_id, 2 * ID_STRIDE + a.node_id
    b.submit(Batch(t=t - 60, incidents=[_hang(ib, job, t - 60, "from b")], spanning={job}))
    with b.Session.begin() as s:  # the heartbeat the batch moved, put back a minute
        s.execute(m.Node.__table__.update().where(m.Node.id == b.node_id).values(last_seen=t - 60))
    a.submit(Batch(t=t, incidents=[_hang(ia, job, t, "from a")], spanning={job}))
    (row,) = _hangs_in_db(a, job)
    assert row.node_id == a.node_id and row.summary == "from a" and row.opened_at == pytest.approx(t - 60)
    assert any("took over" in e.get("event", "") for e in row.timeline)


def test_two_nodes_share_a_database_but_one_node_name_has_one_hangd(postgres_url, fleet):
    (a, _), _ = fleet
    with pytest.raises(StoreInUse, match=f"node {a.hostname}"):
        Store(postgres_url, hostname=a.hostname, exclusive=True)


def test_incidents_of_single_node_jobs_do_not_take_the_open_key(fleet):
    (a, b), job = fleet
    t = time.time()
    a.submit(Batch(t=t, incidents=[_hang(3 * ID_STRIDE + a.node_id, job + "@1", t, "a")]))
    b.submit(Batch(t=t, incidents=[_hang(3 * ID_STRIDE + b.node_id, job + "@1", t, "b")]))
    with a.Session() as s:
        n = s.scalar(select(func.count()).select_from(m.Incident).where(m.Incident.job == job + "@1"))
    assert n == 2


def test_hangd_status_job_prints_the_whole_job_from_the_database(fleet, postgres_url):
    from ..conftest import run_hangd

    (a, b), job = fleet
    t = time.time()
    a_ranks, b_ranks = {0: (101, "waiting_peer", True), 1: (102, "waiting_peer", True)}, \
        {2: (701, "waiting_peer", True), 3: (702, "hung", False)}
    a.submit(Batch(t=t, processes=_ranks(job, a_ranks, t), jobs=[_job(job, "hung", a_ranks)], spanning={job}))
    b.submit(Batch(t=t, processes=_ranks(job, b_ranks, t), jobs=[_job(job, "hung", b_ranks)], spanning={job},
                   incidents=[_hang(4 * ID_STRIDE + b.node_id, job, t, "rank 3 on node-b (pid 702) is not in it")]))
    out = run_hangd("status", "--job", job, "--db", postgres_url)
    assert out.returncode == 1, out.stderr  # an incident is open
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"JOB {job} (WORLD_SIZE 4 > LOCAL_WORLD_SIZE 2; key from rendezvous="), lines[0]
    assert any(line.startswith(f"  {b.hostname}: last report ") and line.endswith("ranks 2, 3") for line in lines), lines
    row3 = next(line for line in lines if line.split()[:3] == ["3", b.hostname, "702"])
    assert "hung" in row3 and " no " in row3, row3
    assert any("INCIDENT #" in line and "culprit ranks [3]" in line for line in lines), lines
    with b.Session.begin() as s:  # node-b's hangd stops reporting
        s.execute(m.Node.__table__.update().where(m.Node.id == b.node_id).values(last_seen=t - 60))
    out = run_hangd("status", "--job", job, "--db", postgres_url, "--json")
    doc = json.loads(out.stdout)
    assert [n["stale"] for n in doc["nodes"] if n["node"] == b.hostname] == [True]
    missing = run_hangd("status", "--job", "rdzv:nowhere:1", "--db", postgres_url, check=False)
    assert missing.returncode == 3 and "no job rdzv:nowhere:1" in missing.stderr


def test_nodes_writing_the_same_hangs_at_once_leave_one_incident_per_job(fleet):
    """Both nodes open the hang of the same 20 jobs at the same moment, from two threads: the
    unique open key decides, the loser joins the winner's row (no failed batch, no duplicate)."""
    import threading

    (a, b), job = fleet
    t = time.time()
    for st in (a, b):
        st.submit(Batch(t=t))
    keys = [f"{job}-{i}" for i in range(20)]

    def write(st: Store, base: int) -> None:
        for i, k in enumerate(keys):
            st.submit(Batch(t=t, incidents=[_hang((base + i) * ID_STRIDE + st.node_id, k, t, st.hostname)],
                            spanning={k}))
    threads = [threading.Thread(target=write, args=(st, 10)) for st in (a, b)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert a.healthy and b.healthy and not a.pending and not b.pending, (a.last_error, b.last_error)
    with a.Session() as s:
        per_job = dict(s.execute(select(m.Incident.job, func.count()).where(m.Incident.job.in_(keys))
                                 .group_by(m.Incident.job)).all())
    assert per_job == {k: 1 for k in keys}, per_job


def test_a_working_rank_s_progress_is_written_once_a_heartbeat(fleet):
    from sqlalchemy import event

    (a, _), job = fleet
    t = 1_000_000.0
    seen: list[str] = []
    for i in range(8):  # a tick every 0.25 s with progress on every tick; the heartbeat is 0.5 s
        procs = _ranks(job, {0: (101, "busy", False)}, t)
        procs[0]["last_progress"] = t + i * 0.25
        if i == 1:
            event.listen(a.engine, "before_cursor_execute",
                         lambda _c, _cur, stmt, *_: seen.append(" ".join(stmt.split()[:2])))
        a.submit(Batch(t=t + i * 0.25, processes=procs, spanning={job}))
    # ticks 1..7: the progress written moves at 0.5, 1.0 and 1.5 s, not on every tick
    assert seen.count("UPDATE processes") == 3, seen
    assert a.remote_ranks([job]) == []  # a node does not read its own ranks as another node's


def test_the_heartbeat_moves_one_row_and_what_a_node_stops_listing_is_gone_at_once(fleet, postgres_url):
    """A node's heartbeat is its own row: its unchanged ranks are not rewritten with it, and still
    count as current for the other nodes. A rank or job it stops listing is gone for them at once;
    listed again, it is back. Rows a crashed hangd never marked drop out once they stop moving."""
    from sqlalchemy import event

    (a, b), job = fleet
    t = time.time()
    ranks = {2: (701, "waiting_peer", True), 3: (702, "hung", False)}
    seen: list[str] = []
    event.listen(b.engine, "before_cursor_execute", lambda _c, _cur, stmt, *_: seen.append(" ".join(stmt.split()[:2])))
    for i in range(13):  # 6 s of ticks every 0.5 s (the heartbeat), nothing changes
        b.submit(Batch(t=t + i * 0.5, processes=_ranks(job, ranks, t), jobs=[_job(job, "hung", ranks)], spanning={job}))
    assert seen.count("UPDATE nodes") == 13 and seen.count("UPDATE processes") == 0, seen
    assert seen.count("UPDATE jobs") == 0, seen
    assert {r.rank for r in a.remote_ranks([job], t + 6)} == {2, 3}
    assert set(a.fleet_jobs(job, t + 6)[job]["fleet_ranks"]) == {"2", "3"}

    less = {2: ranks[2]}
    b.submit(Batch(t=t + 6.5, processes=_ranks(job, less, t), jobs=[_job(job, "hung", less)], spanning={job}))
    assert {r.rank for r in a.remote_ranks([job], t + 6.5)} == {2}  # not after a window: now
    b.submit(Batch(t=t + 7, processes=_ranks(job, ranks, t), jobs=[_job(job, "hung", ranks)], spanning={job}))
    assert {r.rank for r in a.remote_ranks([job], t + 7)} == {2, 3}
    b.submit(Batch(t=t + 7.5, processes=[], jobs=[], spanning=set()))  # the job ended on node b
    assert a.remote_ranks([job], t + 7.5) == [] and job not in a.fleet_jobs(job, t + 7.5)

    # node b's hangd dies listing rank 2 (nothing marked), comes back, and rank 2 is not there
    b.submit(Batch(t=t + 8, processes=_ranks(job, less, t), jobs=[_job(job, "hung", less)], spanning={job}))
    b.close()
    again = Store(postgres_url, hostname=b.hostname, exclusive=True, heartbeat_s=0.5, node_stale_s=3)
    try:
        for i in range(30):  # 15 s of heartbeats listing nothing
            again.submit(Batch(t=t + 9 + i * 0.5, processes=[], jobs=[], spanning=set()))
            listed = {r.rank for r in a.remote_ranks([job], t + 9 + i * 0.5)}
            # the row stops moving at t + 8: counted within a touch (10 s) and two heartbeats, then not
            assert listed == ({2} if i * 0.5 + 1 <= 12 else set()), (i, listed)
    finally:
        again.close()


def test_a_pid_listed_under_another_job_leaves_the_job_it_was_in_at_once(fleet):
    (a, b), job = fleet
    t = time.time()
    ranks = {2: (701, "busy", False)}
    b.submit(Batch(t=t, processes=_ranks(job, ranks, t), jobs=[_job(job, "busy", ranks)], spanning={job}))
    assert [r.rank for r in a.remote_ranks([job], t)] == [2]
    other = job + "/r1"  # the same pid, now a rank of the job's restart
    b.submit(Batch(t=t + 1, processes=_ranks(other, ranks, t), jobs=[_job(other, "busy", ranks)], spanning={other}))
    assert a.remote_ranks([job], t + 1) == [] and [r.rank for r in a.remote_ranks([other], t + 1)] == [2]


def test_the_other_nodes_ranks_are_read_once_a_heartbeat_or_when_the_jobs_change(fleet):
    from sqlalchemy import event

    (a, b), job = fleet
    t = time.time()
    ranks = {2: (701, "waiting_peer", True)}
    b.submit(Batch(t=t, processes=_ranks(job, ranks, t), jobs=[_job(job, "hung", ranks)], spanning={job}))
    reads: list[str] = []
    event.listen(a.engine, "before_cursor_execute",
                 lambda _c, _cur, stmt, *_: reads.append(stmt) if "FROM processes JOIN nodes" in stmt else None)
    a.want_remote({job})
    start = time.monotonic()
    for _ in range(5):  # writes every tick within three quarters of a heartbeat (0.5 s): one read
        a.maintain()
    assert len(reads) == 1 or time.monotonic() - start >= 0.375, reads
    assert [r.rank for r in a.cached_remote()[1]] == [2]
    before = len(reads)  # 2 when the loop above took longer than 0.375 s (a loaded machine)
    a.want_remote({job, job + "/r1"})  # a job more: read at once
    a.maintain()
    assert len(reads) == before + 1
    time.sleep(0.4)
    a.maintain()
    assert len(reads) == before + 2


def test_an_id_another_node_already_holds_never_overwrites_its_incident(fleet):
    """Past ID_STRIDE nodes two nodes' numbering meets: the second goes under a free id of its own."""
    (a, b), job = fleet
    t = time.time()
    same = 50 * ID_STRIDE + a.node_id
    a.submit(Batch(t=t, incidents=[_hang(same, job + "-a", t, "a's")]))
    b.submit(Batch(t=t, incidents=[_hang(same, job + "-b", t, "b's")]))
    b.submit(Batch(t=t + 1, incidents=[_hang(same, job + "-b", t, "b's, updated")]))
    assert a.healthy and b.healthy, (a.last_error, b.last_error)
    (ra,), (rb,) = _hangs_in_db(a, job + "-a"), _hangs_in_db(a, job + "-b")
    assert ra.id == same and ra.summary == "a's" and ra.node_id == a.node_id
    assert rb.id != same and rb.id % ID_STRIDE == b.node_id % ID_STRIDE and rb.summary == "b's, updated"
    # node b names its hang by its own id: a read or an ack of it is of b's row, never of a's
    assert b.get_incident(same)["summary"] == "b's, updated"
    assert b.ack(same, t + 2)["id"] == rb.id
    assert [(r.id, r.acked) for r in _hangs_in_db(a, job + "-a")] == [(same, False)]


# ------------------------------------------------------------------ flight-recorder entries across nodes


def _fr_dump(rank: int, last: int, groups: tuple[str, ...] = ("0",)):
    """A normalized dump as the reader gives it: all_reduce #1..#last in each group, the last one
    not completed, each entry with the frames that must stay on the node."""
    from hangd.flightrec.reader import Dump, Entry

    entries = [Entry(record_id=i, pg=pg, pg_id=int(pg), seq=s, p2p_seq=0, op="nccl:all_reduce",
                     state="completed" if s < last else "scheduled", completed=s < last, input_sizes=[[1024, rank + 1]],
                     input_dtypes=["Float"], output_sizes=[[1024, rank + 1]], is_p2p=False,
                     frames=[{"name": "train_step", "filename": "/home/alice/secret_project/train.py", "line": 7}],
                     time_created_ns=1_700_000_000_000_000_000 + s, timeout_ms=600000)
               for i, (pg, s) in enumerate((pg, s) for s in range(1, last + 1) for pg in groups)]
    return Dump(rank=rank, version="2.10", encoding="pickle",
                pg_config={pg: {"pg_id": pg, "desc": "default_pg" if pg == "0" else "tp", "ranks": [0, 1, 2, 3]}
                           for pg in groups},
                pg_status={pg: {"last_enqueued_collective": last, "last_started_collective": -1,
                                "last_completed_collective": last - 1} for pg in groups},
                entries=entries)


def _fr_rows(st: Store) -> int:
    with st.Session() as s:
        return int(s.scalar(select(func.count()).select_from(m.FrEntry)) or 0)


def test_each_node_reads_the_other_nodes_flight_recorder_entries_bounded_and_replaced_by_newer_dumps(fleet):
    from hangd.flightrec.rows import KEEP_PER_GROUP

    (a, b), job = fleet
    t = time.time()
    before = _fr_rows(a)
    a.submit(Batch(t=t, fr={(job, r): (t, _fr_dump(r, 12)) for r in (0, 1)}, spanning={job}))
    b.submit(Batch(t=t, fr={(job, 2): (t, _fr_dump(2, 12)), (job, 3): (t, _fr_dump(3, 2000, groups=("0", "1")))},
                   spanning={job}))
    assert a.healthy and b.healthy, (a.last_error, b.last_error)
    seen_a = {(d.node, d.rank): d for d in a.remote_dumps([job], t)}
    assert set(seen_a) == {(b.hostname, 2), (b.hostname, 3)}
    assert {(d.node, d.rank) for d in b.remote_dumps([job], t)} == {(a.hostname, 0), (a.hostname, 1)}
    two = seen_a[(b.hostname, 2)]
    assert two.job == job and two.read_at == pytest.approx(t) and abs(two.reported_at - t) < 1
    # what the analysis compares comes back as it was read, frames aside
    sent = _fr_dump(2, 12)
    assert two.dump.rank == 2 and two.dump.pg_status == sent.pg_status and two.dump.pg_config == sent.pg_config
    assert [(e.pg, e.seq, e.op, e.state, e.completed, e.input_sizes, e.input_dtypes, e.output_sizes, e.time_created_ns)
            for e in two.dump.entries] == [(e.pg, e.seq, e.op, e.state, e.completed, e.input_sizes, e.input_dtypes,
                                            e.output_sizes, e.time_created_ns) for e in sent.entries]
    assert all(e.frames == [] for e in two.dump.entries)
    # bounded: the newest KEEP_PER_GROUP of each group, whatever the dump held
    three = seen_a[(b.hostname, 3)].dump
    for pg in ("0", "1"):
        assert [e.seq for e in three.entries if e.pg == pg] == list(range(2001 - KEEP_PER_GROUP, 2001))
    assert _fr_rows(a) - before == 12 * 3 + 2 * KEEP_PER_GROUP
    with a.Session() as s:  # frames never reach the database
        dumped = json.dumps([list(r) for r in s.execute(select(m.FrEntry.__table__, m.FrRank.__table__)
                                                        .join(m.FrRank, m.FrRank.id == m.FrEntry.dump_id))], default=str)
    assert "secret_project" not in dumped and "train_step" not in dumped

    # an unchanged dump is not read again; a newer dump of rank 3 replaces the older one
    again = {(d.node, d.rank): d.dump for d in a.remote_dumps([job], t + 1)}
    assert again[(b.hostname, 2)] is two.dump
    b.submit(Batch(t=t + 5, fr={(job, 3): (t + 5, _fr_dump(3, 2100, groups=("0", "1")))}, spanning={job}))
    b.submit(Batch(t=t + 6, fr={(job, 3): (t + 4, _fr_dump(3, 1500))}, spanning={job}))  # an older one, late: ignored
    newer = {(d.node, d.rank): d for d in a.remote_dumps([job], t + 6)}[(b.hostname, 3)]
    assert newer.read_at == pytest.approx(t + 5)
    assert max(e.seq or 0 for e in newer.dump.entries) == 2100 and len(newer.dump.entries) == 2 * KEEP_PER_GROUP
    assert _fr_rows(a) - before == 12 * 3 + 2 * KEEP_PER_GROUP
    assert a.remote_dumps([job + "-other"], t) == [] and a.remote_dumps([], t) == []


def test_a_rank_s_newer_dump_still_queued_replaces_the_older_one_in_the_queue(fleet):
    """While the database is slow, a store holds one dump per rank, not one per tick."""
    import threading

    (a, b), job = fleet
    t = time.time()
    a._writer = threading.Thread()  # queued, not written: as while the writer is busy
    first = Batch(t=t, fr={(job, 0): (t, _fr_dump(0, 5)), (job, 1): (t, _fr_dump(1, 5))})
    a.submit(first)
    a.submit(Batch(t=t + 1, fr={(job, 0): (t + 1, _fr_dump(0, 9))}))
    assert list(first.fr) == [(job, 1)]
    a._writer = None
    a.submit_flush()
    assert a.healthy, a.last_error
    assert {d.rank: max(e.seq or 0 for e in d.dump.entries) for d in b.remote_dumps([job], t + 1)} == {0: 9, 1: 5}


def test_the_flight_recorder_tables_migrate_down_and_up(postgres_url, tmp_path):
    """0003 alone, on PostgreSQL (a database of its own) and SQLite: down drops the two tables and
    leaves the rest, up brings them back."""
    from sqlalchemy import create_engine, inspect, text

    from hangd.store.db import downgrade, upgrade

    name = f"hangd_mig_{uuid.uuid4().hex[:8]}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f"CREATE DATABASE {name}"))
    pg = postgres_url.rsplit("/", 1)[0] + "/" + name
    try:
        for url in (pg, f"sqlite:///{tmp_path / 'm.db'}"):
            upgrade(url)
            eng = create_engine(url)
            assert {"fr_ranks", "fr_entries", "processes"} <= set(inspect(eng).get_table_names())
            downgrade(url, "0002")
            tables = set(inspect(eng).get_table_names())
            assert not {"fr_ranks", "fr_entries"} & tables and {"processes", "incidents"} <= tables, tables
            with eng.connect() as c:
                assert c.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0002"
            upgrade(url)
            assert {"fr_ranks", "fr_entries"} <= set(inspect(eng).get_table_names())
            eng.dispose()
    finally:
        with admin.connect() as c:
            c.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def test_a_hostile_dump_does_not_fail_the_batch_it_is_in(fleet):
    """NUL in names (a text column refuses it) and a rank no column holds: written clean or left
    out, and the store stays healthy (a failed batch would be retried for ever)."""
    (a, b), job = fleet
    t = time.time()
    bad = _fr_dump(1, 3)
    for e in bad.entries:
        e.op, e.pg, e.input_dtypes = "nccl:all_\x00reduce", "0\x00", ["Fl\x00oat"]
    a.submit(Batch(t=t, fr={(job, 1): (t, bad), (job, 2**40): (t, _fr_dump(0, 3)), (job, 0): (t, _fr_dump(0, 3))}))
    assert a.healthy, a.last_error
    got = {d.rank: d.dump for d in b.remote_dumps([job], t)}
    assert sorted(got) == [0, 1]
    assert {e.op for e in got[1].entries} == {"nccl:all_reduce"} and got[1].entries[0].input_dtypes == ["Fl\x00oat"]


def test_nodes_starting_at_once_on_a_fresh_database_all_migrate_it(postgres_url):
    """A DaemonSet rollout starts every node's hangd at the same moment on an empty database: each
    runs the migrations (in a child interpreter, as `hangd serve` does). One creates the tables; the
    others must wait for it and find nothing to do, not fail on the catalog and start degraded."""
    from concurrent.futures import ThreadPoolExecutor

    from alembic.script import ScriptDirectory
    from sqlalchemy import create_engine, text

    from hangd.store.db import MIGRATIONS, upgrade_apart

    name = f"fresh_{uuid.uuid4().hex[:8]}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f"CREATE DATABASE {name}"))
    url = postgres_url.rsplit("/", 1)[0] + f"/{name}"
    try:
        with ThreadPoolExecutor(6) as pool:
            outcomes = list(pool.map(lambda _: _outcome(upgrade_apart, url), range(6)))
        assert outcomes == ["ok"] * 6, outcomes
        eng = create_engine(url)
        with eng.connect() as c:
            (head,) = c.execute(text("SELECT version_num FROM alembic_version")).one()
            tables = {r[0] for r in c.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))}
        eng.dispose()
        newest = ScriptDirectory(str(MIGRATIONS)).get_current_head()
        assert head == newest and {"incidents", "processes", "jobs", "nodes"} <= tables, (head, tables)
    finally:
        with admin.connect() as c:
            c.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def _outcome(fn, *args) -> str:
    try:
        fn(*args)
        return "ok"
    except Exception as e:  # noqa: BLE001 - the test reports every failure as one line
        return f"{type(e).__name__}: {str(e)[:160]}"


def _raw_dump(sizes) -> bytes:
    import pickle

    return pickle.dumps({"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
                         "pg_status": {"0": {"last_enqueued_collective": 3}},
                         "entries": [{"process_group": ["0", "default_pg"], "pg_id": 0, "collective_seq_id": 3,
                                      "profiling_name": "nccl:all_reduce", "state": "scheduled",
                                      "input_sizes": sizes, "input_dtypes": ["Float"], "output_sizes": sizes}]})


@pytest.mark.parametrize("sizes", [[b"\x01\x02"], [{1, 2}], [{"a": 1}]], ids=["bytes", "set", "dict"])
def test_a_dump_with_sizes_no_shape_holds_leaves_the_writer_running(fleet, sizes):
    """Bytes or a set where a shape belongs (the safe unpickler allows both) once ended the writer
    thread: nothing was written again and the store still said healthy. Such sizes are unknown."""
    from hangd.flightrec.reader import decode

    (a, b), job = fleet
    t = time.time()
    dump = decode(_raw_dump(sizes), rank=1)
    assert dump.entries[0].input_sizes == [None]
    a.start_writer()
    a.submit(Batch(t=t, incidents=[_hang(9_000_003, job, t, "x")], fr={(job, 1): (t, dump)}, spanning={job}))
    a.submit(Batch(t=t + 1, incidents=[_hang(9_000_004, job, t, "y")]))
    t_end = time.time() + 10
    while a.pending and time.time() < t_end:
        time.sleep(0.1)
    assert a._writer is not None and a._writer.is_alive() and not a.pending and a.healthy, a.last_error
    assert sorted(x.summary for x in _hangs_in_db(a, job)) == ["x", "y"]  # both written, after the odd dump


# ------------------------------------------------------------------ the job's flight recorder, every node's dumps

SECRET_OP = "nccl:all_reduce hf_AbCdEfGhIjKlMnOpQrStUvWx"  # a token in a name the job chose
SECRET_PG = "api_key=s3cr3t-pg-name"


def _never_entered(rank: int, last: int):
    """A rank's dump that stops at #last, all completed: it never entered #last+1 its peers are in."""
    d = _fr_dump(rank, last + 1)
    d.entries = [e for e in d.entries if e.seq <= last]
    d.pg_status = {"0": {"last_enqueued_collective": last, "last_started_collective": -1, "last_completed_collective": last}}
    return d


def _fr_fleet(a: Store, b: Store, job: str, t: float, finding: str, also: str | None = None) -> None:
    """Ranks 0, 1 on node a, 2, 3 on node b; ranks 0-2 entered all_reduce #61, rank 3 stopped at
    #60. Rank 0 also has a group whose name holds a secret; rank 1's newest op name holds a token;
    rank 2 sent to rank 3 after #61, and in a group of point-to-point only.
    Node b's open hang holds the cross-rank finding (and one of NCCL RAS, not the recorder's, and
    one said over node b's ranks alone that the wider one overrules).
    ``also``: a second job, one rank on node a, no dump."""
    from hangd.flightrec.reader import Entry

    a_ranks, b_ranks = {0: (101, "waiting_peer", True), 1: (102, "waiting_peer", True)}, \
        {2: (701, "waiting_peer", True), 3: (702, "hung", False)}
    zero, one = _fr_dump(0, 61), _fr_dump(1, 61)
    zero.entries.append(Entry(record_id=99, pg=SECRET_PG, pg_id=5, seq=4, p2p_seq=0, op="nccl:broadcast", state="started",
                              completed=False, input_sizes=[[8]], input_dtypes=["Int"], output_sizes=[[8]], is_p2p=False,
                              frames=[], time_created_ns=1, timeout_ms=None))
    one.entries[-1].op = SECRET_OP
    two = _fr_dump(2, 61)  # and point-to-point entries: one after #61 in group 0, one in a group of its own
    for pg, p2p in (("0", 3), ("pp", 9)):
        two.entries.append(Entry(record_id=None, pg=pg, pg_id=None, seq=61 if pg == "0" else 0, p2p_seq=p2p,
                                 op="nccl:send 2->3", state="scheduled", completed=False, input_sizes=[[16]],
                                 input_dtypes=["Float"], output_sizes=[[16]], is_p2p=True, frames=[], time_created_ns=2,
                                 timeout_ms=None))
    procs, jobs = _ranks(job, a_ranks, t), [_job(job, "hung", a_ranks)]
    if also:
        procs += _ranks(also, {0: (111, "busy", False)}, t)
        jobs.append(_job(also, "busy", {0: (111, "busy", False)}))
    a.submit(Batch(t=t, processes=procs, jobs=jobs, spanning={job, also} if also else {job},
                   fr={(job, 0): (t - 2, zero), (job, 1): (t - 2, one)}))
    hang = _hang(5 * ID_STRIDE + b.node_id, job, t, "rank 3 on node-b (pid 702) is not in it")
    hang["findings"] = [{"kind": "stuck", "source": "flight_recorder", "pg": "0", "seq": 61,  # node b's own, before a's came
                         "message": "all ranks entered all_reduce #61 (1024 float32) in pg 0 and none completed it"},
                        {"kind": "missing_rank", "source": "flight_recorder", "pg": "0", "seq": 61, "message": finding},
                        {"kind": "ras_behind", "source": "nccl_ras", "message": "RAS: rank 3 launched fewer operations"}]
    b.submit(Batch(t=t, processes=_ranks(job, b_ranks, t), jobs=[_job(job, "hung", b_ranks)], spanning={job},
                   incidents=[hang], fr={(job, 2): (t - 1, two), (job, 3): (t - 1, _never_entered(3, 60))}))
    assert a.healthy and b.healthy, (a.last_error, b.last_error)


def _finding(b: Store) -> str:
    return (f"rank 3 on {b.hostname} never entered all_reduce #61 (1024 float32) in pg 0; ranks 0, 1 and 2 entered it and "
            f"wait; token=hf_ZyXwVuTsRqPoNmLkJiHgFeDc")


def test_the_job_s_flight_recorder_is_every_node_s_newest_dump_per_rank_redacted(fleet):
    (a, b), job = fleet
    t = time.time()
    _fr_fleet(a, b, job, t, _finding(b))
    for st in (a, b):  # every node's dumps, this node's own too, whichever node asks
        fr = st.fleet_flight_recorder(job, t)
        got = {(r, x["pg"]): x for r, xs in fr["ranks"].items() for x in xs}
        assert sorted(got) == [("0", "0"), ("0", "api_key=<redacted>"), ("1", "0"), ("2", "0"), ("2", "pp"), ("3", "0")]
        three, two = got[("3", "0")], got[("2", "0")]
        assert (three["node"], three["seq"], three["op"], three["state"], three["completed_seq"], three["behind"]) == \
            (b.hostname, 60, "nccl:all_reduce", "completed", 60, 1)
        assert (two["node"], two["seq"], two["state"], two["completed_seq"], two["behind"], two["sizes"]) == \
            (b.hostname, 61, "scheduled", 60, 0, [[1024, 3]])
        assert two["p2p"] == {"seq": 3, "op": "nccl:send 2->3", "state": "scheduled", "completed": False}
        assert got[("2", "pp")]["seq"] is None and got[("2", "pp")]["p2p"]["seq"] == 9
        assert got[("0", "0")]["node"] == a.hostname and got[("0", "0")]["read_at"] == pytest.approx(t - 2)
        assert three["read_at"] == pytest.approx(t - 1) and three["dtypes"] == ["Float"] and three["p2p"] is None
        # a group of its own is compared with nobody's: the broadcast #4 is not "57 behind"
        assert got[("0", "api_key=<redacted>")]["seq"] == 4 and got[("0", "api_key=<redacted>")]["behind"] == 0
        assert got[("1", "0")]["op"] == "nccl:all_reduce <redacted>"
        assert [(f["incident"], f["kind"], f["seq"]) for f in fr["findings"]] == [(5 * ID_STRIDE + b.node_id, "missing_rank", 61)]
        assert fr["findings"][0]["message"].startswith(f"rank 3 on {b.hostname} never entered all_reduce #61")
        dumped = json.dumps(fr)
        assert "s3cr3t" not in dumped and "hf_" not in dumped and "train_step" not in dumped
    assert a.fleet_flight_recorder(job + "-other", t) == {"ranks": {}, "findings": []}


def test_hangd_status_job_shows_where_each_rank_stands_in_its_flight_recorder(fleet, postgres_url):
    from ..conftest import run_hangd

    (a, b), job = fleet
    t = time.time()
    _fr_fleet(a, b, job, t, _finding(b))
    out = run_hangd("status", "--job", job, "--db", postgres_url)
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    head = lines.index(next(line for line in lines if line.split()[:3] == ["RANK", "NODE", "PG"]))
    assert lines[head].split() == ["RANK", "NODE", "PG", "LAST-SEQ", "OP", "STATE", "READ", "SIZES"]
    rows = {(x.split()[0], x.split()[2]): x.split() for x in lines[head + 1:head + 7]}
    assert rows[("2", "pp")][3:6] == ["9", "nccl:send", "2->3"] and "(p2p)" in rows[("2", "pp")], rows
    assert rows[("3", "0")][:6] == ["3", b.hostname, "0", "60", "nccl:all_reduce", "completed"], rows
    assert "1 behind the furthest rank in pg 0" in " ".join(rows[("3", "0")])
    for r, node in (("0", a.hostname), ("1", a.hostname), ("2", b.hostname)):
        assert rows[(r, "0")][1:4] == [node, "0", "61"] and "scheduled" in rows[(r, "0")], rows[(r, "0")]
    assert any(x.startswith(f"flight recorder (incident #{5 * ID_STRIDE + b.node_id}): rank 3 on {b.hostname} never entered "
                            "all_reduce #61") for x in lines), lines
    assert "RAS: rank 3" not in out.stdout and "all ranks entered" not in out.stdout  # not the recorder's; overruled
    assert "s3cr3t" not in out.stdout and "hf_" not in out.stdout, out.stdout
    # the table sits below the ranks, above the incident
    assert lines.index(next(x for x in lines if x.strip().startswith("RANK ") and "PID" in x)) < head < \
        lines.index(next(x for x in lines if x.startswith("INCIDENT #")))
    doc = json.loads(run_hangd("status", "--job", job, "--db", postgres_url, "--json").stdout)
    assert [(x["seq"], x["state"], x["node"]) for x in doc["flight_recorder"]["3"]] == [(60, "completed", b.hostname)]
    assert "s3cr3t" not in json.dumps(doc) and "hf_" not in json.dumps(doc)


def test_a_job_without_flight_recorder_dumps_says_so(fleet, postgres_url):
    from ..conftest import run_hangd

    (a, b), job = fleet
    t = time.time()
    ranks = {0: (101, "busy", False)}
    a.submit(Batch(t=t, processes=_ranks(job, ranks, t), jobs=[_job(job, "busy", ranks)], spanning={job}))
    assert a.fleet_flight_recorder(job, t) == {"ranks": {}, "findings": []}
    out = run_hangd("status", "--job", job, "--db", postgres_url)
    assert out.returncode == 0, out.stderr
    assert "no flight-recorder dumps written for this job" in out.stdout.splitlines(), out.stdout


def test_jobs_key_shows_every_rank_s_flight_recorder_from_any_node(fleet, postgres_url, tmp_path, served):
    """A third node's real ``hangd serve``, none of the job's ranks on it, answers for the job."""
    from ..served import serve

    (a, b), job = fleet
    t = time.time()
    empty = job + "-nodumps"
    _fr_fleet(a, b, job, t, _finding(b), also=empty)
    s = serve(tmp_path, "--node-name", f"node-c-{uuid.uuid4().hex[:8]}", "--interval", "0.5", db=postgres_url)
    served.append(s)
    r = s.get(f"/jobs/{job}")
    assert r.status_code == 200, r.text
    doc = r.json()
    fr = doc["flight_recorder"]
    assert {r: [(x["node"], x["pg"], x["seq"], x["op"], x["state"]) for x in xs] for r, xs in fr.items()} == {
        "0": [(a.hostname, "0", 61, "nccl:all_reduce", "scheduled"), (a.hostname, "api_key=<redacted>", 4, "nccl:broadcast",
                                                                       "started")],
        "1": [(a.hostname, "0", 61, "nccl:all_reduce <redacted>", "scheduled")],
        "2": [(b.hostname, "0", 61, "nccl:all_reduce", "scheduled"), (b.hostname, "pp", None, None, None)],
        "3": [(b.hostname, "0", 60, "nccl:all_reduce", "completed")]}
    assert fr["3"][0]["behind"] == 1 and fr["3"][0]["completed_seq"] == 60 and fr["2"][0]["sizes"] == [[1024, 3]]
    assert fr["3"][0]["read_at"] == pytest.approx(t - 1) and fr["3"][0]["read_at_iso"]
    assert [f["message"].split(";")[0] for f in doc["fr_findings"]] == [f"rank 3 on {b.hostname} never entered all_reduce #61 "
                                                                         "(1024 float32) in pg 0"]
    assert "s3cr3t" not in r.text and "hf_" not in r.text
    # every rank's row says where it is, as before
    assert doc["rank_nodes"] == {"0": a.hostname, "1": a.hostname, "2": b.hostname, "3": b.hostname}
    assert s.get(f"/jobs/{empty}").json()["flight_recorder"] == {}
    # the list of jobs stays one query per table: no flight recorder there
    assert all(j.get("flight_recorder") is None for j in s.get("/jobs").json())


def test_a_rank_stays_current_when_the_list_due_for_its_touch_was_superseded_in_the_queue(fleet):
    """The writer lags (a slow database): a queued list of ranks is superseded by a newer one. The
    batch written without it must not count as the touch of the ranks' rows: the next list written
    moves them, or a hung rank (its row unchanged) drops out of the other nodes' view."""
    (a, b), job = fleet
    t = time.time()
    ranks = {2: (701, "waiting_peer", True), 3: (702, "hung", False)}
    b.submit(Batch(t=t, processes=_ranks(job, ranks, t), jobs=[_job(job, "hung", ranks)], spanning={job}))
    b.start_writer()
    try:
        with b._lock:  # the writer is busy: the list of t + 10 is superseded by that of t + 10.2
            for dt in (10, 10.2):
                b.submit(Batch(t=t + dt, processes=_ranks(job, ranks, t), jobs=[_job(job, "hung", ranks)],
                               spanning={job}))
        for _ in range(100):
            if not b.pending:
                break
            time.sleep(0.05)
    finally:
        b.stop_writer()
    assert not b.pending and b.superseded >= 1
    for i in range(1, 10):  # the ranks, unchanged, with every tick (the heartbeat 0.5 s)
        now = t + 10.2 + i * 0.5
        b.submit(Batch(t=now, processes=_ranks(job, ranks, t), jobs=[_job(job, "hung", ranks)], spanning={job}))
        assert {r.rank for r in a.remote_ranks([job], now)} == {2, 3}, i
        assert set(a.fleet_jobs(job, now)[job]["fleet_ranks"]) == {"2", "3"}, i


def test_a_hang_joined_to_another_node_s_row_is_acked_and_read_by_this_node_s_id(fleet):
    """This node's metrics and analyzer name the hang by this node's id: an ack or a read by it
    reaches the row it joined, written or still queued."""
    (a, b), job = fleet
    ia, ib, t = _joined_hang(a, b, job, 6)
    got = a.get_incident(ia)
    assert got is not None and got["id"] == ib, got
    acked = a.ack(ia, t + 2)
    assert acked is not None and acked["acked"], acked
    assert b.get_incident(ib)["acked"]
    a.start_writer()
    try:
        with a._lock:  # queued: a's next update of the hang waits, the ack of it is shown at once
            a.submit(Batch(t=t + 3, incidents=[_hang(ia, job, t + 0.1, "from a, updated")], spanning={job}))
            got = a.get_incident(ia)
            assert got is not None and got["id"] == ib and got["acked"], got
    finally:
        a.stop_writer()
