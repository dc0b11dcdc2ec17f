"""What the other nodes' flight-recorder dumps cost a recording (``remote_dumps`` events).

A node of a fleet is handed the dumps of ``--ranks`` ranks on other nodes, each the real
``nccl_stall`` dump of rank 1 as the shared store keeps it (its newest 64 entries), or with
``--groups 16`` the most a store keeps of a rank (16 groups x 64 = 1024 rows). The writer runs
``--ticks`` ticks at 4 Hz with a heartbeat every 2 s and one new dump of every rank half way.
Measured: the bytes a dump file takes, the CPU time to write a dump and to read one back
(checked field by field and rebuilt), what the unchanged ticks add, and the events written.

python -m benchmarks.trace_remote_dumps [--ranks 56] [--groups 16] [--json]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import tempfile
import time
from pathlib import Path

from benchmarks.common import emit
from hangd.flightrec.reader import Dump, read_file
from hangd.flightrec.rows import from_rows, to_rows
from hangd.snapshot import ProcSample, RemoteDump, Snapshot
from hangd.trace import TraceReader, TraceWriter

FR = Path(__file__).resolve().parent.parent / "tests" / "data" / "traces" / "h200x2" / "nccl_stall" / "files"


def _dump(groups: int) -> Dump:
    real = read_file(str(FR / "nccl_trace_rank_1"), 1)
    if groups > 1:
        entries = real.entries[-64:]
        real.entries = [dataclasses.replace(e, pg=f"pg{g}") for g in range(groups) for e in entries]
    return from_rows(1, *to_rows(real))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=56, help="ranks on other nodes (default 56: 7 nodes of 8)")
    ap.add_argument("--groups", type=int, default=1, help="process groups per dump, 64 entries each")
    ap.add_argument("--ticks", type=int, default=400)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    dump = _dump(args.groups)
    with tempfile.TemporaryDirectory() as tmp:
        cpu = {"first": 0.0, "new": 0.0, "steady": 0.0}
        with TraceWriter(tmp) as w:
            for i in range(args.ticks):
                t = 1000.0 + i / 4
                read_at = 1000.0 if i < args.ticks // 2 else 1000.0 + args.ticks / 8
                dumps = [RemoteDump(job="j", node=f"node-{r // 8}", rank=r, read_at=read_at,
                                    reported_at=1000.0 + 2 * (i // 8), dump=copy.copy(dump)) for r in range(args.ranks)]
                c0 = time.process_time()
                w.write(Snapshot(t=t, procs=[ProcSample(pid=5)], remote_dumps=dumps))
                dt = time.process_time() - c0
                cpu["first" if i == 0 else "new" if i == args.ticks // 2 else "steady"] += dt
        files = list(Path(tmp, "files").glob("*remote_fr_rank_*"))
        events = [line for line in Path(tmp, "trace.jsonl").read_text().splitlines() if '"remote_dumps"' in line]
        c0 = time.process_time()
        snaps = sum(1 for _ in TraceReader(tmp).snapshots())
        read_cpu = time.process_time() - c0
        size = sum(p.stat().st_size for p in files)
        emit({"ranks": args.ranks, "rows_per_dump": len(dump.entries), "dump_files": len(files),
              "kB_per_dump": round(size / len(files) / 1e3, 1), "remote_dumps_events": len(events), "ticks": args.ticks,
              "kB_of_events": round(sum(len(e) for e in events) / 1e3, 1),
              "write_ms_per_dump": round(1000 * (cpu["first"] + cpu["new"]) / len(files), 2),
              "write_ms_per_tick_without_new_dumps": round(1000 * cpu["steady"] / (args.ticks - 2), 3),
              "read_ms_per_dump": round(1000 * read_cpu / len(files), 2), "snapshots_read": snaps},
             "remote dumps in a recording (CPU time)")


if __name__ == "__main__":
    main()
