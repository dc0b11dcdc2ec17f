"""Small hand-made snapshots for the analysis' unit tests: processes, GPUs, logs, stacks.

The NVML side is injected as recorded-shaped readings (the only boundary mocked anywhere); the
numbers follow what the H200 traces show for each phase."""

from __future__ import annotations

from dataclasses import dataclass, field

from hangd.analysis.engine import Analyzer
from hangd.snapshot import (
    FdWait,
    FileSample,
    Frame,
    GpuProc,
    GpuSample,
    ProcInfo,
    ProcSample,
    Role,
    Snapshot,
    StackSample,
    ThreadStack,
)

GiB = 1 << 30
IDLE = {"SM_UTIL": 0.0, "ANY_TENSOR_UTIL": 0.0, "DRAM_BW_UTIL": 0.0, "NVLINK_TOTAL_TX_PER_SEC": 0.0}
SPIN = {"SM_UTIL": 18.0, "ANY_TENSOR_UTIL": 0.0, "DRAM_BW_UTIL": 0.0, "NVLINK_TOTAL_TX_PER_SEC": 0.0}
WORK = {"SM_UTIL": 85.0, "ANY_TENSOR_UTIL": 80.0, "DRAM_BW_UTIL": 17.0, "NVLINK_TOTAL_TX_PER_SEC": 17000.0}
DECODE = {"SM_UTIL": 5.0, "ANY_TENSOR_UTIL": 0.1, "DRAM_BW_UTIL": 2.2, "NVLINK_TOTAL_TX_PER_SEC": 80.0}
# one GPU time-sliced among eight ranks (one H100, NCCL over sockets): replaying CUDA graphs of Linear
# layers with an all-reduce in each, and every rank spinning in a collective that never completes
REPLAY_SHARED = {"SM_UTIL": 1.7, "ANY_TENSOR_UTIL": 0.1, "DRAM_BW_UTIL": 0.25, "FP32_UTIL": 0.01,
                 "NVLINK_TOTAL_TX_PER_SEC": 0.0}
SPIN_SHARED = {"SM_UTIL": 1.5, "ANY_TENSOR_UTIL": 0.016, "DRAM_BW_UTIL": 0.1, "FP32_UTIL": 0.002,
               "NVLINK_TOTAL_TX_PER_SEC": 0.0}
GPU_LOOK = {"idle": (0, 124_000, IDLE), "spin": (100, 124_000, SPIN), "work": (99, 470_000, WORK),
            "decode": (60, 165_000, DECODE), "replay_shared": (100, 124_500, REPLAY_SHARED),
            "spin_shared": (100, 124_200, SPIN_SHARED)}


@dataclass
class P:
    """One process: its static facts and what it does now."""

    pid: int
    ppid: int
    env: dict[str, str] = field(default_factory=dict)
    cmdline: list[str] = field(default_factory=lambda: ["python", "train.py"])
    comm: str = "python"
    gpu: int | None = None  # the GPU it holds memory on
    gpu_mem: int = 20 * GiB
    look: str = "idle"  # a key of GPU_LOOK (of its GPU)
    state: str = "S"
    wchan: str = "futex_do_wait"
    cpu_ticks_per_s: int = 0  # utime growth
    read_per_s: int = 0
    wchar_per_s: int = 0
    file_write_per_s: int = 0  # of wchar_per_s, bytes into files: write_bytes (the disk's) moves as much
    sock_per_s: int = 0  # bytes through read calls on sockets: rchar alone moves (read_bytes is the disk's)
    vol_per_s: int = 0
    threads: int = 12
    log: str | None = None  # its fd 1/2 target
    dist_threads: list[str] | None = None
    start: float = 0.0
    role: str | None = None  # what the /proc source called it (worker, launcher, child)
    wait_syscall: str | None = None  # the call its main thread sleeps in, and on which descriptors
    fd_waits: list[FdWait] | None = None


