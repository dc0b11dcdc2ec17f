"""Plain typed records of one moment of a node.

A snapshot is what the sources saw at time ``t``: GPU readings, process readings, files, stacks,
flight-recorder dumps. Every source (live or replayed) produces these and nothing else; analysis
consumes only these. Values that could not be read are ``None``, never a made-up zero.

The records convert losslessly to and from the events of the ``hangd-trace/1`` format
(see ``tests/data/traces/FORMAT.md``), which is how ``hangd record`` and ``hangd replay`` agree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

# Linux's USER_HZ on every architecture hangd runs on; what a trace recorded before ProcSample carried
# its ``clk_tck`` was read with.
DEFAULT_CLK_TCK = 100

GPM_KEYS = (
    "SM_UTIL",
    "SM_OCCUPANCY",
    "ANY_TENSOR_UTIL",
    "DRAM_BW_UTIL",
    "FP32_UTIL",
    "FP16_UTIL",
    "PCIE_TX_PER_SEC",
    "PCIE_RX_PER_SEC",
    "NVLINK_TOTAL_TX_PER_SEC",
    "NVLINK_TOTAL_RX_PER_SEC",
)


@dataclass(slots=True)
class GpuProc:
    pid: int
    used: int | None  # bytes of GPU memory; None when NVML does not say


@dataclass(slots=True)
class GpuSample:
    """One NVML reading of one GPU. Percentages 0-100, memory in bytes, power in mW."""

    index: int
    util_gpu: int | None = None
    util_mem: int | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    power_mw: int | None = None
    sm_clock: int | None = None
    temp_c: int | None = None
    energy_mj: int | None = None
    pcie_tx_kbs: int | None = None
    pcie_rx_kbs: int | None = None
    clock_event_reasons: int | None = None
    procs: list[GpuProc] = field(default_factory=list)
    proc_util: list[dict[str, Any]] | None = None
    # GPM metrics (Hopper and later): % for utilizations, MB/s for PCIe and NVLink rates.
    gpm: dict[str, float] | None = None
    uuid: str | None = None
    name: str | None = None
    # XID errors NVML reported for this GPU since the last reading: {"xid": code, "t": Unix seconds}
    xid: list[dict[str, Any]] | None = None
    # clock_event_reasons decoded: names of hangd/analysis/hardware.toml's [clock_event] (None: unread)
    clock_events: list[str] | None = None
    # read at a low rate and carried between reads; None when the GPU cannot say
    ecc_uncorrected: int | None = None  # volatile ECC error counts (since the driver loaded)
    ecc_corrected: int | None = None
    remap_pending: bool | None = None  # a row remapping waits for a GPU reset
    remap_failure: bool | None = None  # a row remapping failed: the memory is bad
    nvlink_errors: dict[str, int] | None = None  # summed over its links: replay, recovery, crc_flit, crc_data

    @property
    def power_w(self) -> float | None:
        """Power draw in watts; None when NVML did not say."""
        return self.power_mw / 1000 if self.power_mw is not None else None


class Role(StrEnum):
    """What a watched process is to its job, as /proc shows it (``StrEnum``: traces keep their strings)."""

    WORKER = "worker"  # a rank: its own GPU memory, torch.distributed threads, or a job environment
    LAUNCHER = "launcher"  # the parent of ranks (torchrun, a launcher script)
    CHILD = "child"  # inherits a rank's environment but is no rank: data loaders, compile workers


@dataclass(slots=True)
class FdWait:
    """One file descriptor a process's main thread is blocked on, and who holds its other end
    (hangd/sources/fdwait.py). ``fd`` -1 with ``kind`` "child" is a wait for a child process."""

    fd: int
    kind: str  # pipe, unix, tcp, socket (neither), eventfd and other anon inodes, file, child, unknown
    listening: bool = False  # a socket that accepts connections: input from outside the job
    holders: list[int] = field(default_factory=list)  # watched pids holding the other end (a pipe: itself too)
    holders_listen: list[int] = field(default_factory=list)  # those of them (not itself) that listen on a socket
    local: str | None = None  # tcp: "10.0.0.1:29500"
    remote: str | None = None
    remote_here: bool = False  # the other end is a socket of this host (a pipe's always is)
    writes_itself: bool = False  # a pipe: it holds the write end too (a thread of its own may write it)


@dataclass(slots=True)
class ProcSample:
    """One /proc reading of one process. utime/stime in clock ticks, ``clk_tck`` of them a second."""

    pid: int
    ppid: int | None = None
    comm: str | None = None
    state: str | None = None
    utime: int | None = None
    stime: int | None = None
    threads: int | None = None
    thread_states: dict[str, int] | None = None
    io: dict[str, int] | None = None
    voluntary_ctxt_switches: int | None = None
    nonvoluntary_ctxt_switches: int | None = None
    wchan: str | None = None
    rss_bytes: int | None = None
    swap_bytes: int | None = None
    role: str | None = None  # a Role
    gone: bool = False
    start_time: float | None = None  # Unix seconds; None when unknown
    # names of torch.distributed threads it runs (gloo, NCCL): a rank even without a GPU or a RANK
    dist_threads: list[str] | None = None
    clk_tck: int | None = None  # the host's SC_CLK_TCK; None: DEFAULT_CLK_TCK (older traces)
    # the system call its main thread sleeps in ("poll", "read", "futex"; None: unread or not asleep)
    # and the descriptors it waits on there ([]: none, as in a futex; None: unknown)
    wait_syscall: str | None = None
    fd_waits: list[FdWait] | None = None

    def cpu_seconds_between(self, earlier: ProcSample) -> float | None:
        """CPU time (user + system, seconds) used since ``earlier``; None when a count is missing."""
        if self.utime is None or self.stime is None or earlier.utime is None or earlier.stime is None:
            return None
        return ((self.utime + self.stime) - (earlier.utime + earlier.stime)) / float(self.clk_tck or DEFAULT_CLK_TCK)


@dataclass(slots=True)
class ProcInfo:
    """The static facts of a process, read once. ``environ`` holds only the keys hangd needs,
    with secret-looking values already redacted."""

    pid: int
    ppid: int | None = None
    exe: str | None = None
    cmdline: list[str] | None = None
    cwd: str | None = None
    environ: dict[str, str] | None = None
    fds: dict[str, str | None] | None = None
    cgroup: str | None = None
    start_time: float | None = None
    # who runs it: the real uid (/proc/PID/status) and its user name where this host's user
    # database has one (None: unknown, as in a trace recorded before these were read)
    uid: int | None = None
    user: str | None = None
    # the Kubernetes pod its cgroup places it in: ``uid``, ``container_id``, ``qos`` from the cgroup
    # path; ``name``, ``namespace``, ``container`` and ``name_from`` where the node could resolve
    # them, else ``unresolved`` (why not, in words)
    pod: dict[str, str] | None = None

    def log_files(self) -> set[str]:
        """The files it writes stdout and stderr to (fds 1 and 2): absolute paths, not a terminal
        or another device (``/dev/...``), not a pipe or socket (``pipe:[...]``). Its logs."""
        return {t for t in (self.fds or {}).values() if t and t.startswith("/") and not t.startswith("/dev/")}


@dataclass(slots=True)
class FileSample:
    """Size of a file a watched process writes (its log), and its newest bytes when known."""

    path: str
    size: int | None
    tail: str | None = None


@dataclass(slots=True)
class Frame:
    name: str
    filename: str
    line: int | None = None
    native: bool = False
    library: bool = False  # its full path is in the stdlib or site-packages (the short name hides it)


@dataclass(slots=True)
class ThreadStack:
    tid: int | None
    name: str | None
    active: bool | None
    owns_gil: bool | None
    frames: list[Frame]  # innermost first


@dataclass(slots=True)
class StackSample:
    """A stack dump of one process taken at ``t``; ``seconds`` is how long the dump took."""

    pid: int
    tool: str = "py-spy"
    native: bool = False
    format: str = "py-spy-json"
    seconds: float | None = None
    raw: str = ""
    threads: list[ThreadStack] = field(default_factory=list)
    error: str | None = None


@dataclass(slots=True)
class FrDump:
    """A PyTorch flight-recorder dump that appeared at ``t`` (bytes as read, capped)."""

    pid: int | None
    rank: int | None
    format: str
    path: str
    data: bytes | None = None
    source: str = "file"
    # decoded where it arrives (hangd.evidence.decode_evidence): a flightrec Dump, or why not
    dump: Any = None
    error: str | None = None


@dataclass(slots=True)
class RasReport:
    format: str
    text: str
    status: Any = None  # hangd.evidence.RasStatus, parsed where it arrives
    error: str | None = None


@dataclass(slots=True)
class RemoteRank:
    """A rank of a job that spans nodes, as the hangd of the node it runs on last reported it to
    the shared store. The daemon reads these rows and hands them in with the snapshot; analysis
    never reads the store. Times are Unix seconds of that node's clock."""

    job: str
    node: str
    rank: int | None
    pid: int
    state: str | None
    reason: str | None
    waits: bool | None  # blocked in a collective, waiting for a peer (that node's judgement)
    last_progress: float | None
    reported_at: float  # that node's hangd's last heartbeat
    reading: str | None = None  # what the rank does on its own, in words, as that node judged it
    local: str | None = None  # what it does on its own (a Local: "serving", "waiting", "quiet", ...)


