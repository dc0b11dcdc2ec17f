"""The write load on one PostgreSQL of a fleet: N nodes x R ranks, through hangd's own store.

Every simulated node is a real ``hangd.store.db.Store`` on a ``postgresql://`` URL with its own
node name and its writer thread, fed each tick (the daemon's default interval, 1 s) the Batch the
daemon builds: the whole list of its ranks (with the fields a rank of a job that spans nodes
carries: world size, last progress, waiting in a collective, its reading), its jobs, its 8 GPUs,
the state changes and incidents of the tick. As the daemon does before each tick, the node tells
the store which of its jobs span nodes (``want_remote``) and takes the other nodes' ranks the writer
thread last read (``cached_remote``); the writer reads them after its writes, so that read is part
of the load measured. The nodes run in a few worker processes (the GIL of one would be the
bottleneck, not the database).

Part way through, one rank of job 0 on the first node stops: every rank of that job on every node
turns to waiting (state changes), and every node of the job writes its own hang incident for it
within the same second, then refreshes it every 10 s (as the incident book does): the database must
end with exactly one open incident row for the job.

Meanwhile a real ``hangd serve --db postgresql://...`` (uvicorn) is one more node of the fleet,
with no ranks of its own, and GET /jobs, /jobs/{key} and /incidents are timed against it.

Measured between two snapshots of the statistics views (after a warm-up in which every node
inserted its rows): rows inserted/updated/deleted per table (pg_stat_user_tables), transactions
(pg_stat_database.xact_commit), statements (pg_stat_statements, loaded for the run), the size of
every table before and after, what the writer's remote-rank read costs, whether every node kept up.

    python benchmarks/fleet_write_load.py --nodes 64 --ranks 8 --seconds 60 --out benchmarks/results/fleet-write-load.json

PostgreSQL is started for the run as the tests do (Debian's initdb/pg_ctl, a throwaway data
directory under the temp dir, a free port on loopback; as the ``postgres`` user when run as root).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import multiprocessing as mp
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import end, wait_healthy  # noqa: E402
from hangd.store.db import HEARTBEAT_S, ID_STRIDE, Batch, Store, upgrade  # noqa: E402

REFRESH_S = 10.0  # an open incident is written again this often (hangd.incidents.REFRESH_S)
GPUS_PER_NODE = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Postgres:
    """A throwaway PostgreSQL cluster on loopback, with pg_stat_statements loaded."""

    def __init__(self) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins:
            raise SystemExit("PostgreSQL is not installed (Debian's postgresql package; `make deps`)")
        self.bindir = Path(bins[-1]).parent
        self.dir = Path(tempfile.mkdtemp(prefix="hangd-fleetbench-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.run_as: list[str] = []
        if os.geteuid() == 0:  # postgres refuses to run as root
            shutil.chown(self.dir, "postgres")
            self.run_as = ["runuser", "-u", "postgres", "--"]
        self.statements = (self.bindir.parent / "lib" / "pg_stat_statements.so").exists()

    def start(self) -> str:
        subprocess.run([*self.run_as, str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "hangd"],
                       check=True, capture_output=True)
        # every node holds a connection or two (its writer, its lock when served): room for them
        opts = f"-p {self.port} -k {self.dir} -h 127.0.0.1 -c max_connections=400"
        if self.statements:
            opts += " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
        subprocess.run([*self.run_as, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "pg.log"),
                        "-w", "-o", opts, "start"], check=True, capture_output=True)
        return f"postgresql+psycopg://hangd@127.0.0.1:{self.port}/postgres"

    def version(self) -> str:
        out = subprocess.run([str(self.bindir / "postgres"), "--version"], capture_output=True, text=True)
        return out.stdout.strip()

    def stop(self) -> None:
        subprocess.run([*self.run_as, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------- the fleet

def layout(nodes: int, ranks: int, jobs: int) -> list[tuple[str, int, int]]:
    """Per node: (its job's key, the job's world size, the global rank of its first local rank).
    The nodes are split into ``jobs`` equal jobs, each spanning nodes // jobs nodes."""
    per_job = max(1, nodes // jobs)
    out = []
    for n in range(nodes):
        j = min(n // per_job, jobs - 1)
        first_node = j * per_job
        size = (nodes - first_node if j == jobs - 1 else per_job) * ranks
        out.append((f"slurm:{4200 + j}", size, (n - first_node) * ranks))
    return out


class SimNode:
    """What one node's daemon hands its store each tick."""

    def __init__(self, url: str, index: int, ranks: int, job: str, world: int, first_rank: int) -> None:
        self.name = f"node-{index:03d}"
        self.index = index
        self.store = Store(url, hostname=self.name, migrate=False)
        self.calls: list[float] = []  # seconds of each read of the other nodes' ranks (by the writer thread)
        self.rows_read: list[int] = []
        real = self.store.remote_ranks

        def timed(jobs: list[str], now: float | None = None) -> Any:
            t0 = time.perf_counter()
            out = real(jobs, now)
            self.calls.append(time.perf_counter() - t0)
            self.rows_read.append(len(out))
            return out
        self.store.remote_ranks = timed  # type: ignore[method-assign]
        self.job, self.world, self.ranks = job, world, ranks
        self.pids = [10_000 + 100 * index + r for r in range(ranks)]
        self.global_ranks = [first_rank + r for r in range(ranks)]
        self.started = time.time()
        self.state = {pid: "busy" for pid in self.pids}
        self.since = {pid: self.started for pid in self.pids}
        self.frozen: float | None = None  # when the job stopped making progress
        self.incident: dict[str, Any] | None = None
        self.next_refresh = 0.0
        self.fresh = False
        self.ticks = 0
        self.remote_seen = 0
        self.store.start_writer()

    def hang(self, t: float, culprit_pid: int | None) -> list[dict[str, Any]]:
        """The job stops at t: the culprit (when it is on this node) stops in host code, every other
        rank waits in the collective. Returns the state changes of this tick."""
        self.frozen = t
        changes = []
        for pid, rank in zip(self.pids, self.global_ranks, strict=True):
            state, reason = ("hung", "no progress for 5 s, stack in host code") if pid == culprit_pid else \
                ("waiting_peer", "in allreduce, waiting for a peer")
            self.state[pid], self.since[pid] = state, t
            changes.append({"t": t, "pid": pid, "rank": rank, "job": self.job, "state": state, "reason": reason})
        return changes

    def open_incident(self, t: float, culprit_rank: int) -> None:
        nid = self.store.node_id
        self.incident = {
            "id": nid % ID_STRIDE + ID_STRIDE, "kind": "host_stall", "severity": "critical", "job": self.job,
            "status": "open", "opened_at": round(t, 3), "resolved_at": None, "updated_at": round(t, 3),
            "hang_started_at": round(self.frozen or t, 3), "pids": self.pids, "ranks": self.global_ranks,
            "culprit_pids": [], "culprit_ranks": [culprit_rank],
            "summary": f"job {self.job} hung: rank {culprit_rank} on node-000 stopped in host code; "
                       f"{self.world - 1} ranks wait in allreduce",
            "next_step": "Look at what the culprit rank is doing (its stack below) instead of killing the job.",
            "evidence": {"culprits": [{"rank": culprit_rank, "node": "node-000"}], "stack": ["train.py:88 step"] * 12},
            "findings": [{"kind": "host_stall", "text": "no progress"}], "timeline": [{"t": round(t, 3), "event": "opened"}],
            "acked": False,
        }
        self.next_refresh = t + REFRESH_S
        self.fresh = True

    def batch(self, t: float, changes: list[dict[str, Any]]) -> Batch:
        # what Daemon._attach_remote does before a tick: this node's spanning jobs, the last read
        self.store.want_remote({self.job})
        got = self.store.cached_remote()
        if got is not None:
            self.remote_seen = len(got[1])
        incidents = []
        if self.incident is not None and (self.fresh or t >= self.next_refresh):
            if not self.fresh:
                self.incident = dict(self.incident, updated_at=round(t, 3))
                self.next_refresh = t + REFRESH_S
            self.fresh = False
            incidents.append(self.incident)
        procs = []
        for pid, rank in zip(self.pids, self.global_ranks, strict=True):
            progress = self.frozen if self.frozen is not None else t - 0.2  # a working rank moves every step
            procs.append({"world_size": self.world, "waits": self.state[pid] == "waiting_peer",
                          "reading": "its stack is in allreduce" if self.state[pid] == "waiting_peer" else
                          ("its stack is sleeping in host code" if self.state[pid] == "hung" else "it computes"),
                          "pid": pid, "rank": rank, "rank_from": "env RANK", "job": self.job, "state": self.state[pid],
                          "since": round(self.since[pid], 3), "reason": "steps advance" if self.state[pid] == "busy" else
                          "no progress", "gpus": [pid % GPUS_PER_NODE], "gpu_mem_bytes": 60 << 30, "cpu_cores": 1.02,
                          "last_progress": round(progress, 3), "last_progress_why": "log line", "command":
                          "python -u train.py --config configs/llm-70b.yaml", "log_grew_at": progress})
        worst = "hung" if "hung" in self.state.values() else ("waiting_peer" if self.frozen else "busy")
        jobs = [{"job": self.job, "name": "train.py", "state": worst,
                 "ranks": {str(r): p for p, r in zip(self.pids, self.global_ranks, strict=True)},
                 "rank_from": {str(r): "env RANK" for r in self.global_ranks},
                 "identity": {"slurm_job": self.job.split(":")[1]}, "world_size": self.world, "launcher": None,
                 "last_progress": round(self.frozen or t - 0.2, 3), "spans_nodes": f"SLURM_NNODES {self.world // self.ranks}"}]
        gpus = [{"index": i, "uuid": f"GPU-{self.index:04d}{i:04d}-0000-0000-0000-000000000000", "name": "NVIDIA H200",
                 "mem_total": 150 << 30, "util_gpu": 0 if self.frozen else 97 + (self.ticks + i) % 3,
                 "gpm": {"SM_UTIL": 80.0}, "mem_used": 60 << 30, "power_w": 120.0 if self.frozen else 650.0 + i}
                for i in range(GPUS_PER_NODE)]
        self.ticks += 1
        return Batch(t=t, incidents=incidents, changes=changes, processes=procs, jobs=jobs, gpus=gpus,
                     spanning={self.job})


def worker(url: str, specs: list[tuple[int, str, int, int]], ranks: int, interval: float, t_start: float,
           t_hang: float, t_end: float, out: Any) -> None:
    """Run some of the nodes, in real time, from t_start to t_end; report per node."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    nodes = [SimNode(url, i, ranks, job, world, first) for i, job, world, first in specs]
    while time.time() < t_start:
        time.sleep(0.01)
    hang_job = "slurm:4200"
    hung = False
    late: list[float] = []
    k = 0
    while True:
        due = t_start + k * interval
        now = time.time()
        if now >= t_end:
            break
        if now < due:
            time.sleep(due - now)
        late.append(max(0.0, time.time() - due))
        t = time.time()
        for n in nodes:
            changes: list[dict[str, Any]] = []
            if t >= t_hang and n.job == hang_job and n.frozen is None:
                changes = n.hang(t_hang, 10_000 + 3 if n.index == 0 else None)
                hung = True
            if n.frozen is not None and n.incident is None and t >= t_hang + 5.0:  # detected after 5 s
                n.open_incident(t, 3)
            n.store.submit(n.batch(t, changes))
        k += 1
    for n in nodes:
        n.store.stop_writer(30.0)
    rep = []
    for n in nodes:
        rep.append({"node": n.name, "ticks": n.ticks, "pending": len(n.store.pending), "dropped": n.store.dropped,
                    "superseded": n.store.superseded, "write_failures": n.store.write_failures_total,
                    "remote_reads": len(n.calls), "remote_read_s": n.calls, "remote_rows": n.rows_read,
                    "remote_seen": n.remote_seen, "hung": hung})
        n.store.close()
    out.put({"nodes": rep, "late_s": late})


# ---------------------------------------------------------------------------------------- measuring

def pg_stats(conn: Any) -> dict[str, Any]:
    from sqlalchemy import text
    tables = {r[0]: {"ins": r[1], "upd": r[2], "hot_upd": r[3], "del": r[4], "live": r[5], "dead": r[6]}
              for r in conn.execute(text("SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_live_tup, "
                                         "n_dead_tup FROM pg_stat_user_tables"))}
    for name, d in tables.items():
        d["bytes"] = conn.execute(text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": name}).scalar()
    db = conn.execute(text("SELECT xact_commit, xact_rollback, tup_fetched, tup_returned, blks_hit, blks_read "
                           "FROM pg_stat_database WHERE datname = current_database()")).one()
    wal = conn.execute(text("SELECT wal_records, wal_bytes FROM pg_stat_wal")).one()
    stmts: dict[str, int] = {}
    try:
        # top-level statements only: the foreign-key checks PostgreSQL runs inside an INSERT are
        # not statements a client sent
        for q, calls in conn.execute(text("SELECT query, sum(calls) FROM pg_stat_statements WHERE toplevel AND dbid = "
                                          "(SELECT oid FROM pg_database WHERE datname = current_database()) GROUP BY query")):
            stmts[q] = int(calls)
    except Exception:  # noqa: BLE001 - the extension is optional: without it, transactions only
        conn.rollback()
    return {"tables": tables, "db_bytes": conn.execute(text("SELECT pg_database_size(current_database())")).scalar(),
            "xact_commit": db[0], "xact_rollback": db[1], "tup_fetched": db[2], "tup_returned": db[3],
            "wal_records": int(wal[0]), "wal_bytes": int(wal[1]), "statements": stmts, "t": time.time()}


def bytes_per_row(conn: Any, table: str, rows: int = 50_000) -> float | None:
    """What one more row of an insert-only table costs on disk, heap, TOAST and indexes together:
    the table's rows copied until it holds ``rows`` of them, its size divided by its rows. (A
    table of a few hundred rows is measured in whole 8 KiB pages and says nothing per row.)"""
    from sqlalchemy import text
    n = conn.execute(text(f"SELECT count(*) FROM {table}")).scalar()
    if not n:
        return None
    cols = [r[0] for r in conn.execute(text("SELECT column_name FROM information_schema.columns WHERE table_name = :t "
                                            "AND column_name <> 'id' ORDER BY ordinal_position"), {"t": table})]
    keycol = "minute" if table == "gpu_minutes" else "t"  # unique (node, gpu, minute): shift the copies in time
    sel = ", ".join(f"{c} + g.i * 100000" if c == keycol else c for c in cols)
    copies = max(1, rows // n)
    conn.execute(text(f"INSERT INTO {table} ({', '.join(cols)}) SELECT {sel} FROM {table}, "
                      f"generate_series(1, {copies}) AS g(i)"))
    conn.commit()
    total = conn.execute(text(f"SELECT pg_total_relation_size('{table}'), count(*) FROM {table}")).one()
    return float(total[0]) / float(total[1])


def quiet_remote_read(url: str, job: str, n: int = 50) -> dict[str, Any]:
    """One node's read of the other nodes' ranks, alone (the writers stopped): what the writer
    thread of a node of the fleet pays for it each tick, without 64 simulated nodes on the CPU."""
    st = Store(url, hostname="node-000", migrate=False)
    try:
        now = time.time()
        st.remote_ranks([job], now)  # the connection opened
        xs, rows = [], 0
        for _ in range(n):
            t0, c0 = time.perf_counter(), time.process_time()
            rows = len(st.remote_ranks([job], now))
            xs.append((time.perf_counter() - t0, time.process_time() - c0))
        return {"n": n, "rows": rows, "wall_p50_ms": round(1000 * pct([x[0] for x in xs], 50), 2),
                "wall_p99_ms": round(1000 * pct([x[0] for x in xs], 99), 2),
                "client_cpu_mean_ms": round(1000 * statistics.fmean(x[1] for x in xs), 2)}
    finally:
        st.close()


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))] if xs else float("nan")


def time_api(base: str, job: str, n: int, t_stop: float) -> dict[str, Any]:
    import httpx
    paths = {"/jobs": "/jobs", "/jobs/{key}": f"/jobs/{urllib.parse.quote(job, safe='')}", "/incidents": "/incidents"}
    got: dict[str, list[float]] = {k: [] for k in paths}
    codes: dict[str, set[int]] = {k: set() for k in paths}
    sizes: dict[str, int] = {}
    ranks_listed = None
    with httpx.Client(base_url=base, timeout=30) as c:
        for _ in range(n):
            if time.time() >= t_stop:
                break
            for name, path in paths.items():
                t0 = time.perf_counter()
                r = c.get(path)
                got[name].append(time.perf_counter() - t0)
                codes[name].add(r.status_code)
                sizes[name] = len(r.content)
                if name == "/jobs/{key}" and r.status_code == 200:
                    body = r.json()
                    fr = body.get("fleet_ranks") if isinstance(body, dict) else None
                    ranks_listed = len(fr) if isinstance(fr, dict) else ranks_listed
    return {k: {"n": len(v), "p50_ms": round(1000 * pct(v, 50), 1), "p99_ms": round(1000 * pct(v, 99), 1),
                "max_ms": round(1000 * max(v), 1) if v else None, "status": sorted(codes[k]), "bytes": sizes.get(k)}
            for k, v in got.items()} | {"job_fleet_ranks_listed": ranks_listed}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--ranks", type=int, default=8, help="ranks per node")
    ap.add_argument("--jobs", type=int, default=1, help="jobs, each spanning nodes/jobs nodes (1: one job of every rank)")
    ap.add_argument("--seconds", type=float, default=60.0, help="the measured window (after the warm-up)")
    ap.add_argument("--warmup", type=float, default=12.0)
    ap.add_argument("--interval", type=float, default=1.0, help="tick interval (hangd's default: 1 s)")
    ap.add_argument("--procs", type=int, default=0, help="worker processes (default: one per 16 nodes, at least 2)")
    ap.add_argument("--api-requests", type=int, default=200)
    ap.add_argument("--no-api", action="store_true")
    ap.add_argument("--retention-days", type=float, default=30.0, help="hangd's retention_days (default 30)")
    ap.add_argument("--out")
    a = ap.parse_args()
    from sqlalchemy import create_engine, text

    pg = Postgres()
    url = pg.start()
    served: subprocess.Popen[bytes] | None = None
    try:
        upgrade(url)  # every node migrates at start; once is enough here
        admin = create_engine(url, future=True)
        with admin.connect() as c:
            if pg.statements:
                c.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
                c.commit()
        specs = [(i, job, world, first) for i, (job, world, first) in enumerate(layout(a.nodes, a.ranks, a.jobs))]
        procs = a.procs or max(2, math.ceil(a.nodes / 16))
        t_start = time.time() + 3.0 + 0.15 * a.nodes  # every node's Store is made (and registered) first
        t_measure = t_start + a.warmup
        t_hang = t_measure + a.seconds * 0.3
        t_end = t_measure + a.seconds
        q: Any = mp.get_context("spawn").Queue()
        ws = [mp.get_context("spawn").Process(target=worker, args=(url, specs[w::procs], a.ranks, a.interval, t_start,
                                                                   t_hang, t_end, q)) for w in range(procs)]
        for w in ws:
            w.start()
        api_port = free_port()
        base = f"http://127.0.0.1:{api_port}"
        if not a.no_api:
            log = open(pg.dir / "serve.log", "w")
            served = subprocess.Popen([sys.executable, "-m", "hangd", "serve", "--listen", f"127.0.0.1:{api_port}",
                                       "--db", url, "--node-name", "api-node"], cwd=ROOT, stdout=log,
                                      stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        while time.time() < t_measure:
            time.sleep(0.1)
        with admin.connect() as c:
            before = pg_stats(c)
        api: dict[str, Any] = {}
        if served is not None:
            wait_healthy(base)
            time.sleep(max(0.0, t_hang + 8.0 - time.time()))  # with the incident open
            api = time_api(base, "slurm:4200", a.api_requests, t_end - 1.0)
        while time.time() < t_end:
            time.sleep(0.1)
        # the statistics views are flushed by each backend within a second of its transactions
        time.sleep(1.5)
        with admin.connect() as c:
            after = pg_stats(c)
        reps = [q.get(timeout=120) for _ in ws]
        for w in ws:
            w.join(60)
        if served is not None:  # the same requests with the writers stopped: what the CPU of this machine costs them
            api["quiet"] = time_api(base, "slurm:4200", 50, time.time() + 60)
        with admin.connect() as c:
            incidents = [dict(r._mapping) for r in c.execute(text(
                "SELECT id, node_id, job, status, open_key, jsonb_array_length(CAST(timeline AS jsonb)) AS timeline_len "
                "FROM incidents ORDER BY id"))]
            open_for_job = c.execute(text("SELECT count(*) FROM incidents WHERE job = 'slurm:4200' AND status = 'open'")).scalar()
            total_for_job = c.execute(text("SELECT count(*) FROM incidents WHERE job = 'slurm:4200'")).scalar()
            incident_bytes = c.execute(text("SELECT avg(pg_column_size(i.*)) FROM incidents i")).scalar()
            calib = {t: bytes_per_row(c, t) for t in ("gpu_minutes", "state_changes")}
            remote_sql = c.execute(text(
                "SELECT sum(calls), sum(total_exec_time) / sum(calls), sum(rows) / sum(calls) FROM pg_stat_statements "
                "WHERE toplevel AND query LIKE 'SELECT processes.job, nodes.hostname%'")).one() if pg.statements else None
        admin.dispose()
        quiet = quiet_remote_read(url, "slurm:4200")
        if remote_sql is not None and remote_sql[0]:
            quiet["server_exec_ms_mean_during_run"] = round(float(remote_sql[1]), 2)
            quiet["server_rows_per_call_during_run"] = round(float(remote_sql[2]), 1)
        result = summarize(a, pg, before, after, reps, api, incidents, int(open_for_job or 0), int(total_for_job or 0),
                           procs, t_hang - t_measure, calib, float(incident_bytes or 0))
        result["remote_read_quiet"] = quiet
    finally:
        if served is not None:
            end(served, signal.SIGTERM)
        pg.stop()
    text_out = json.dumps(result, indent=1, sort_keys=False)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text_out + "\n")
    print(json.dumps({k: result[k] for k in ("nodes", "ranks", "rows_per_s", "statements_per_s", "xact_per_s",
                                             "mb_per_day", "api", "hang", "remote_read", "kept_up")}, indent=1))
    return 0


def summarize(a: argparse.Namespace, pg: Postgres, before: dict[str, Any], after: dict[str, Any],
              reps: list[dict[str, Any]], api: dict[str, Any], incidents: list[dict[str, Any]], open_for_job: int,
              total_for_job: int, procs: int, hang_at: float, calib: dict[str, float | None],
              incident_bytes: float) -> dict[str, Any]:
    dt = after["t"] - before["t"]
    per_table: dict[str, Any] = {}
    ins = upd = dele = 0
    for name, d1 in sorted(after["tables"].items()):
        d0 = before["tables"].get(name, {"ins": 0, "upd": 0, "hot_upd": 0, "del": 0, "bytes": 0})
        di, du, dd = d1["ins"] - d0["ins"], d1["upd"] - d0["upd"], d1["del"] - d0["del"]
        ins, upd, dele = ins + di, upd + du, dele + dd
        per_table[name] = {"inserted": di, "updated": du, "hot_updated": d1["hot_upd"] - d0["hot_upd"], "deleted": dd,
                           "ins_per_s": round(di / dt, 2), "upd_per_s": round(du / dt, 2), "live_rows": d1["live"],
                           "dead_rows": d1["dead"], "bytes_before": d0["bytes"], "bytes_after": d1["bytes"],
}
    stmts = None
    top: list[tuple[str, int]] = []
    if after["statements"]:
        calls = {q: c - before["statements"].get(q, 0) for q, c in after["statements"].items()}
        calls = {q: c for q, c in calls.items() if c > 0 and "pg_stat" not in q and "pg_total_relation_size" not in q
                 and "pg_database_size" not in q}
        stmts = sum(calls.values())
        top = sorted(calls.items(), key=lambda kv: -kv[1])[:12]
    nodes = [n for r in reps for n in r["nodes"]]
    late = [x for r in reps for x in r["late_s"]]
    reads = [x for n in nodes for x in n["remote_read_s"]]
    rows_read = [x for n in nodes for x in n["remote_rows"]]
    ticks_expected = (a.warmup + a.seconds) / a.interval
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    gpu_minute_rows_day = a.nodes * GPUS_PER_NODE * 1440
    return {
        "nodes": a.nodes, "ranks": a.ranks, "jobs": a.jobs, "interval_s": a.interval, "heartbeat_s": HEARTBEAT_S,
        "seconds": round(dt, 2), "warmup_s": a.warmup, "worker_processes": procs, "hang_at_s": round(hang_at, 1),
        "rows_per_s": {"inserted": round(ins / dt, 1), "updated": round(upd / dt, 1), "deleted": round(dele / dt, 1),
                       "total": round((ins + upd + dele) / dt, 1), "per_node": round((ins + upd + dele) / dt / a.nodes, 2)},
        "statements_per_s": round(stmts / dt, 1) if stmts is not None else None,
        "statements_per_node_s": round(stmts / dt / a.nodes, 2) if stmts is not None else None,
        "xact_per_s": round((after["xact_commit"] - before["xact_commit"]) / dt, 1),
        "xact_rollback": after["xact_rollback"] - before["xact_rollback"],
        "wal_bytes_per_s": round((after["wal_bytes"] - before["wal_bytes"]) / dt),
        "tuples_fetched_per_s": round((after["tup_fetched"] - before["tup_fetched"]) / dt),
        "mb_per_day": {
            # the rows that accumulate: one per GPU per minute, whatever happens; a state change
            # per rank that changes state (here: the whole job once, at the hang); an incident per hang
            "gpu_minutes": round(gpu_minute_rows_day * (calib.get("gpu_minutes") or 0) / 1e6, 1),
            "gpu_minutes_rows_per_day": gpu_minute_rows_day,
            "bytes_per_gpu_minute_row": round(calib.get("gpu_minutes") or 0, 1),
            "bytes_per_state_change_row": round(calib.get("state_changes") or 0, 1),
            "mb_per_job_wide_state_change": round(a.nodes * a.ranks * (calib.get("state_changes") or 0) / 1e6, 3),
            "bytes_per_incident_row": round(incident_bytes),
            "at_retention_mb": round(gpu_minute_rows_day * (calib.get("gpu_minutes") or 0) / 1e6 * a.retention_days, 1),
            "retention_days": a.retention_days,
            # the window's inserts as if the hang (every rank changing state once) recurred every window
            "window_inserts_extrapolated": round(sum(
                per_table[t]["inserted"] * (calib.get(t) or 0) for t in calib if t in per_table) / dt * 86400 / 1e6, 1),
            "db_bytes_before": before["db_bytes"], "db_bytes_after": after["db_bytes"],
            "db_growth_extrapolated_mb_day": round((after["db_bytes"] - before["db_bytes"]) / dt * 86400 / 1e6, 1),
            "wal_mb_per_day": round((after["wal_bytes"] - before["wal_bytes"]) / dt * 86400 / 1e6),
        },
        "tables": per_table,
        "top_statements": [{"calls_per_s": round(c / dt, 2), "query": q[:240]} for q, c in top],
        "api": api,
        "hang": {"job": "slurm:4200", "open_incident_rows_for_job": open_for_job, "incident_rows_for_job": total_for_job,
                 "incidents": incidents[:10]},
        "remote_read": {"reads": len(reads), "p50_ms": round(1000 * pct(reads, 50), 2),
                        "p99_ms": round(1000 * pct(reads, 99), 2),
                        "mean_ms": round(1000 * statistics.fmean(reads), 2) if reads else None,
                        "rows_per_read_median": statistics.median(rows_read) if rows_read else None,
                        "per_node_per_s": round(len(reads) / (a.warmup + a.seconds) / a.nodes, 2)},
        "kept_up": {"ticks_expected_per_node": round(ticks_expected), "ticks_min": min(n["ticks"] for n in nodes),
                    "pending_at_end_max": max(n["pending"] for n in nodes),
                    "superseded_total": sum(n["superseded"] for n in nodes),
                    "dropped_total": sum(n["dropped"] for n in nodes),
                    "write_failures_total": sum(n["write_failures"] for n in nodes),
                    "tick_late_p50_ms": round(1000 * pct(late, 50), 1), "tick_late_p99_ms": round(1000 * pct(late, 99), 1)},
        "machine": {"cpus": os.cpu_count(), "loadavg_1_5_15": [round(x, 2) for x in load],
                    "python": platform.python_version(), "postgresql": pg.version(),
                    "pg_stat_statements": pg.statements, "niceness": os.nice(0)},
    }


if __name__ == "__main__":
    raise SystemExit(main())
