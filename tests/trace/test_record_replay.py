"""`hangd record` on this machine, then `hangd replay` of it, gives back the same snapshots."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

from hangd.trace import TraceReader, TraceWriter

from ..conftest import PLANTED_SECRET, TRACES, run_hangd


def test_record_a_live_job_then_replay_gives_the_same_snapshots(tmp_path):
    log = tmp_path / "job.log"
    # rank 5 of 6: a trace's meta maps rank -> pid for the node, and other jobs on the machine
    # (a soak, another test run) are usually ranks 0 and 1
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29777", RANK="5", WORLD_SIZE="6",
               HF_TOKEN=PLANTED_SECRET + "XYZ")
    with open(log, "w") as f:
        job = subprocess.Popen([sys.executable, "-c",
                                "import time\nfor i in range(100):\n print('step', i, flush=True); time.sleep(0.1)"],
                               env=env, stdout=f, stderr=subprocess.STDOUT)
    out = tmp_path / "trace"
    try:
        time.sleep(0.3)
        run_hangd("record", "--out", str(out), "--seconds", "3", "--hz", "4", "--stacks-every", "1")
    finally:
        job.kill()
        job.wait()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["format"] == "hangd-trace/1" and job.pid in meta["ranks"].values()
    snaps = list(TraceReader(out).snapshots())
    assert len(snaps) >= 8
    procs = [p for s in snaps for p in s.procs if p.pid == job.pid]
    assert len(procs) >= 8 and all(p.state in ("R", "S") for p in procs)
    assert any(st.pid == job.pid and st.threads for s in snaps for st in s.stacks), "stacks were captured"
    sizes = [f.size for s in snaps for f in s.files if f.path == str(log)]
    assert sizes and sizes[-1] > sizes[0]
    assert PLANTED_SECRET not in (out / "trace.jsonl").read_text()
    # write what we read back, read it again: the same snapshots
    again = tmp_path / "again"
    with TraceWriter(again, {k: v for k, v in meta.items() if k not in ("t_start", "t_end", "ranks", "gpus")}) as w:
        for s in snaps:
            w.write(s)
    snaps2 = list(TraceReader(again).snapshots())

    def norm(s):
        d = dataclasses.asdict(s)
        for st in d["stacks"]:
            st.pop("raw")
        for f in d["files"]:
            f.pop("tail")
        return d
    assert [norm(s) for s in snaps] == [norm(s) for s in snaps2]
    doc = json.loads(run_hangd("replay", str(out), "--json").stdout)
    states = [s for s in doc["states"] if s["pid"] == job.pid]
    assert states and states[0]["state"] == "starting"


def test_shared_traces_roundtrip_through_the_writer(tmp_path):
    src = TRACES / "cpu_hang"
    snaps = list(TraceReader(src).snapshots())
    with TraceWriter(tmp_path / "t", {"scenario": "cpu_hang"}) as w:
        for s in snaps:
            w.write(s)
    back = list(TraceReader(tmp_path / "t").snapshots())
    assert len(back) == len(snaps)
    assert [len(s.gpus) for s in back] == [len(s.gpus) for s in snaps]
    assert [p.pid for s in back for p in s.procs] == [p.pid for s in snaps for p in s.procs]
    assert sum(len(s.stacks) for s in back) == sum(len(s.stacks) for s in snaps) > 0
    assert sum(len(s.fr_dumps) for s in back) == 2


def test_replay_paced_takes_real_time():
    t0 = time.monotonic()
    run_hangd("replay", str(TRACES / "idle_server"), "--speed", "20")
    took = time.monotonic() - t0
    assert took >= 16.0 / 20 * 0.8, took  # idle_server spans ~16 s


def test_bad_trace_dir_is_a_clean_error(tmp_path):
    out = run_hangd("replay", str(tmp_path), check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "trace.jsonl" in out.stderr


JOB_SCRIPT = """
import sys, time
for line in ("password = logsecret1", "Authorization: Bearer logsecret2", "pulling https://u:logsecret3@h/x",
             '{"api_key": "logsecret4"}', "--hf-token=logsecret5", "ok step 1"):
    print(line, flush=True)
time.sleep(30)
"""


def test_record_redacts_command_lines_and_copied_logs(tmp_path):
    log = tmp_path / "job.log"
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29778", RANK="0", WORLD_SIZE="1")
    args = ["api_key=cmdsecret1", "--hf-token", "cmdsecret2", "--db=postgres://u:cmd@secret3@h/db",
            "https://h/x?token=cmdsecret4&page=2"]
    with open(log, "w") as f:
        job = subprocess.Popen([sys.executable, "-c", JOB_SCRIPT, *args], env=env, stdout=f, stderr=subprocess.STDOUT)
    out = tmp_path / "trace"
    try:
        time.sleep(0.5)
        run_hangd("record", "--out", str(out), "--seconds", "1.5", "--hz", "4")
    finally:
        job.kill()
        job.wait()
    files = [p for p in out.rglob("*") if p.is_file()]
    everything = b"".join(p.read_bytes() for p in files)
    for secret in ("cmdsecret1", "cmdsecret2", "secret3", "cmdsecret4", "logsecret1", "logsecret2", "logsecret3",
                   "logsecret4", "logsecret5"):
        assert secret.encode() not in everything, secret
    infos = [i for s in TraceReader(out).snapshots() for i in s.infos if i.pid == job.pid]
    assert infos and infos[0].cmdline[-5:] == ["api_key=<redacted>", "--hf-token", "<redacted>",
                                               "--db=postgres://u:<redacted>@h/db",
                                               "https://h/x?token=<redacted>&page=2"]
    meta = json.loads((out / "meta.json").read_text())
    copy = out / meta["log_files"][str(log)]
    assert copy.stat().st_size == log.stat().st_size  # byte offsets in file events still hold
    assert "ok step 1" in copy.read_text() and "Authorization: Bearer <redacted>" in copy.read_text()


def test_a_recording_keeps_the_clock_tick_rate_and_an_old_one_reads_as_100(tmp_path):
    from hangd.snapshot import DEFAULT_CLK_TCK, ProcSample, Snapshot

    with TraceWriter(tmp_path / "t") as w:
        w.write(Snapshot(t=1.0, procs=[ProcSample(pid=5, utime=1000, stime=0, clk_tck=1000)]))
    (p,) = next(iter(TraceReader(tmp_path / "t").snapshots())).procs
    assert p.clk_tck == 1000
    old = next(s for s in TraceReader(TRACES / "nccl_stall").snapshots() if s.procs)
    assert all(q.clk_tck is None for q in old.procs)  # recorded before the rate was carried: 100
    assert DEFAULT_CLK_TCK == 100
