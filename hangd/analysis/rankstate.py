"""A rank's reported state: a pure function of its evidence record, by a decision table.

``decide(evidence) -> Decision``. The engine gathers the record (what each source says moved, what
the rank waits on, what is known of its job); this module only applies the table. ``TABLE`` is the
table of docs/analysis.md ("The decision table"), row for row: a test reads that table and checks
it against this one, so the two cannot drift apart.

The first row whose condition holds decides. A source that could not be read is ``UNKNOWN``, never
``NO``: a missing py-spy or an older trace never makes a rank look stuck.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from hangd.analysis.model import LOCAL_TO_STATE, Local, State


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

    local: Local  # what the rank does judged on its own signals (local.py)
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
    job_captures: bool = False  # its job captures CUDA graphs (a rank's stack or log says so)
    capture_why: str = ""
    hold: bool = False  # a first wait, younger than the hang threshold and not a pattern: keep the state
    peers_wait_for_it: str = ""  # the ranks that wait for it in a collective, if any ("1, 2")
    it_waits_for: str = ""  # the ranks it waits for, if it waits in a collective ("0")

    def moved(self, *sources: str) -> bool:
        return any(self.progress.get(s) == Moved.YES for s in sources)


@dataclass(frozen=True, slots=True)
class Decision:
    state: State
    rule: str  # the table row that decided
    reason: str


# Readings of a rank that does no work of its own: when its peers wait for it, it holds them up.
# (A rank that works, on the GPU, loading, writing, compiling, is what they wait for, doing its part.)
_IDLE_HANDS = (Local.QUIET, Local.CPU, Local.IO_WAIT, Local.WORKER_WAIT)
_HOLDABLE = (Local.SPINNING, Local.WAITING, Local.QUIET, Local.CPU, Local.WORKER_WAIT)


def _orphaned(e: Evidence) -> str | None:
    return f"{e.orphan_why}; now {e.why}" if e.orphaned else None


def _hung(e: Evidence) -> str | None:
    if not e.job_hung:
        return None
    return f"{e.hung_why}; this rank: {e.why}" + (f"; it waits for {e.waits_detail}" if e.waits_detail else "") + e.hung_ref


def _stopped(e: Evidence) -> str | None:
    if e.local != Local.STOPPED:
        return None
    return e.why + (f"; rank {e.peers_wait_for_it} wait for it" if e.peers_wait_for_it else "")


def _idle_server(e: Evidence) -> str | None:
    if not e.idle_server or e.local in (Local.BUSY, Local.LOADING, Local.WRITING, Local.COMPILING, Local.GRAPH_CAPTURE):
        return None
    return f"{e.idle_why}; this rank: {e.why}"


def _setting_up(e: Evidence) -> str | None:
    return None if e.started or e.first_evidence else f"started {e.age_s:.0f} s ago and still setting up: {e.why}"


# Readings of a rank taking part in its job's graph capture: its GPU at work, or in the capture's
# collectives and barriers between batch sizes.
CAPTURING = (Local.BUSY, Local.GRAPH_CAPTURE, Local.SPINNING, Local.WAITING, Local.CPU)


def _job_captures(e: Evidence) -> str | None:
    if not e.job_captures or e.local not in CAPTURING or e.local == Local.GRAPH_CAPTURE:
        return None  # a rank whose own evidence shows the capture says so itself
    return f"its job captures CUDA graphs: {e.capture_why}; this rank: {e.why}"


def _collectives_at_work(e: Evidence) -> str | None:
    if not e.collectives_at_work or not e.local.waits_for_peer:
        return None
    return f"{e.at_work_why}; this rank: {e.why}"


def _hold(e: Evidence) -> str | None:
    # a rank that set up but showed nothing else yet keeps "starting" through the first wait too
    if e.hold and e.previous is not None and (e.previous != State.STARTING or not e.started) and e.local in _HOLDABLE:
        return e.why_previous or "keeps its state: a first wait or silence, shorter than the hang threshold"
    return None


def _waits_for_peer(e: Evidence) -> str | None:
    if not e.local.waits_for_peer:
        return None
    return e.why + (f"; waiting for rank {e.it_waits_for}" if e.it_waits_for else "")


def _holds_others_up(e: Evidence) -> str | None:
    if not e.peers_wait_for_it or e.local not in _IDLE_HANDS:
        return None
    plural = "," in e.peers_wait_for_it
    return f"rank{'s' if plural else ''} {e.peers_wait_for_it} wait{'' if plural else 's'} for it in a collective; this rank: {e.why}"


def _workers_work(e: Evidence) -> str | None:
    if e.local != Local.WORKER_WAIT or e.progress.get("children") != Moved.YES:
        return None
    return f"{e.why}; they work: {e.how.get('children', 'its workers work')}"


def _own_reading(e: Evidence) -> str | None:
    return e.why


@dataclass(frozen=True, slots=True)
class Row:
    rule: str
    when: str  # the condition in words, as docs/analysis.md has it
    state: str  # a State, or "previous"
    test: Callable[[Evidence], str | None]  # the reason if the row applies


# The decision table. docs/analysis.md shows the same rows (a test compares them).
TABLE: tuple[Row, ...] = (
    Row("orphaned", "its launcher is gone and it was re-parented", State.ORPHANED, _orphaned),
    Row("job_hung", "its job is judged hung: every rank of a hung job is hung", State.HUNG, _hung),
    Row("stopped", "it is stopped by a signal (SIGSTOP, Ctrl-Z): it runs no code until continued", State.HUNG, _stopped),
    Row("idle_server", "its job serves with no request in: nobody works and every wait is for outside input "
        "or keeps ending", State.IDLE, _idle_server),
    Row("setting_up", "it has shown nothing yet of what it is for", State.STARTING, _setting_up),
    Row("job_captures", "its job captures CUDA graphs (a rank's stack or own log says so) and it works on its GPU or "
        "waits in the capture's collectives", State.GRAPH_CAPTURE, _job_captures),
    Row("collectives_at_work", "it waits in a collective, and so does every rank of its job, each of which progressed "
        "within the window: their collectives at work", State.BUSY, _collectives_at_work),
    Row("hold", "a first wait or silence in its job, or a wait on its own workers that do not move, younger than "
        "the hang threshold, not a pattern (unless every rank waits), not a compiling rank whose stack now shows a "
        "wait, not a wait that began while a peer went on working, and not a wait in a job a rank of which exited", "previous", _hold),
    Row("waits_for_peer", "it waits in a collective or the rendezvous store", State.WAITING_PEER, _waits_for_peer),
    Row("holds_others_up", "peers wait for it in a collective (not in the rendezvous store) and no work of its own explains it",
        State.STRAGGLER, _holds_others_up),
    Row("workers_work", "it waits on workers of its own that work (a DataLoader filling its queue)", State.BUSY,
        _workers_work),
    Row("own_reading", "otherwise: what it does on its own", "reading", _own_reading),
)


def decide(e: Evidence) -> Decision:
    for row in TABLE:
        reason = row.test(e)
        if reason is None:
            continue
        if row.state == "previous":
            assert e.previous is not None  # the row applies only with a previous state
            return Decision(e.previous, row.rule, reason)
        if row.state == "reading":
            return Decision(LOCAL_TO_STATE.get(e.local, State.IDLE), row.rule, reason)
        return Decision(State(row.state), row.rule, reason)
    raise AssertionError("the last row always applies")  # pragma: no cover


def progress_words(e: Evidence) -> str:
    """What moved, in words ("read 130 MB/s (rchar); wrote to its log"), or "" when nothing did."""
    return "; ".join(e.how[s] for s in SOURCES if e.progress.get(s) == Moved.YES and s in e.how)
