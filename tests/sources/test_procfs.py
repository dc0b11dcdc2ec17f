"""The /proc source against real child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hangd.redact import REDACTED
from hangd.snapshot import ProcInfo, ProcSample, Snapshot
from hangd.sources.output import OutputSource
from hangd.sources.procfs import ProcSource
from hangd.sources.procparse import describe_cgroup, parse_stat

CHILD_ENV = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "RANK": "0", "WORLD_SIZE": "1",
             "HF_TOKEN": "hf_EXAMPLEsecretEXAMPLEsecret", "NCCL_DEBUG": "WARN",
             "WANDB_API_KEY": "abc123", "TORCH_STORE_URL": "https://user:pw@example.invalid/x"}


def spawn(code: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, **CHILD_ENV)
    return subprocess.Popen([sys.executable, "-c", code], env=env, **kw)


def collect(src: ProcSource) -> Snapshot:
    snap = Snapshot(t=time.time())
    src.collect(snap)
    return snap


def sample_of(snap: Snapshot, pid: int):
    return next((p for p in snap.procs if p.pid == pid), None)


def test_sleeping_and_spinning_children():
    sleeper = spawn("import time; time.sleep(60)")
    spinner = spawn("while True: pass")
    try:
        time.sleep(0.5)
        src = ProcSource()
        collect(src)
        time.sleep(0.5)
        snap = collect(src)
        s, r = sample_of(snap, sleeper.pid), sample_of(snap, spinner.pid)
        assert s is not None and r is not None, "job-env processes must be watched"
        assert s.state == "S" and s.wchan and s.wchan != "0"
        assert r.state == "R"
        assert r.utime + r.stime > s.utime + s.stime
        assert s.threads == 1 and s.thread_states == {"S": 1}
        assert s.rss_bytes and s.rss_bytes > 1 << 20
        assert s.io is not None and "rchar" in s.io
        assert s.start_time and abs(s.start_time - time.time()) < 30
    finally:
        for p in (sleeper, spinner):
            p.kill()
            p.wait()


def test_info_once_with_secrets_redacted_and_needed_keys_only():
    child = spawn("import time; time.sleep(60)")
    try:
        time.sleep(0.3)
        src = ProcSource()
        first = collect(src)
        info = next(i for i in first.infos if i.pid == child.pid)
        assert info.environ["MASTER_ADDR"] == "127.0.0.1"
        assert info.environ["NCCL_DEBUG"] == "WARN"
        assert "HF_TOKEN" not in info.environ and "WANDB_API_KEY" not in info.environ
        assert info.environ["TORCH_STORE_URL"] == f"https://user:{REDACTED}@example.invalid/x"
        assert "hf_EXAMPLE" not in repr(info)
        assert info.cmdline[0] == sys.executable
        second = collect(src)
        assert not [i for i in second.infos if i.pid == child.pid], "static facts are read once"
    finally:
        child.kill()
        child.wait()


def test_zombie_and_vanishing_processes_are_normal():
    child = spawn("import sys; sys.exit(0)")
    src = ProcSource(extra_pids={child.pid})
    for _ in range(50):  # until it is a zombie (we have not reaped it)
        st = parse_stat(Path(f"/proc/{child.pid}/stat").read_text())
        if st and st["state"] == "Z":
            break
        time.sleep(0.05)
    snap = collect(src)
    z = sample_of(snap, child.pid)
    assert z is not None and z.state == "Z" and z.thread_states == {"Z": 1}
    child.wait()  # reap: it vanishes
    snap = collect(src)
    gone = sample_of(snap, child.pid)
    assert gone is not None and gone.gone
    assert src.read_sample(child.pid) is None  # vanished mid-read: absent, not an error


def test_descendants_and_launcher_are_watched():
    code = ("import subprocess,sys,time,os; "
            "c=subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); time.sleep(60)")
    parent = spawn(code)
    try:
        time.sleep(1.0)
        src = ProcSource(job_env=("NO_SUCH_KEY",), extra_pids={parent.pid})
        snap = collect(src)
        pids = {p.pid for p in snap.procs}
        kids = [int(x) for x in Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()]
        assert parent.pid in pids and set(kids) <= pids
        assert next(p for p in snap.procs if p.pid == parent.pid).role == "child"
        # a GPU holder's parent is its launcher (NVML names GPU holders; here we name the child)
        src2 = ProcSource(job_env=("NO_SUCH_KEY",))
        w = src2.watched(gpu_pids=kids)
        assert parent.pid in w and set(kids) <= w
    finally:
        for k in [int(x) for x in Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()]:
            os.kill(k, signal.SIGKILL)
        parent.kill()
        parent.wait()


def test_output_growth_of_a_process_writing_a_log(tmp_path):
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        child = spawn("import time,sys\nfor i in range(200):\n print('step', i, flush=True); time.sleep(0.05)",
                      stdout=f, stderr=subprocess.STDOUT)
    try:
        src, out = ProcSource(), OutputSource()
        sizes = []
        for _ in range(4):
            snap = collect(src)
            out.collect(snap)
            sizes += [fs.size for fs in snap.files if fs.path == str(log)]
            time.sleep(0.3)
        assert len(sizes) >= 3 and sizes[-1] > sizes[0], sizes
        tails = [fs.tail for fs in snap.files if fs.path == str(log)]
        assert tails and "step" in tails[0]
    finally:
        child.kill()
        child.wait()


def test_a_log_inside_another_root_is_read_there(tmp_path):
    """A process in a container writes /logs/train.log of its own root; the same path on the
    host is another file (or none). What hangd reports is the one the process writes."""
    proc = tmp_path / "proc"
    (proc / "4242" / "root" / "logs").mkdir(parents=True)
    (proc / "4242" / "root" / "logs" / "train.log").write_text("step 7\n")
    out = OutputSource(proc_root=str(proc))
    snap = Snapshot(t=time.time(), infos=[ProcInfo(pid=4242, fds={"1": "/logs/train.log"})],
                    procs=[ProcSample(pid=4242, state="S")])
    out.collect(snap)
    assert [(f.path, f.size, f.tail) for f in snap.files] == [("/logs/train.log", 7, "step 7\n")]
    # and a process that shares hangd's root is read by its path as it is
    assert OutputSource()._resolve(os.getpid(), "/etc/hostname") == "/etc/hostname"


def test_cgroup_names():
    assert describe_cgroup("0::/system.slice/slurmstepd.scope/job_4242/step_0") == "slurm:4242"
    assert describe_cgroup("0::/kubepods/burstable/pod1234abcd-12ab-34cd-56ef-1234567890ab/" + "a" * 64).startswith("k8s-pod:1234abcd")
    assert describe_cgroup("0::/docker/" + "b" * 64) == "container:" + "b" * 12
    assert describe_cgroup("0::/user.slice") == "/user.slice"


def test_one_stat_parser_reads_text_and_bytes_and_a_comm_with_parentheses():
    line = "4242 (python (rank 0)) S 4200 4242 4200 0 -1 4194560 100 0 0 0 1234 56 0 0 20 0 7 0 98765 1 2560 0 0"
    for raw in (line, line.encode()):
        st = parse_stat(raw)
        assert st is not None
        assert (st["comm"], st["state"], st["ppid"], st["utime"], st["stime"], st["threads"], st["starttime_ticks"]) \
            == ("python (rank 0)", "S", 4200, 1234, 56, 7, 98765)
    assert parse_stat(b"4242 (short) S 1") is None


def test_a_process_s_logs_are_the_files_of_fds_1_and_2_not_terminals_or_pipes():
    from hangd.snapshot import ProcInfo

    info = ProcInfo(pid=1, fds={"1": "/job/out.log", "2": "/dev/pts/3"})
    assert info.log_files() == {"/job/out.log"}
    assert ProcInfo(pid=1, fds={"1": "pipe:[1234]", "2": None}).log_files() == set()
    assert ProcInfo(pid=1).log_files() == set()


# How ranks are started before their process group is up: no RANK in the environment, no gloo or
# NCCL threads yet (imports and init take 10-30 s on a busy host). The vLLM/SGLang shape passes the
# rank as an argument; torch.multiprocessing.spawn starts children of a process that loaded torch.
_LAUNCHER_NO_TORCH = """
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import os, time; os.fork() == 0 and time.sleep(60); time.sleep(60)",
                          "--rank", str(r)]) for r in range(2)]