@dataclass(slots=True)
class RemoteDump:
    """A rank's newest flight-recorder dump, of a job that spans nodes, as the hangd of the node it
    runs on read it and wrote it to the shared store: its process groups' status and its newest
    entries per group (no frames). Handed in with the snapshot like ``RemoteRank``; times are Unix
    seconds of that node's clock."""

    job: str
    node: str
    rank: int
    read_at: float  # when that node read the dump
    reported_at: float  # that node's hangd's last heartbeat
    dump: Any  # a hangd.flightrec.reader.Dump rebuilt from the rows


@dataclass(slots=True)
class Action:
    what: str
    pid: int | None = None


@dataclass(slots=True)
class Snapshot:
    """Everything the sources saw at one moment ``t`` (Unix seconds)."""

    t: float
    gpus: list[GpuSample] = field(default_factory=list)
    procs: list[ProcSample] = field(default_factory=list)
    infos: list[ProcInfo] = field(default_factory=list)
    files: list[FileSample] = field(default_factory=list)
    stacks: list[StackSample] = field(default_factory=list)
    fr_dumps: list[FrDump] = field(default_factory=list)
    ras: list[RasReport] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    # source name -> "unavailable: <why>" for sources that could not read this time
    unavailable: dict[str, str] = field(default_factory=dict)
    # the ranks other nodes report for the jobs that span nodes (from a shared store); None when
    # there is no shared store, or it could not be read this time
    remote: list[RemoteRank] | None = None
    # the flight-recorder dumps other nodes wrote of those jobs' ranks; None likewise (a replay
    # gives the ones the trace's newest remote_dumps event named, from that event on)
    remote_dumps: list[RemoteDump] | None = None
    node: str | None = None  # this node's name among the nodes sharing a store (None: alone)

    def is_empty(self) -> bool:
        return not (
            self.gpus or self.procs or self.infos or self.files or self.stacks
            or self.fr_dumps or self.ras or self.actions
        )


def record_to_dict(rec: Any) -> dict[str, Any]:
    """A record as plain JSON-able data, dropping fields that are unset."""
    d = asdict(rec)
    return {k: v for k, v in d.items() if v is not None and v != [] and v is not False}