class Node:
    """A node fed to an Analyzer one tick at a time (4 Hz like the recorded traces)."""

    def __init__(self, procs: list[P], hz: float = 4.0, analyzer: Analyzer | None = None) -> None:
        self.procs = {p.pid: p for p in procs}
        self.an = analyzer or Analyzer()
        self.hz = hz
        self.t = 1000.0
        self.counters: dict[int, dict[str, float]] = {}
        self.sent_info: set[int] = set()
        self.logs: dict[str, int] = {}
        self._tails: dict[str, str] = {}
        self.pending_stacks: list[StackSample] = []
        self.gone: set[int] = set()
        self.changes: list = []
        # ranks other nodes report (a shared store): given the tick's time, the snapshot's remote part
        self.remote = None
        # flight-recorder dumps other nodes wrote (a shared store): given the tick's time, a list
        self.remote_dumps = None
        self.pending_fr: list = []  # this node's flight-recorder dumps (FrDump) for the next tick
        self.name: str | None = None  # the node's name among nodes sharing a store
        # processes NVML does not list (another container's): GPU index -> (bytes held, look)
        self.hidden: dict[int, tuple[int, str]] = {}
        # NVML's per-process samples: pid -> SM % (none given when empty, as on most hosts)
        self.sm: dict[int, int] = {}

    def write_log(self, path: str, text: str) -> None:
        self.logs[path] = self.logs.get(path, 0) + len(text)
        self._tails[path] = (self._tails.get(path, "") + text)[-4096:]

    def stack(self, pid: int, frames: list[tuple[str, str]] | list[tuple[str, str, int]],
              threads: list[str] | None = None) -> None:
        """The main thread's frames, innermost first: (file, function) at line 1, or (file, function, line)."""
        ths = [ThreadStack(tid=pid, name="MainThread", active=False, owns_gil=False,
                           frames=[Frame(name=f[1], filename=f[0], line=f[2] if len(f) > 2 else 1) for f in frames])]
        for i, name in enumerate(threads or []):
            ths.append(ThreadStack(tid=pid + 1 + i, name=name, active=False, owns_gil=False,
                                   frames=[Frame(name="wait", filename="threading.py", line=1)]))
        self.pending_stacks.append(StackSample(pid=pid, threads=ths))

    def kill(self, pid: int) -> None:
        self.gone.add(pid)

    def tick(self) -> None:
        dt = 1.0 / self.hz
        self.t += dt
        snap = Snapshot(t=self.t)
        by_gpu: dict[int, list[P]] = {}
        for p in self.procs.values():
            if p.gpu is not None and p.pid not in self.gone:
                by_gpu.setdefault(p.gpu, []).append(p)
        for idx in sorted({p.gpu for p in self.procs.values() if p.gpu is not None} | {0}):
            holders = by_gpu.get(idx, [])
            hidden_mem, hidden_look = self.hidden.get(idx, (0, "idle"))
            looks = [GPU_LOOK[h.look] for h in holders] + [GPU_LOOK[hidden_look]]
            util, power, gpm = max(looks, key=lambda x: (x[1], x[0]))
            snap.gpus.append(GpuSample(index=idx, util_gpu=util, util_mem=0,
                                       mem_used=sum(h.gpu_mem for h in holders) + hidden_mem,
                                       mem_total=141 * GiB, power_mw=power, gpm=dict(gpm),
                                       procs=[GpuProc(pid=h.pid, used=h.gpu_mem) for h in holders],
                                       proc_util=[{"pid": h.pid, "sm": self.sm[h.pid], "mem": 0, "ts": 0}
                                                  for h in holders if h.pid in self.sm] or None))
        for p in self.procs.values():
            if p.pid in self.gone:
                snap.procs.append(ProcSample(pid=p.pid, gone=True))
                continue
            c = self.counters.setdefault(p.pid, {"ticks": 0.0, "read": 0.0, "wchar": 0.0, "vol": 0.0, "sock": 0.0,
                                                  "disk_w": 0.0})
            c["ticks"] += p.cpu_ticks_per_s * dt
            c["read"] += p.read_per_s * dt
            c["sock"] += p.sock_per_s * dt
            c["wchar"] += p.wchar_per_s * dt
            c["disk_w"] += p.file_write_per_s * dt
            c["vol"] += p.vol_per_s * dt
            snap.procs.append(ProcSample(pid=p.pid, ppid=p.ppid, comm=p.comm, state=p.state, utime=int(c["ticks"]), stime=0,
                                         threads=p.threads, wchan=p.wchan, rss_bytes=2 * GiB,
                                         io={"read_bytes": int(c["read"]), "write_bytes": int(c["disk_w"]),
                                             "rchar": int(c["read"] + c["sock"]),
                                             "wchar": int(c["wchar"])},
                                         voluntary_ctxt_switches=int(c["vol"]), nonvoluntary_ctxt_switches=0,
                                         start_time=p.start or 999.0, dist_threads=p.dist_threads,
                                         role=Role(p.role) if p.role else None,
                                         wait_syscall=p.wait_syscall, fd_waits=p.fd_waits))
            if p.pid not in self.sent_info:
                self.sent_info.add(p.pid)
                snap.infos.append(ProcInfo(pid=p.pid, ppid=p.ppid, cmdline=p.cmdline, environ=dict(p.env),
                                           fds={"1": p.log, "2": p.log} if p.log else {}, start_time=p.start or 999.0))
        for path, size in self.logs.items():
            snap.files.append(FileSample(path=path, size=size, tail=self._tails.get(path)))
        snap.stacks, self.pending_stacks = self.pending_stacks, []
        snap.fr_dumps, self.pending_fr = self.pending_fr, []
        if self.remote is not None:
            snap.remote = self.remote(self.t)
            snap.node = self.name
        if self.remote_dumps is not None:
            snap.remote_dumps = self.remote_dumps(self.t)
        self.changes.extend(self.an.step(snap))
        self.an.take_requests()

    def run(self, seconds: float) -> None:
        for _ in range(int(seconds * self.hz)):
            self.tick()

    def state(self, pid: int) -> str | None:
        return next((p["state"] for p in self.an.processes() if p["pid"] == pid), None)

    def kinds(self) -> list[str]:
        return [str(i.kind) for i in self.an.incidents()]

    def jobs(self) -> list[dict]:
        return self.an.jobs()