time.sleep(60)
"""
_SPAWN_LAUNCHER = """
import multiprocessing as mp, sys, time
if "torch" in sys.argv:
    import torch  # noqa: F401  (the launcher loaded torch, as torch.multiprocessing.spawn's does)
def rank(r):
    time.sleep(60)
if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=rank, args=(r,)) for r in range(2)]
    [p.start() for p in ps]
    open(sys.argv[1], "w").write(" ".join(str(p.pid) for p in ps))
    time.sleep(60)
"""


def _bare_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "TORCHELASTIC_RUN_ID", "RANK")}


def _kill_tree(p: subprocess.Popen) -> None:
    import psutil

    kids = psutil.Process(p.pid).children(recursive=True)
    for k in kids:
        k.kill()
    p.kill()
    p.wait()


def _roles(src: ProcSource, pids: set[int], until: float = 20.0) -> dict[int, str | None]:
    end = time.time() + until
    while True:
        snap = collect(src)
        roles = {p.pid: (str(p.role) if p.role else None) for p in snap.procs if p.pid in pids and not p.gone}
        if len(roles) == len(pids) or time.time() > end:
            return roles
        time.sleep(0.25)


def test_a_rank_given_as_an_argument_is_a_rank_before_its_threads(tmp_path):
    import psutil

    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER_NO_TORCH], env=_bare_env())
    try:
        src = ProcSource()
        end = time.time() + 20
        while time.time() < end:
            ranks = [c for c in psutil.Process(launcher.pid).children() if "--rank" in c.cmdline()]
            forks = [g for c in ranks for g in c.children()]
            if len(ranks) == 2 and len(forks) == 2:
                break
            time.sleep(0.1)
        roles = _roles(src, {launcher.pid} | {c.pid for c in ranks} | {g.pid for g in forks})
        assert [roles.get(c.pid) for c in ranks] == ["worker", "worker"], roles
        assert roles.get(launcher.pid) == "launcher", roles
        # a fork without exec carries its parent's command line: a child of the rank, not a rank
        assert [roles.get(g.pid) for g in forks] == ["child", "child"], roles
    finally:
        _kill_tree(launcher)


def test_children_spawned_by_a_torch_process_are_ranks_for_a_while(tmp_path, monkeypatch):
    from hangd.sources import procfs

    for with_torch in (True, False):
        out = tmp_path / f"pids-{with_torch}"
        script = tmp_path / "launch.py"
        script.write_text(_SPAWN_LAUNCHER)
        launcher = subprocess.Popen([sys.executable, str(script), str(out)] + (["torch"] if with_torch else []),
                                    env=_bare_env())
        try:
            end = time.time() + 60
            while not out.exists() or not out.read_text().strip():
                assert time.time() < end and launcher.poll() is None, "the launcher never started its children"
                time.sleep(0.2)
            kids = {int(x) for x in out.read_text().split()}
            roles = _roles(ProcSource(), kids, until=3.0 if not with_torch else 20.0)
            if with_torch:
                assert set(roles.values()) == {"worker"}, roles
                # a spawned child (a DataLoader's spawn worker looks the same) is a rank only while young
                monkeypatch.setattr(procfs, "SPAWN_HINT_S", 0.0)
                assert _roles(ProcSource(), kids, until=2.0) == {}
                monkeypatch.undo()
            else:
                assert roles == {}, f"plain multiprocessing children are not ranks: {roles}"
        finally:
            _kill_tree(launcher)


_RANK_ZERO_PARENT = """
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--rank", str(r)]) for r in (1, 2)]
time.sleep(60)
"""


def test_the_parent_of_ranks_1_to_n_is_rank_0():
    import psutil

    launcher = subprocess.Popen([sys.executable, "-c", _RANK_ZERO_PARENT], env=_bare_env())
    try:
        end = time.time() + 20
        while len(kids := psutil.Process(launcher.pid).children()) < 2 and time.time() < end:
            time.sleep(0.1)
        time.sleep(0.5)
        roles = _roles(ProcSource(), {launcher.pid} | {k.pid for k in kids})
        assert set(roles.values()) == {"worker"} and len(roles) == 3, roles
    finally:
        _kill_tree(launcher)


def _write_in_two_parts(path: str, first: bytes, second: bytes):
    """A thread that writes the FIFO ``path`` in two parts 0.2 s apart: a reader's first read gets
    only the first part, as from a kernel that hands a /proc file out a piece at a time."""
    import threading
    import time

    def write() -> None:
        with open(path, "wb", buffering=0) as f:
            f.write(first)
            time.sleep(0.2)
            f.write(second)

    w = threading.Thread(target=write)
    w.start()
    return w


def test_a_file_handed_out_a_page_at_a_time_is_read_whole(tmp_path):
    """Some kernels (a sandboxed GPU host's among them) give /proc/PID/maps out about a page per
    read: a short read is not the end of the file. Seen: 3958 bytes of a CUDA torch rank's 51 KB
    maps, with no libtorch in them, so its spawned ranks went unrecognized until they held GPU
    memory. A FIFO written in two parts stands in for such a file."""
    import os

    from hangd.sources.procparse import _read_bytes

    path = str(tmp_path / "maps")
    os.mkfifo(path)
    first = b"7f00-7f01 r-xp 0 fd:01 1 /usr/lib/libc.so.6\n" * 80  # < a page
    second = b"7f02-7f03 r-xp 0 fd:01 2 /opt/venv/torch/lib/libtorch_cpu.so\n"

    w = _write_in_two_parts(path, first, second)
    got = _read_bytes(path)
    w.join()
    assert got == first + second
    assert b"libtorch" in got


def test_a_small_file_read_in_one_go_is_still_read_whole_when_it_comes_a_page_at_a_time(tmp_path):
    """stat, status and io are read with one read when it returns less than a page; a read of a
    full page is not taken for the whole file, so a kernel that hands even these out a page at a
    time loses nothing."""
    import os

    from hangd.sources.procparse import _read_bytes

    for name in ("stat", "status", "io"):
        assert _read_bytes(f"/proc/self/{name}", small=True).split(b"\n")[0].split()[:1] == \
            _read_bytes(f"/proc/self/{name}").split(b"\n")[0].split()[:1]
    path = str(tmp_path / "status")
    os.mkfifo(path)
    first, second = b"x" * 4096, b"VmRSS:\t  1024 kB\n"

    w = _write_in_two_parts(path, first, second)
    got = _read_bytes(path, small=True)
    w.join()
    assert got == first + second


def test_a_process_started_between_ticks_is_found_at_the_next_and_one_gone_is_said_gone(monkeypatch):
    """/proc is listed again only when a process was created since the last listing (/proc/loadavg's
    last pid moved): whatever starts between two ticks is still watched at the next, and whatever
    exits is reported gone, however the listing is spared."""
    import hangd.sources.procfs as procfs

    listings = []
    real = os.listdir
    monkeypatch.setattr(procfs.os, "listdir",
                        lambda p: listings.append(p) or real(p) if p == "/proc" else real(p))
    src = ProcSource(job_env=("HANGD_TEST_LIST_JOB",))
    collect(src)
    collect(src)  # nothing new in between (on a quiet host): the listing may be spared
    before = len(listings)
    env = dict(os.environ, HANGD_TEST_LIST_JOB="1")
    for gen in range(3):  # several in a row: each found at the first tick after it started
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
        try:
            time.sleep(0.05)
            assert p.pid in src.watched(set()), f"process {gen} started between ticks was not found"
        finally:
            p.kill()
            p.wait()
        snap = collect(src)
        gone = sample_of(snap, p.pid)
        assert gone is not None and gone.gone
        assert p.pid not in src.watched(set())
    assert len(listings) > before  # each new process was found by listing again


def test_the_listing_is_spared_only_while_the_last_pid_stands_still(monkeypatch):
    import hangd.sources.procfs as procfs

    src = ProcSource(job_env=("HANGD_TEST_LIST_JOB",))
    last = [1000]
    monkeypatch.setattr(src, "_last_pid", lambda: last[0])
    now = 50.0
    assert src._list(now) is not None  # the first tick lists
    assert src._list(now + 1) is None  # nothing created since
    last[0] += 1  # a fork (or a thread) anywhere in the namespace
    assert src._list(now + 2) is not None
    assert src._list(now + 2 + procfs.LIST_ALL_EVERY_S) is not None  # and now and then regardless
    monkeypatch.setattr(src, "_last_pid", lambda: None)  # a /proc of another namespace: every tick
    assert src._list(now + 30) is not None and src._list(now + 30) is not None


def test_the_last_pid_is_read_where_proc_shows_its_own_namespace():
    src = ProcSource()
    nspid = [line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("NSpid:")]
    got = src._last_pid()
    if nspid and len(nspid[0].split()) == 2:
        assert isinstance(got, int) and got > 0
    else:  # a nested namespace (or an old kernel): not trusted
        assert got is None
    assert ProcSource(proc_root="/nonexistent")._last_pid() is None
