"""State facts: what a rank's evidence record says (its reading, its own history, the judgments
the engine made over its whole job at this tick), as pure functions over the ``Evidence`` record.
``rankstate.TABLE``'s rows name them; docs/analysis.md lists them with their words.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from hangd.analysis.model import Local, State


class Moved(StrEnum):
    """What one source says about a rank's progress over the window."""

    YES = "yes"
    NO = "no"
    UNKNOWN = "unknown"  # the source is missing: no permission, no py-spy, an older trace


class WaitsOn(StrEnum):
    """What a rank that is not working waits on."""

    NOTHING = "nothing"  # it is not waiting: it works, or nothing says it waits
    PEER = "peer"  # a peer, in a collective or the rendezvous store
    OWN_WORKER = "own_worker"  # a process or thread of its own job: a DataLoader worker, a pool, a thread
    OUTSIDE = "outside"  # input from outside the job: a listening or accepted socket, a request queue
    LOCK = "lock"  # a lock, event or condition no worker of its own is known to hold
    SLEEP = "sleep"  # a sleep in its own code
    STOPPED = "stopped"  # it runs no code at all (SIGSTOP, a debugger)
    UNKNOWN = "unknown"


# The sources of progress, in the order summaries name them.
SOURCES = ("gpu_work", "cpu_own_code", "read", "write", "log", "collectives", "stack", "children")


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything the state of one rank is decided on, at one tick.

    ``progress`` maps each of ``SOURCES`` to whether it moved (with how it is known in ``how``).
    The job facts are the engine's judgments over all ranks of the job at this tick.
    """

    local: Local  # what the rank does judged on its own signals (READING, below)
    why: str  # that reading in words
    progress: dict[str, Moved] = field(default_factory=dict)
    how: dict[str, str] = field(default_factory=dict)  # source -> what moved, in words
    waits_on: WaitsOn = WaitsOn.UNKNOWN
    waits_detail: str = ""  # "its DataLoader worker pid 4242, sleeping in futex_wait for 74 s"
    # its own history
    started: bool = False  # it showed what it is for at an earlier tick
    first_evidence: bool = False  # ... or does at this one
    previous: State | None = None
    why_previous: str = ""  # the reason it was given for that state
    # the job at this tick
    orphaned: bool = False
    orphan_why: str = ""
    job_hung: bool = False  # the job is judged hung (a hang incident, or a rank exited and the rest wait)
    hung_why: str = ""
    hung_ref: str = ""  # the incident that says so (" (incident #3 nccl_stall)")
    age_s: float = 0.0
    idle_server: bool = False  # the job serves and no request is in: nobody works, the waits end
    idle_why: str = ""
    # every rank of the job is in a collective and every one progresses: their collectives at work
    collectives_at_work: bool = False
    at_work_why: str = ""
    # every rank of the job waits at the same collective call, none missing: no rank holds them up
    one_wait: bool = False
    one_wait_why: str = ""
    job_captures: bool = False  # its job captures CUDA graphs (a rank's stack or log says so)
    capture_why: str = ""
    hold: bool = False  # a first wait, younger than the hang threshold and not a pattern: keep the state
    peers_wait_for_it: str = ""  # the ranks that wait for it in a collective, if any ("1, 2")
    it_waits_for: str = ""  # the ranks it waits for, if it waits in a collective ("0")
    waits_for_stopped: str = ""  # ... those of them stopped by a signal or a debugger ("3")

    def moved(self, *sources: str) -> bool:
        return any(self.progress.get(s) == Moved.YES for s in sources)


StateFact = Callable[[Evidence], bool]

# Readings of a rank at work on its own: on the GPU, loading, writing, compiling, capturing.
_AT_WORK = (Local.BUSY, Local.LOADING, Local.WRITING, Local.COMPILING, Local.GRAPH_CAPTURE)
# Readings of a rank that does no work of its own: when its peers wait for it, it holds them up.
_IDLE_HANDS = (Local.QUIET, Local.CPU, Local.IO_WAIT, Local.WORKER_WAIT)
# Readings a first wait or silence may keep the previous state through.
_HOLDABLE = (Local.SPINNING, Local.WAITING, Local.QUIET, Local.CPU, Local.WORKER_WAIT)
# Readings of a rank taking part in its job's graph capture: its GPU at work, or in the capture's
# collectives and barriers between batch sizes.
CAPTURING = (Local.BUSY, Local.GRAPH_CAPTURE, Local.SPINNING, Local.WAITING, Local.CPU)


def orphaned(e: Evidence) -> bool:
    """Its launcher is gone and it was re-parented."""
    return e.orphaned


def job_hung(e: Evidence) -> bool:
    """Its job is judged hung (a hang incident, or a rank exited and the rest wait)."""
    return e.job_hung


def stopped(e: Evidence) -> bool:
    """It is stopped by a signal (SIGSTOP, Ctrl-Z, a debugger): it runs no code until continued."""
    return e.local == Local.STOPPED


def waits_for_stopped(e: Evidence) -> bool:
    """It waits in a collective for a rank that is stopped (SIGSTOP, a debugger): nothing it waits
    for can come until that one is continued, however many ranks the job has."""
    return bool(e.waits_for_stopped)


def idle_server(e: Evidence) -> bool:
    """Its job serves with no request in: nobody works and every wait is for outside input or keeps ending."""
    return e.idle_server


def works_on_its_own(e: Evidence) -> bool:
    """Its reading is work of its own: busy, loading, writing, compiling or capturing a graph."""
    return e.local in _AT_WORK


def showed_purpose(e: Evidence) -> bool:
    """It showed what it is for, at an earlier tick or this one."""
    return e.started or e.first_evidence


def job_captures(e: Evidence) -> bool:
    """Its job captures CUDA graphs: a rank's stack or own log says so."""
    return e.job_captures


