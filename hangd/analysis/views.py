"""What the engine remembers per process and per job between ticks, and the per-tick view of a job
that the detectors decide on."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hangd.analysis import otherend, stackcat
from hangd.analysis.identity import Job
from hangd.analysis.model import Local, Reading, State, Strength
from hangd.analysis.signals import ProcSignals
from hangd.analysis.thresholds import Thresholds
from hangd.snapshot import RemoteRank


@dataclass
class ProcTrack:
    state: State | None = None
    since: float = 0.0
    reason: str = ""
    pending: State | None = None
    pending_since: float = 0.0
    started: bool = False
    quiet_since: float | None = None  # asleep (for starting -> idle) since
    working_since: float | None = None  # on CPU, reading or writing (for starting -> working) since
    gpu_mem_mark: tuple[float, int] | None = None  # its GPU memory, and since when it has held about that
    pg_up_mem: int | None = None  # its GPU memory when its process group's threads were first seen ...
    pg_mem_grew: bool = False  # ... and whether it grew since (a communicator, its model)
    verdict: stackcat.Verdict = stackcat.UNKNOWN
    verdict_t: float | None = None
    # the states decided since the reported one was last decided (flicker between others: see _set_state)
    away: deque[tuple[float, State, str]] = field(default_factory=lambda: deque(maxlen=40))
    cpu_stack_asked: float | None = None  # when a stack was last asked for because it worked on the CPU unexplained
    cpu_stacks_unnamed: int = 0  # ... asked again since after stacks that named nothing (they back off)
    verdict_wchan: str | None = None  # where the kernel had it blocked when the stack was taken
    stack_sig: tuple[str, ...] = ()
    stack_sig_t: float | None = None
    # a capture of a server's loop between two of its waits for requests, kept as that wait, and
    # how many times in a row it was caught at exactly that place
    between_sig: tuple[str, ...] = ()
    between_n: int = 0
    # its evidence record at its last judgment: per source "yes: what moved", "no" or "unknown"
    moved: dict[str, str] = field(default_factory=dict)
    compiled_at: float | None = None  # when a stack last showed it compiling
    threads_seen: dict[str, float] = field(default_factory=dict)  # thread name/tid -> last capture with it
    reading: Reading = Reading(Local.QUIET, "")
    other_end: otherend.OtherEnd | None = None  # what its descriptors say of its wait, at the last tick
    rule: str = ""  # the decision-table row that decided its state at the last tick
    # the state its reading of bytes moving (loading, writing: judged over the I/O window already)
    # has mapped to, and since when: a rank leaving "starting" on them has shown what it does for
    # that long (see Analyzer._set_state)
    read_as: tuple[State | None, float] = (None, 0.0)
    # the states it was shown in, newest last: (since, state, reason, the local reading it came on);
    # a first wait keeps the one it had when it last progressed (gather.shown_at_progress)
    shown: deque[tuple[float, State, str, Local]] = field(default_factory=lambda: deque(maxlen=8))
    job: str | None = None
    rank: int | None = None


@dataclass
class Culprit:
    pids: list[int]
    strength: Strength
    source: str
    remote: list[RemoteRank] = field(default_factory=list)  # ranks on other nodes, as their node reports them
    # what the evidence is, where the summary says it its own way: "diverged" (every rank waits, at
    # different call sites: a likely culprit, or none), "ras" (NCCL RAS counts it behind)
    basis: str = ""


@dataclass
class JobTrack:
    hung: bool = False
    hung_at: float | None = None
    stacks_asked: list[float] = field(default_factory=list)
    native_asked: bool = False
    fr_asked: float | None = None
    fr_probed: float | None = None  # dumps last asked for whether its collectives still complete
    stopped_at: dict[int, float] = field(default_factory=dict)  # pid -> its last progress when the job was judged hung
    fr_hang_asked: bool = False  # the dumps of this hang were asked for (asks.ask_for_evidence)
    busy_stack_at: float | None = None  # when a busy rank's stack was last asked for (asks.busy_phase_stacks)
    busy_stack_turn: int = 0  # whose turn it was
    episode: frozenset[int] | None = None
    episode_start: float = 0.0
    episodes: deque[tuple[float, frozenset[int]]] = field(default_factory=lambda: deque(maxlen=64))
    blame: deque[tuple[int, frozenset[int], frozenset[int]]] = field(default_factory=deque)  # (second, waited for, waiters)
    exited: dict[int, float] = field(default_factory=dict)
    exits_reported: set[int] = field(default_factory=set)
    fr: dict[int, tuple[float, Any]] = field(default_factory=dict)  # rank -> (t, Dump)
    fr_pids: dict[int, int] = field(default_factory=dict)  # rank -> pid of the process that dumped
    # (kind, pg, seq, the nodes a node_silent finding names): a finding is attached once
    fr_keys: set[tuple[str, str | None, int | None, tuple[str, ...]]] = field(default_factory=set)
    findings: list[Any] = field(default_factory=list)  # flightrec Findings
    # (kind, pg, seq) of a finding -> when dumps last showed it: a finding of dumps taken before the
    # job last progressed (collectives in flight as a healthy job dumped) is no evidence of its hang
    finding_at: dict[tuple[Any, ...], float] = field(default_factory=dict)
    culprit: Culprit | None = None
    # NCCL RAS's newest word on the job's communicators: (time, pids of the ranks behind, in words)
    ras: tuple[float, list[int], str] | None = None
    # ranks seen waiting in the collective since the job was judged hung: one that drops out of the
    # wait for a tick (stopped a moment for a stack capture) is still a waiter, not a suspect
    waiters: set[int] = field(default_factory=set)
    last_seen: float = 0.0


@dataclass
class JobView:
    """One job at one tick: everything a detector decides on."""

    job: Job
    track: JobTrack
    t: float
    live: list[int]
    sigs: dict[int, ProcSignals]
    readings: dict[int, Reading]
    quiet: float  # seconds since any rank progressed
    last_progress: float
    last_strong: float | None
    # a job that spans nodes: its ranks on other nodes, as those nodes' hangd last reported them
    remote: list[RemoteRank] = field(default_factory=list)
    node_stale_s: float = Thresholds.node_stale_s
    # the job is an idle server at this tick, and why (``gather.idle_server``): one fact, read by
    # the ranks' states and by the hang detector alike
    idle: tuple[bool, str] = (False, "")

    def remote_stale(self, r: RemoteRank) -> bool:
        """Its node's hangd stopped reporting: what it said last is not evidence any more."""
        return r.reported_at < self.t - self.node_stale_s

    @property
    def remote_fresh(self) -> list[RemoteRank]:
        return [r for r in self.remote if not self.remote_stale(r) and r.state != "gone"]

    def with_local(self, *kinds: Local) -> set[int]:
        return {p for p in self.live if self.readings[p].local in kinds}

    @property
    def spinning(self) -> set[int]:
        return self.with_local(Local.SPINNING)

    @property
    def waiting(self) -> set[int]:
        """Ranks blocked in a collective (on the GPU or host-side): they wait for a peer."""
        return self.with_local(Local.SPINNING, Local.WAITING)

    @property
    def stopped(self) -> set[int]:
        return self.with_local(Local.STOPPED)

    @property
    def serving(self) -> set[int]:
        return self.with_local(Local.SERVING)

    def by_rank(self, pids: set[int] | list[int]) -> list[int]:
        return sorted(pids, key=lambda p: (self.job.ranks.get(p, 1 << 30), p))
