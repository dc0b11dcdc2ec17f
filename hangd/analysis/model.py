"""The analysis' vocabulary: process states, local readings and state changes.

One name per concept, used everywhere (code, API, metrics labels, dashboards, docs). ``StrEnum``
members compare equal to their strings, so stored and replayed data keep working.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any


class State(StrEnum):
    """What a process is doing, as reported."""

    STARTING = "starting"
    LOADING = "loading"
    COMPILING = "compiling"
    GRAPH_CAPTURE = "graph_capture"
    BUSY = "busy"
    IDLE = "idle"
    WAITING_PEER = "waiting_peer"
    STRAGGLER = "straggler"
    HUNG = "hung"
    ORPHANED = "orphaned"
    GONE = "gone"


STATES: tuple[str, ...] = tuple(s.value for s in State if s != State.GONE)

# How much a job's state matters to a person on call, least first: a job shows its worst rank's.
SEVERITY_ORDER: dict[State, int] = {
    State.GONE: -1, State.STARTING: 0, State.LOADING: 1, State.COMPILING: 2, State.GRAPH_CAPTURE: 3,
    State.BUSY: 4, State.IDLE: 5, State.WAITING_PEER: 6, State.STRAGGLER: 7, State.HUNG: 8, State.ORPHANED: 9,
}


class Local(StrEnum):
    """What one process does judged on its own signals, before the job is looked at."""

    ZOMBIE = "zombie"
    STOPPED = "stopped"
    LOADING = "loading"
    GRAPH_CAPTURE = "graph_capture"
    BUSY = "busy"  # real GPU work, or CPU work that progresses
    COMPILING = "compiling"
    SPINNING = "spinning"  # a GPU kernel resident doing nothing: a collective waiting for a peer
    WAITING = "waiting"  # blocked host-side in a collective or the rendezvous store (its stack says)
    SERVING = "serving"  # waiting for requests from outside (accept, epoll, a request queue)
    IO_WAIT = "io_wait"
    WORKER_WAIT = "worker_wait"  # blocked on a worker of its own job (a DataLoader worker, a pool, a child)
    WRITING = "writing"  # moving data out: a checkpoint being written, output being saved
    CPU = "cpu"  # on CPU, no proof of progress
    QUIET = "quiet"  # sleeping, nothing known

    @property
    def waits_for_peer(self) -> bool:
        return self in (Local.SPINNING, Local.WAITING)


# What a rank's own reading becomes when nothing about the job changes it.
LOCAL_TO_STATE: dict[Local, State] = {
    Local.BUSY: State.BUSY, Local.CPU: State.BUSY, Local.QUIET: State.IDLE, Local.SERVING: State.IDLE,
    Local.LOADING: State.LOADING, Local.GRAPH_CAPTURE: State.GRAPH_CAPTURE, Local.COMPILING: State.COMPILING,
    Local.IO_WAIT: State.LOADING, Local.WRITING: State.BUSY, Local.WORKER_WAIT: State.BUSY,
}


class Strength(IntEnum):
    """How strongly the evidence names a hang's culprit; a culprit found on evidence is kept until
    stronger (or equal) evidence names another."""

    INFERRED = 1  # the one rank not waiting with the others, no stack of it yet
    STACK = 2  # ... and its stack shows it somewhere other than the collective
    STOPPED = 3  # stopped (SIGSTOP, a debugger): it cannot be in the collective
    FLIGHT_RECORDER = 4  # its flight-recorder dump shows it never entered the collective the others are in


@dataclass(frozen=True, slots=True)
class Reading:
    """A process's local reading: what it does and the facts that decided it, in words."""

    local: Local
    why: str


@dataclass
class StateChange:
    t: float
    pid: int
    rank: int | None
    job: str | None
    state: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"t": round(self.t, 3), "pid": self.pid, "rank": self.rank, "job": self.job, "state": str(self.state),
                "reason": self.reason, "evidence": self.evidence}
