"""What a long-lived daemon keeps per process and per log stays bounded while jobs come and go.

A node that starts jobs all day shows hangd a new pid (and often a new log file) every few
seconds: whatever is kept by pid or by path must leave with the process."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from hangd.analysis.engine import Analyzer
from hangd.analysis.thresholds import Thresholds
from hangd.snapshot import Snapshot
from hangd.sources.output import OutputSource
from hangd.sources.procfs import ProcSource

from ..analysis.builders import Node, churn, torchrun_env


def _stat(pid: int, state: str = "S") -> str:
    # the fields after "(comm)": state, ppid, ..., utime (11), stime (12), threads (17), start (19), rss (21)
    rest = [state, "1"] + ["0"] * 40
    rest[17], rest[19], rest[21] = "1", "100", "100"
    return f"{pid} (python) " + " ".join(rest) + "\n"


def _fake_proc(root: Path, pid: int) -> Path:
    d = root / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True)
    (d / "stat").write_text(_stat(pid))
    (d / "task" / str(pid) / "stat").write_text(_stat(pid))
    (d / "environ").write_bytes(b"MASTER_ADDR=127.0.0.1\0RANK=0\0")
    (d / "status").write_text("Name:\tpython\nvoluntary_ctxt_switches:\t1\nnonvoluntary_ctxt_switches:\t0\n")
    (d / "io").write_text("rchar: 1\nwchar: 1\n")
    (d / "wchan").write_text("futex_wait")
    return d


def test_a_process_that_vanishes_between_the_listing_and_its_read_leaves_nothing(tmp_path):
    """A /proc tree (the source's injectable root) where each process exits just after the
    directory listing and before its files are read, the way a short process does under a busy
    tick: every per-pid reading the source kept goes with it."""
    (tmp_path / "stat").write_text("btime 1700000000\n")
    src = ProcSource(proc_root=str(tmp_path))
    for pid in range(500, 560):
        d = _fake_proc(tmp_path, pid)
        for _ in range(2):
            src.collect(Snapshot(t=time.time()))
        assert pid in src._last
        (d / "stat").unlink()  # listed, but its stat no longer reads: it exited mid-tick
        snap = Snapshot(t=time.time())
        src.collect(snap)
        assert any(p.pid == pid and p.gone for p in snap.procs)
        for f in d.rglob("*"):
            if f.is_file():
                f.unlink()
        for sub in sorted(d.rglob("*"), reverse=True):
            sub.rmdir()
        d.rmdir()
        src.collect(Snapshot(t=time.time()))
    assert not src._known and not src._last and not src._io_raw and not src._threads_at


def test_the_sizes_of_logs_nobody_writes_any_more_are_forgotten(tmp_path):
    """Real short jobs, each writing its own log: the output source keeps the size of a log only
    while a watched process writes it."""
    # only these children are watched (the key is theirs alone), whatever else runs on the host
    src, out = ProcSource(job_env=("HANGD_CHURN_TEST",)), OutputSource()

    def tick() -> Snapshot:
        snap = Snapshot(t=time.time())
        src.collect(snap)
        out.collect(snap)
        return snap

    logs = []
    for i in range(8):
        log, stop = tmp_path / f"job{i}.log", tmp_path / f"stop{i}"
        logs.append(str(log))
        with open(log, "w") as f:
            child = subprocess.Popen(["/bin/sh", "-c", f"echo step 1; while [ ! -e {stop} ]; do sleep 0.05; done"],
                                     env=dict(os.environ, HANGD_CHURN_TEST="1"), stdout=f, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not any(fs.path == str(log) for fs in tick().files) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert str(log) in out._sizes, "its log was watched while it ran"
        stop.touch()
        child.wait()
        tick()  # it is reaped: this tick sees it gone
    assert not [p for p in out._sizes if p in logs], out._sizes
    assert not [pid for pid, paths in out._paths.items() if set(paths) & set(logs)]


def test_the_analysis_forgets_pids_and_logs_of_jobs_long_gone():
    """Jobs on GPUs, each with its own log whose lines carry torch's [rankN] prefix: once their
    processes have left the view, nothing is kept by their pids or their log paths."""
    an = Analyzer(Thresholds(gone_after_s=10.0, serve_job_quiet_s=10.0))
    node = Node([], analyzer=an)
    # the rank number only in the log prefix, not in the environment
    churn(node, 40, rank_env=lambda r, port: {k: v for k, v in torchrun_env(r, 2, port=port).items() if k != "RANK"},
          with_logs=True)
    view = an.view
    assert len(view.procs) <= 10
    assert len(view.gpu_seen_at) <= 10, len(view.gpu_seen_at)
    assert len(view.log_ranks) <= 10, len(view.log_ranks)
    assert len(view.files) <= 10, len(view.files)