def capture_part(e: Evidence) -> bool:
    """Its reading fits a capture: its GPU at work, or in the capture's collectives and barriers."""
    return e.local in CAPTURING


def shows_capture(e: Evidence) -> bool:
    """Its own evidence shows the capture (its reading is graph capture)."""
    return e.local == Local.GRAPH_CAPTURE


def in_peer_wait(e: Evidence) -> bool:
    """Its reading is a wait for a peer: in a collective or the rendezvous store."""
    return e.local.waits_for_peer


def collectives_at_work(e: Evidence) -> bool:
    """Every rank of its job is in a collective and each progressed within the window."""
    return e.collectives_at_work


def one_wait(e: Evidence) -> bool:
    """Every rank of its job waits at the same collective call, none missing (younger than the hang threshold)."""
    return e.one_wait


def hold(e: Evidence) -> bool:
    """A first wait or silence in its job (or on its own workers that do not move), younger than the hang
    threshold, not a pattern, not a compiling rank whose stack now waits, not begun while a peer worked,
    not in a job a rank of which exited."""
    return e.hold


def has_previous(e: Evidence) -> bool:
    """It was given a state at an earlier tick."""
    return e.previous is not None


def holdable(e: Evidence) -> bool:
    """Its reading is one a first wait may keep the previous state through: spinning, waiting, quiet, CPU,
    waiting on its workers."""
    return e.local in _HOLDABLE


def starting_though_set_up(e: Evidence) -> bool:
    """Its previous state is starting, yet it has set up (a first wait then is its own, not setup's)."""
    return e.previous == State.STARTING and e.started


def peers_wait_for_it(e: Evidence) -> bool:
    """Peers wait for it in a collective (not in the rendezvous store)."""
    return bool(e.peers_wait_for_it)


def idle_hands(e: Evidence) -> bool:
    """Its reading is no work of its own: quiet, on CPU outside its work, in I/O wait, waiting on its workers."""
    return e.local in _IDLE_HANDS


def waits_on_its_workers(e: Evidence) -> bool:
    """Its reading is a wait on workers of its own (a DataLoader's, a pool's, a thread)."""
    return e.local == Local.WORKER_WAIT


def workers_moved(e: Evidence) -> bool:
    """Its workers progressed (the children source moved)."""
    return e.progress.get("children") == Moved.YES
