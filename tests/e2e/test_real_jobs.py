"""hangd the way users run it: one long-running `hangd serve` on the node, and real CPU torch
jobs (gloo) started one after another by real torchrun (`python -m torch.distributed.run
--nproc-per-node 2 --master-port P script.py`, no `--rdzv-id`, so every job's ranks carry
`TORCHELASTIC_RUN_ID=none`), plus a server that starts its workers with multiprocessing. Every
test asserts on what `GET /incidents`, `/jobs` and `/processes` of that one daemon said while the
workload ran; a false alarm fails a test as surely as a missed hang.

The truth of each scenario:

- back-to-back jobs: two healthy 2-rank jobs (~10 s of all_reduce steps with log lines, clean exit)
  are two different jobs, each with ranks 0 and 1, and nothing is wrong with either (a clean exit
  is not `rank_exited`). The third job deadlocks: rank 1 stops calling collectives and waits on an
  Event, rank 0 blocks in all_reduce: one hang incident, rank 1 to blame.
- shared log: the ranks' output goes to the launcher's stdout, a file (`>> nohup.out`) that another
  process, not part of the job, keeps appending to. The job deadlocks; the file's growth is not the
  ranks' progress: the hang incident opens and stays open while the other process writes.
- slow reader: rank 1 reads a file from disk (~100 MB/s, page cache dropped before every pass) for
  ~40 s while rank 0 waits in `dist.barrier()`; then both finish. The job progresses (its I/O):
  no hang incident (a straggler warning is acceptable).
- lone sleeper: one process with a world-size-1 gloo group sleeping 40 s: nothing to report.
- SGLang-like server: a launcher without rank environment spawns 2 workers that get their rank as
  an argument and form a gloo group over tcp://, with no torch.distributed environment at all.
  Idle (rank 0 in `accept()`, rank 1 in `broadcast_object_list`) or busy-polling an empty queue
  (an empty broadcast 20 times a second), it is fine: no incident. Hung at start-up (rank 0 waits
  on an Event after "Load weight end", rank 1 waits for it in `broadcast_object_list`): one hang
  incident naming rank 0, both workers ranks of one job. There is no GPU here, so hangd cannot find
  these workers through NVML.

Each test prints what hangd reported (incidents, job keys, ranks) and how long it took.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from ..conftest import ROOT, WORKLOADS, torch_available
from ..realpg import free_port
from ..served import Served, serve

pytestmark = [pytest.mark.skipif(not torch_available(), reason="torch is a test dependency"), pytest.mark.torchrun]

HANG_KINDS = ("host_stall", "nccl_stall", "io_stall")
# what a torchrun rank's environment holds; the test's own environment must not leak it into jobs
DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
            "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")
# no word boundary before "rank": two ranks writing the shared log at once may run their lines together
# ("rank 0 pid 29046 readyrank 1 pid 29047 ready")
READY = re.compile(r"(?:rank|worker) (\d+) pid (\d+) ready")
DETECT_S = 45.0  # a hang must open its incident within this long (thresholds are 10-12 s)
QUIET_S = 40.0  # how long the benign workloads run under watch
TIMINGS: dict[str, float] = {}


def job_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV and not k.startswith("TORCHELASTIC_")}
    return {**env, "PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1", **extra}


def torchrun(script: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
            str(WORKLOADS / script), *args]


class Launched:
    """A process tree the test started (a launcher and whatever it spawns); every pid it ever had is
    remembered, so an incident on any of them is attributed to this workload."""

    def __init__(self, name: str, argv: list[str], out: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.out = out
        with open(out, "ab") as f:  # appending, like `>> nohup.out`
            self.popen = subprocess.Popen(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=env or job_env(), start_new_session=True)
        self.pids: set[int] = {self.popen.pid}
        self.t0 = time.time()

    def tree(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.popen.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def refresh(self) -> None:
        self.pids |= {c.pid for c in self.tree()}

    def log(self) -> str:
        return self.out.read_text(errors="replace")

    def ranks(self) -> dict[int, int]:
        """rank -> pid, from the ``... pid P ready`` line each rank prints (this job's only)."""
        return {int(r): int(p) for r, p in READY.findall(self.log()) if int(p) in self.pids}

    def wait_log(self, pattern: str, timeout: float, obs: Observer) -> re.Match[str]:
        t_end = time.time() + timeout
        while time.time() < t_end:
            self.refresh()
            if m := re.search(pattern, self.log()):
                return m
            if self.popen.poll() is not None:
                break
            obs.poll()
            time.sleep(0.3)
        raise AssertionError(f"{self.name}: no {pattern!r} in its output (exit {self.popen.poll()}): {self.log()[-3000:]}")

    def wait_ready(self, n: int, obs: Observer, timeout: float = 120) -> dict[int, int]:
        t_end = time.time() + timeout
        while time.time() < t_end:
            self.refresh()
            if len(r := self.ranks()) == n:
                return r
            if self.popen.poll() is not None:
                break
            obs.poll()
            time.sleep(0.3)
        raise AssertionError(f"{self.name}: {n} ranks did not start (exit {self.popen.poll()}): {self.log()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL by pid: the workers first (torchrun would otherwise restart or signal them),
        then the launcher; reap the launcher."""
        procs = self.tree()
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()
        psutil.wait_procs(procs, timeout=10)


@dataclass
class Observer:
    """Polls the daemon's /incidents, /jobs and /processes and keeps everything it saw."""

    served: Served
    incidents: dict[int, dict] = field(default_factory=dict)  # id -> latest summary
    statuses: dict[int, list[tuple[float, str]]] = field(default_factory=dict)  # id -> (t, status) seen
    jobs: list[tuple[float, list[dict]]] = field(default_factory=list)
    procs: list[tuple[float, list[dict]]] = field(default_factory=list)
    watched: list[Launched] = field(default_factory=list)

    def poll(self) -> None:
        t = time.time()
        for lw in self.watched:
            lw.refresh()
        incs = self.served.get("/incidents", params={"limit": 500}).json()["incidents"]
        for inc in incs:
            self.incidents[inc["id"]] = inc
            self.statuses.setdefault(inc["id"], []).append((t, inc["status"]))
        self.jobs.append((t, self.served.get("/jobs").json()))
        self.procs.append((t, self.served.get("/processes").json()))

    def watch(self, seconds: float, until: Callable[[], object] | None = None) -> object:
        t_end = time.time() + seconds
        while time.time() < t_end:
            self.poll()
            if until is not None and (got := until()):
                return got
            if self.served.proc.poll() is not None:
                raise AssertionError(f"hangd serve exited: {self.served.log.read_text()[-3000:]}")
            time.sleep(0.5)
        return None

    def incidents_of(self, pids: set[int], kinds: tuple[str, ...] | None = None) -> list[dict]:
        return sorted((i for i in self.incidents.values() if set(i["pids"]) & pids and (kinds is None or i["kind"] in kinds)),
                      key=lambda i: i["id"])

    def jobs_of(self, pids: set[int], since: float = 0.0) -> list[dict]:
        """Every /jobs entry seen (after ``since``) that holds one of ``pids`` as a rank."""
        return [j for t, js in self.jobs if t >= since for j in js if set(j["ranks"].values()) & pids]

    def procs_of(self, pids: set[int]) -> list[dict]:
        return [p for _, ps in self.procs for p in ps if p["pid"] in pids]

    def detail(self, inc: dict) -> dict:
        return self.served.get(f"/incidents/{inc['id']}").json()

    def settle(self) -> None:
        """Wait for the daemon's own children (py-spy) to finish, so no test leaves one behind."""
        t_end = time.time() + 15
        while time.time() < t_end and psutil.Process(self.served.proc.pid).children(recursive=True):
            time.sleep(0.2)


def brief(incs: list[dict]) -> list[dict]:
    keys = ("id", "kind", "status", "job", "pids", "ranks", "culprit_pids", "culprit_ranks", "summary")
    return [{k: i.get(k) for k in keys} for i in incs]


def explain(obs: Observer, incs: list[dict]) -> dict[int, dict]:
    """Per incident, what hangd said about each rank: its local reading, why, and its stack's top."""
    out: dict[int, dict] = {}
    for inc in incs:
        ev = obs.detail(inc).get("evidence", {})
        out[inc["id"]] = {r: {"local": p.get("local"), "why": str(p.get("why"))[:160],
                              "stack": (ev.get("stacks", {}).get(r) or {}).get("frames", [])[:3]}
                          for r, p in ev.get("processes", {}).items()}
    return out


def job_keys(entries: list[dict]) -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = []
    for e in entries:
        if (e["job"], e["ranks"]) not in out:
            out.append((e["job"], e["ranks"]))
    return out


def report(name: str, **facts: object) -> None:
    print(f"\n== {name}: " + json.dumps(facts, indent=1, default=str))


@pytest.fixture(scope="module")
def obs(tmp_path_factory) -> Iterator[Observer]:
    tmp = tmp_path_factory.mktemp("real-jobs")
    s = serve(tmp, "--interval", "0.5")
    o = Observer(s)
    try:
        yield o
    finally:
        for lw in o.watched:
            lw.kill()
        s.stop()
        print("\nscenario durations (s):", json.dumps(TIMINGS))


@pytest.fixture
def launch(obs: Observer, tmp_path: Path) -> Iterator[Callable[..., Launched]]:
    """Start a workload under watch; everything started is killed when the test ends."""
    mine: list[Launched] = []
    t0 = time.time()

    def start(name: str, argv: list[str], out: Path | None = None, env: dict[str, str] | None = None) -> Launched:
        lw = Launched(name, argv, out or tmp_path / f"{name}.out", env)
        mine.append(lw)
        obs.watched.append(lw)
        return lw

    yield start
    for lw in mine:
        lw.kill()
        obs.watched.remove(lw)
    obs.settle()
    TIMINGS[os.environ.get("PYTEST_CURRENT_TEST", "?").split("::")[-1].split(" ")[0]] = round(time.time() - t0, 1)


def _hang_of(obs: Observer, lw: Launched) -> Callable[[], list[dict]]:
    return lambda: obs.incidents_of(lw.pids, HANG_KINDS)


def test_back_to_back_healthy_jobs_then_a_deadlock(obs: Observer, launch) -> None:
    """Two healthy torchrun jobs in a row, then a deadlock, all with TORCHELASTIC_RUN_ID=none."""
    healthy: list[Launched] = []
    ranks: list[dict[int, int]] = []
    for n in ("healthy-1", "healthy-2"):
        lw = launch(n, torchrun("torchrun_job.py", "train", "--steps", "200", "--step-sleep", "0.05"))
        ranks.append(lw.wait_ready(2, obs))
        obs.watch(120, until=lambda lw=lw: lw.popen.poll() is not None)
        assert lw.popen.returncode == 0, lw.log()[-3000:]
        healthy.append(lw)
    obs.watch(3)  # the daemon sees the second job gone
    dead = launch("deadlock", torchrun("torchrun_job.py", "deadlock", "--steps", "60", "--step-sleep", "0.05"))
    dranks = dead.wait_ready(2, obs)
    comms = _comm_facts(dead)
    stuck_at = float(dead.wait_log(r"culprit: waiting .*\(t=([\d.]+)\)", 60, obs).group(1))
    obs.watch(DETECT_S, until=_hang_of(obs, dead))
    obs.watch(8)  # a second incident for the same hang would show now
    hangs = obs.incidents_of(dead.pids, HANG_KINDS)
    exited_before_kill = obs.incidents_of(set().union(*(lw.pids for lw in (*healthy, dead))), ("rank_exited",))
    dead_jobs = job_keys(obs.jobs_of(set(dranks.values())))
    dead.kill()
    obs.watch(3)

    h_jobs = [job_keys(obs.jobs_of(set(r.values()))) for r in ranks]
    h_procs = [{(p["pid"], p["rank"], p["job"]) for p in obs.procs_of(set(r.values()))} for r in ranks]
    h_incs = [obs.incidents_of(lw.pids) for lw in healthy]
    report("back-to-back", ranks=ranks, comm=comms, healthy_jobs=h_jobs, healthy_processes=[sorted(x) for x in h_procs],
           healthy_incidents=[brief(i) for i in h_incs], deadlock_ranks=dranks, deadlock_jobs=dead_jobs,
           deadlock_incidents=brief(obs.incidents_of(dead.pids)),
           latency_s=[round(i["opened_at"] - stuck_at, 1) for i in hangs], hang_detail=explain(obs, hangs),
           rank_exited=brief(obs.incidents_of(set().union(*(lw.pids for lw in (*healthy, dead))), ("rank_exited",))))

    # each healthy job: its own job, ranks 0 and 1, nothing reported
    for i, r in enumerate(ranks):
        assert h_jobs[i], f"healthy job {i + 1} never showed in /jobs"
        # a tick may catch one rank before the other starts or after it exits: a subset is fine
        want = {"0": r[0], "1": r[1]}
        assert want in [rk for _, rk in h_jobs[i]] and all(rk.items() <= want.items() for _, rk in h_jobs[i]), \
            (f"job {i + 1}'s ranks are not 0 and 1", h_jobs[i])
        rank_of = {pid: rk for rk, pid in r.items()}
        assert all(p["rank"] == rank_of[p["pid"]] for p in obs.procs_of(set(r.values()))), h_procs[i]
    assert not {k for k, _ in h_jobs[0]} & {k for k, _ in h_jobs[1]}, ("the second job has the first job's key", h_jobs)
    assert not h_incs[0] and not h_incs[1], [brief(i) for i in h_incs]
    # the deadlock: one hang incident, rank 1 to blame; nobody "exited"
    assert not exited_before_kill, brief(exited_before_kill)
    assert len(hangs) == 1, brief(obs.incidents_of(dead.pids))
    assert hangs[0]["culprit_ranks"] == [1] and hangs[0]["culprit_pids"] == [dranks[1]], brief(hangs)
    assert set(hangs[0]["pids"]) == set(dranks.values()), brief(hangs)
    assert not {k for k, _ in dead_jobs} & {k for jk in h_jobs for k, _ in jk}, ("the deadlock has a healthy job's key", dead_jobs)


def test_shared_log_growth_is_not_progress(obs: Observer, launch, tmp_path: Path) -> None:
    """The deadlocked job's output file keeps growing from a process that is not part of it."""
    shared = tmp_path / "nohup.out"
    writer = launch("writer", [sys.executable, "-u", "-c",
                               "import itertools, time\n"
                               "for i in itertools.count():\n"
                               "    print(f'{time.strftime(\"%H:%M:%S\")} INFO scheduler heartbeat {i}: queue=0 ok', flush=True)\n"
                               "    time.sleep(0.2)\n"], out=shared)
    job = launch("deadlock-shared-log", torchrun("torchrun_job.py", "deadlock", "--steps", "40"), out=shared)
    ranks = job.wait_ready(2, obs)
    stuck_at = float(job.wait_log(r"culprit: waiting .*\(t=([\d.]+)\)", 60, obs).group(1))
    obs.watch(DETECT_S, until=_hang_of(obs, job))
    opened = time.time()
    size0 = shared.stat().st_size
    obs.watch(20)  # the writer keeps writing: the incident must stay open
    grown = shared.stat().st_size - size0
    assert writer.popen.poll() is None, writer.log()[-500:]
    hangs = obs.incidents_of(job.pids, HANG_KINDS)
    statuses = {i["id"]: sorted({s for t, s in obs.statuses[i["id"]] if t >= opened}) for i in hangs}
    report("shared-log", ranks=ranks, incidents=brief(obs.incidents_of(job.pids | writer.pids)), statuses=statuses,
           jobs=job_keys(obs.jobs_of(set(ranks.values()))), log_growth_bytes_in_20s=grown,
           latency_s=[round(i["opened_at"] - stuck_at, 1) for i in hangs], hang_detail=explain(obs, hangs))
    assert len(hangs) == 1, ("no single hang incident while another process wrote the job's log",
                             brief(obs.incidents_of(job.pids)))
    assert statuses[hangs[0]["id"]] == ["open"], ("the incident did not stay open", statuses, brief(hangs))
    assert hangs[0]["culprit_ranks"] == [1], brief(hangs)
    assert not obs.incidents_of(writer.pids - job.pids), brief(obs.incidents_of(writer.pids))


@pytest.fixture(scope="module")
def big_file(tmp_path_factory) -> Iterator[Path]:
    """320 MB on disk, synced, so that dropping it from the page cache makes every read hit the disk."""
    p = tmp_path_factory.mktemp("data") / "shard.bin"
    block = os.urandom(1 << 20)
    with open(p, "wb") as f:
        for _ in range(320):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    yield p
    p.unlink()


def test_slow_reader_is_not_a_hang(obs: Observer, launch, big_file: Path) -> None:
    """Rank 1 reads from disk for ~40 s while rank 0 waits in a barrier; then both finish."""
    job = launch("slow-reader", torchrun("torchrun_job.py", "slow_reader", "--steps", "40", "--read-file",
                                         str(big_file), "--read-s", "40", "--chunk-mb", "4", "--chunk-sleep", "0.03"))
    ranks = job.wait_ready(2, obs)
    job.wait_log(r"reading .* for", 60, obs)
    obs.watch(120, until=lambda: job.popen.poll() is not None)
    incs = obs.incidents_of(job.pids)
    io_lines = re.findall(r"io (?:before|after) .*", job.log())
    report("slow-reader", ranks=ranks, io=io_lines, incidents=brief(incs), detail=explain(obs, incs), jobs=job_keys(obs.jobs_of(set(ranks.values()))),
           states=sorted({(p["rank"], p["state"]) for p in obs.procs_of(set(ranks.values()))}))
    assert job.popen.returncode == 0, job.log()[-3000:]
    assert len(io_lines) == 2 and "disk read_bytes 0 MB/s" not in io_lines[1], ("the reads did not reach the disk", io_lines)
    assert [i for i in incs if i["kind"] != "straggler"] == [], brief(incs)


def test_lone_sleeping_process(obs: Observer, launch) -> None:
    """One process, a world-size-1 gloo group from the environment, sleeping 40 s."""
    env = job_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    lone = launch("lone", [sys.executable, str(WORKLOADS / "torchrun_job.py"), "lone", "--sleep", str(QUIET_S)], env=env)
    lone.wait_ready(1, obs)
    obs.watch(QUIET_S + 30, until=lambda: lone.popen.poll() is not None)
    incs = obs.incidents_of(lone.pids)
    seen = {(p["state"], p["reason"][:80]) for p in obs.procs_of(lone.pids)}
    report("lone", pid=lone.popen.pid, incidents=brief(incs), states=sorted(seen))
    assert lone.popen.returncode == 0, lone.log()[-2000:]
    assert not incs, brief(incs)
    assert seen, "hangd never watched the process (it has MASTER_ADDR and RANK in its environment)"


def _server(launch, mode: str) -> Launched:
    return launch(f"server-{mode}", [sys.executable, str(WORKLOADS / "server_job.py"), mode, "--port", str(free_port())])


def _server_env_facts(ranks: dict[int, int]) -> dict[int, list[str]]:
    """The torch.distributed keys each worker's /proc/PID/environ holds (must be none)."""
    out = {}
    for r, pid in ranks.items():
        with open(f"/proc/{pid}/environ", "rb") as f:
            keys = {kv.partition(b"=")[0].decode() for kv in f.read().split(b"\0") if kv}
        out[r] = sorted(keys & set(DIST_ENV))
    return out


def _comm_facts(lw: Launched) -> dict[int, str]:
    """/proc/PID/comm and the thread names of every process of a workload (what a finder could use)."""
    out = {}
    for p in [psutil.Process(lw.popen.pid), *lw.tree()]:
        try:
            threads = sorted({Path(t, "comm").read_text().strip() for t in Path(f"/proc/{p.pid}/task").iterdir()})
            out[p.pid] = f"comm={Path(f'/proc/{p.pid}/comm').read_text().strip()} threads={threads} cmdline={' '.join(p.cmdline())[:150]}"
        except (OSError, psutil.Error):
            pass
    return out


def _assert_one_job(obs: Observer, ranks: dict[int, int]) -> None:
    entries = job_keys(obs.jobs_of(set(ranks.values())))
    assert entries, "hangd never showed the server's workers in /jobs"
    assert any(rk == {"0": ranks[0], "1": ranks[1]} for _, rk in entries), ("the workers are not ranks 0 and 1 of one job", entries)


def test_idle_servers_are_not_hangs(obs: Observer, launch) -> None:
    """Two idle servers side by side: one whose rank 0 waits for requests in accept(), one whose
    rank 0 polls an empty queue and broadcasts the empty batch 20 times a second."""
    servers = {mode: _server(launch, mode) for mode in ("idle", "poll")}
    ranks = {mode: srv.wait_ready(2, obs) for mode, srv in servers.items()}
    env_leak = {mode: _server_env_facts(r) for mode, r in ranks.items()}
    comms = {mode: _comm_facts(srv) for mode, srv in servers.items()}
    obs.watch(QUIET_S, until=lambda: any(srv.popen.poll() is not None for srv in servers.values()))
    for srv in servers.values():
        assert srv.popen.poll() is None, srv.log()[-3000:]
    incs = {mode: obs.incidents_of(srv.pids) for mode, srv in servers.items()}
    report("idle servers", ranks=ranks, launchers={m: s.popen.pid for m, s in servers.items()}, dist_env=env_leak,
           comm=comms, incidents={m: brief(i) for m, i in incs.items()},
           jobs={m: job_keys(obs.jobs_of(s.pids)) for m, s in servers.items()},
           states={m: sorted({(p["pid"], p["rank"], p["state"]) for p in obs.procs_of(s.pids)}) for m, s in servers.items()})
    assert env_leak == {m: {0: [], 1: []} for m in servers}, env_leak
    assert incs == {"idle": [], "poll": []}, {m: brief(i) for m, i in incs.items()}
    for r in ranks.values():
        _assert_one_job(obs, r)


def test_server_hung_at_startup_blames_rank_0(obs: Observer, launch) -> None:
    """Rank 0 stops after "Load weight end"; rank 1 waits for it in broadcast_object_list."""
    srv = _server(launch, "hang")
    ranks = srv.wait_ready(2, obs)
    env_leak = _server_env_facts(ranks)
    comms = _comm_facts(srv)
    stuck_at = float(srv.wait_log(r"Load weight end \(t=([\d.]+)\)", 60, obs).group(1))
    obs.watch(DETECT_S, until=_hang_of(obs, srv))
    obs.watch(6)
    hangs = obs.incidents_of(srv.pids, HANG_KINDS)
    report("server-hang", ranks=ranks, launcher=srv.popen.pid, dist_env=env_leak, comm=comms,
           incidents=brief(obs.incidents_of(srv.pids)), jobs=job_keys(obs.jobs_of(srv.pids)),
           latency_s=[round(i["opened_at"] - stuck_at, 1) for i in hangs], hang_detail=explain(obs, hangs))
    assert env_leak == {0: [], 1: []}, env_leak
    assert len(hangs) == 1, brief(obs.incidents_of(srv.pids))
    assert hangs[0]["culprit_ranks"] == [0] and hangs[0]["culprit_pids"] == [ranks[0]], brief(hangs)
    _assert_one_job(obs, ranks)
    assert not [i for i in obs.incidents_of(srv.pids) if i["kind"] not in HANG_KINDS], brief(obs.incidents_of(srv.pids))


def test_compiled_job_with_data_loader_workers(obs: Observer, launch, tmp_path: Path) -> None:
    """Third-party shape: torch.compile (inductor, cold cache: tens of seconds of compiling with no
    collective) and DataLoader workers (children of each rank that inherit its RANK). A healthy
    run is quiet and its ranks are the two ranks, not their workers; the same job then deadlocks
    after compiling: one hang, rank 1 to blame, no worker named."""
    env = job_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))  # cold: compiled as on a first run
    job = launch("compiled", torchrun("compiled_job.py", "train", "--steps", "120"), env=env)
    ranks = job.wait_ready(2, obs)
    obs.watch(300, until=lambda: job.popen.poll() is not None)
    healthy_incs = obs.incidents_of(job.pids)
    workers = job.pids - set(ranks.values()) - {job.popen.pid}
    seen = obs.procs_of(job.pids)
    entries = job_keys(obs.jobs_of(set(ranks.values())))
    compiled_at = re.search(r"\[rank0\] compiled", job.log())

    dead = launch("compiled-deadlock", torchrun("compiled_job.py", "deadlock", "--steps", "40"), env=env)
    dranks = dead.wait_ready(2, obs)
    dead.wait_log(r"waiting for an event nobody sets", 300, obs)
    stuck_at = time.time()
    dworkers = dead.pids - set(dranks.values()) - {dead.popen.pid}
    obs.watch(DETECT_S, until=_hang_of(obs, dead))
    obs.watch(5)
    hangs = obs.incidents_of(dead.pids, HANG_KINDS)
    report("compiled", ranks=ranks, workers=sorted(workers), healthy_incidents=brief(healthy_incs), jobs=entries,
           states=sorted({(p["pid"], p["rank"], p["state"]) for p in seen}), deadlock_ranks=dranks,
           deadlock_workers=sorted(dworkers), deadlock_incidents=brief(obs.incidents_of(dead.pids)),
           latency_s=[round(i["opened_at"] - stuck_at, 1) for i in hangs], hang_detail=explain(obs, hangs))

    assert job.popen.returncode == 0 and compiled_at, job.log()[-3000:]
    assert len(workers) >= 4, ("no DataLoader workers were seen", sorted(job.pids), ranks)
    assert not healthy_incs, brief(healthy_incs)
    assert entries and all(rk.items() <= {"0": ranks[0], "1": ranks[1]}.items() for _, rk in entries), entries
    assert all(p["rank"] is None for p in obs.procs_of(workers)), [p for p in obs.procs_of(workers) if p["rank"] is not None]
    assert len(hangs) == 1, brief(obs.incidents_of(dead.pids))
    assert hangs[0]["culprit_ranks"] == [1] and hangs[0]["culprit_pids"] == [dranks[1]], brief(hangs)
    assert not set(hangs[0]["pids"]) & dworkers, brief(hangs)