def torchrun_env(rank: int, world: int, port: int = 29500, run_id: str = "none", **extra: str) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0", **extra}


ON_CPU = dict(state="R", wchan="0", cpu_ticks_per_s=95)


def logged_cpu_pair(rank1_parent: int = 10, run_id: str = "none", extra: tuple[P, ...] = (),
                    seconds: int = 15) -> tuple[Node, P, P]:
    """A two-rank gloo job on the CPU (pids 11 and 12, its launcher 10), each rank on a core and
    writing a line of its log each second for ``seconds``; rank 1's parent is ``rank1_parent`` (11:
    rank 0 started it). Each rank's log bytes are its own (``wchar_per_s``): set them to 0 to stop."""
    r0 = P(11, 10, torchrun_env(0, 2, run_id=run_id), dist_threads=["gloo"], log="/job/log0", wchar_per_s=80,
           **ON_CPU)  # type: ignore[arg-type]
    r1 = P(12, rank1_parent, torchrun_env(1, 2, run_id=run_id), dist_threads=["gloo"], log="/job/log1",
           wchar_per_s=80, **ON_CPU)  # type: ignore[arg-type]
    node = Node([P(10, 1), r0, r1, *extra])
    for _ in range(seconds):
        node.write_log("/job/log0", "step\n")
        node.write_log("/job/log1", "step\n")
        node.run(1)
    return node, r0, r1


def churn(node: Node, jobs: int, rank_env=None, with_logs: bool = False) -> None:
    """``jobs`` 2-rank jobs one after another, each working on the GPUs for 2 s, then gone
    (launcher and ranks), then 15 s of nothing: what a node starting jobs all day sees.
    ``rank_env(rank, port)`` gives a rank's environment (torchrun's by default); with
    ``with_logs`` each rank writes a ``[rankN]:``-prefixed line to a log of its own."""
    pid = 1000
    for _ in range(jobs):
        launcher, ranks = pid, [pid + 1, pid + 2]
        node.procs[launcher] = P(launcher, 1)
        for i, r in enumerate(ranks):
            log = f"/jobs/{pid}/rank{i}.log" if with_logs else None
            env = rank_env(i, pid) if rank_env else torchrun_env(i, 2, port=pid)
            node.procs[r] = P(r, launcher, env, look="work", gpu=i, log=log)
            if log:
                node.write_log(log, f"[rank{i}]: step 1\n")
        node.run(2)
        for p in (launcher, *ranks):
            node.kill(p)
        node.run(1)
        node.logs.clear()  # as the output source does: a gone process's log is no longer read
        pid += 10
    node.run(15)
