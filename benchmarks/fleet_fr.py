"""What the flight-recorder entries of a job that spans nodes cost in the shared PostgreSQL.

One node (a real ``hangd.store.db.Store``) writes the dumps of a job's ranks as the daemon hands
them over (``Batch.fr``), each a normalized dump of ``--entries`` collectives in one process
group, with frames as PyTorch records them; another node reads them as its writer thread does
(``remote_dumps``). Measured: rows and bytes written per rank-dump (the bound keeps the newest
``KEEP_PER_GROUP`` entries per group, no frames), the writer's time per rank-dump, and the read of
the job's dumps: the first one (every entry), the steady one (the ranks' rows only: nothing
changed), and one after a rank's dump was replaced. The writer and the reader run on the machine
of the database (loopback): on a network, add a round trip per statement (two for the steady read,
four for one with new dumps). Then what ``GET /jobs/{key}`` and ``hangd status --job`` add: the
job's flight-recorder summary (``fleet_flight_recorder``: where each rank stands per group), its
time and its size as JSON.

    python benchmarks/fleet_fr.py --ranks 16 --entries 2000 --out benchmarks/results/fleet-fr.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.fleet_write_load import Postgres, pct  # noqa: E402
from hangd.flightrec.reader import Dump, Entry  # noqa: E402
from hangd.flightrec.rows import KEEP_PER_GROUP  # noqa: E402
from hangd.store.db import Batch, Store, upgrade  # noqa: E402

FRAMES = [{"name": n, "filename": f, "line": i} for i, (n, f) in enumerate([
    ("all_reduce", "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"),
    ("wrapper", "/usr/lib/python3/site-packages/torch/distributed/c10d_logger.py"),
    ("_reduce_grads", "/srv/train/model/fsdp.py"), ("step", "/srv/train/train.py"), ("<module>", "/srv/train/train.py")])]


def dump(rank: int, entries: int, world: int) -> Dump:
    es = [Entry(record_id=s - 1, pg="0", pg_id=0, seq=s, p2p_seq=0, op="nccl:all_reduce",
                state="completed" if s < entries else "scheduled", completed=s < entries,
                input_sizes=[[4096, 4096]], input_dtypes=["BFloat16"], output_sizes=[[4096, 4096]], is_p2p=False,
                frames=FRAMES, time_created_ns=1_764_000_000_000_000_000 + s * 1_000_000, timeout_ms=600_000)
          for s in range(1, entries + 1)]
    return Dump(rank=rank, version="2.10", encoding="pickle",
                pg_config={"0": {"pg_id": "0", "desc": "default_pg", "ranks": list(range(world))}},
                pg_status={"0": {"last_enqueued_collective": entries, "last_started_collective": entries,
                                 "last_completed_collective": entries - 1}}, entries=es)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=16)
    p.add_argument("--entries", type=int, default=2000)
    p.add_argument("--reads", type=int, default=50)
    p.add_argument("--out", default="")
    a = p.parse_args()
    pg = Postgres()
    url = pg.start()
    try:
        upgrade(url)
        writer = Store(url, hostname="node-w", exclusive=True)
        reader = Store(url, hostname="node-r", exclusive=True)
        job = "rdzv:10.0.0.1:29500"
        dumps = {r: dump(r, a.entries, a.ranks) for r in range(a.ranks)}
        write_s = []
        t = time.time()
        for r, d in dumps.items():
            t0 = time.perf_counter()
            writer.submit(Batch(t=t, fr={(job, r): (t, d)}, spanning={job}))
            write_s.append(time.perf_counter() - t0)
        assert writer.healthy, writer.last_error
        with writer.engine.connect() as c:
            from sqlalchemy import text
            rows = c.execute(text("SELECT count(*) FROM fr_entries")).scalar()
            heads = c.execute(text("SELECT count(*) FROM fr_ranks")).scalar()
            col_bytes = c.execute(text("SELECT sum(pg_column_size(e.*)) FROM fr_entries e")).scalar()
            head_bytes = c.execute(text("SELECT sum(pg_column_size(r.*)) FROM fr_ranks r")).scalar()
            on_disk = c.execute(text("SELECT pg_total_relation_size('fr_entries') + pg_total_relation_size('fr_ranks')")).scalar()
        first_t0 = time.perf_counter()
        got = reader.remote_dumps([job], t)
        first = time.perf_counter() - first_t0
        assert len(got) == a.ranks and all(len(x.dump.entries) == KEEP_PER_GROUP for x in got)
        steady = []
        for _ in range(a.reads):
            t0 = time.perf_counter()
            reader.remote_dumps([job], t)
            steady.append(time.perf_counter() - t0)
        reader._dump_cache.clear()  # every entry again, on a connection and statements already warm
        t0 = time.perf_counter()
        reader.remote_dumps([job], t)
        again = time.perf_counter() - t0
        writer.submit(Batch(t=t + 1, fr={(job, 0): (t + 1, dumps[0])}, spanning={job}))
        t0 = time.perf_counter()
        reader.remote_dumps([job], t + 1)
        one_new = time.perf_counter() - t0
        summary_s = []
        for _ in range(max(5, a.reads // 5)):
            t0 = time.perf_counter()
            summary = reader.fleet_flight_recorder(job, t + 1)
            summary_s.append(time.perf_counter() - t0)
        assert len(summary["ranks"]) == a.ranks
        out: dict[str, Any] = {
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
            "postgres": pg.version(), "ranks": a.ranks, "entries_per_dump": a.entries, "keep_per_group": KEEP_PER_GROUP,
            "per_rank_dump": {"rows": (rows + heads) / a.ranks, "entry_rows": rows / a.ranks,
                              "row_bytes": round((col_bytes + head_bytes) / a.ranks),
                              "on_disk_bytes": round(on_disk / a.ranks),
                              "write_ms_p50": round(1000 * statistics.median(write_s), 2),
                              "write_ms_max": round(1000 * max(write_s), 2)},
            "read_job": {"first_ms": round(1000 * first, 2), "all_entries_warm_ms": round(1000 * again, 2),
                         "steady_ms_p50": round(1000 * pct(steady, 50), 2),
                         "steady_ms_p99": round(1000 * pct(steady, 99), 2),
                         "one_rank_replaced_ms": round(1000 * one_new, 2)},
            "job_view_summary": {"ms_p50": round(1000 * statistics.median(summary_s), 2),
                                 "ms_max": round(1000 * max(summary_s), 2),
                                 "json_bytes": len(json.dumps(summary))},
        }
        writer.close()
        reader.close()
    finally:
        pg.stop()
    print(json.dumps(out, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
