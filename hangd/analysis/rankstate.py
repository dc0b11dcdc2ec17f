"""A rank's reading and its reported state: two tables of named facts, checked in order.

``classify(signals, context, thresholds) -> Reading``: what one process does on its own, by
``READING``, rows of facts (``hangd/analysis/facts/``): the first row all of whose ``all`` facts
hold, one of its ``any`` facts if it names some, and none of its ``none`` facts, decides.

``decide(evidence) -> Decision``: its reported state, by ``TABLE``, over the evidence record the
engine gathers (what each source says moved, what the rank waits on, what is known of its job).

docs/analysis.md's tables are generated from these two (``python scripts/analysis_doc.py``); a
test fails when they differ. A source that could not be read is ``UNKNOWN``, never ``NO``: a missing
py-spy or an older trace never makes a rank look stuck.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hangd.analysis.facts import Context, Fact, RankIn, cpu, gpu, io, stack, waits
from hangd.analysis.facts import evidence as ev
from hangd.analysis.facts.evidence import CAPTURING, SOURCES, Evidence, Moved, StateFact, WaitsOn
from hangd.analysis.model import LOCAL_TO_STATE, Local, Reading, State
from hangd.analysis.signals import ProcSignals, pct_text
from hangd.analysis.thresholds import GiB, Thresholds

# the evidence record and its words live with the state facts (facts/evidence.py); named here too
__all__ = ["CAPTURING", "READING", "SOURCES", "TABLE", "Decision", "Evidence", "Moved", "ReadingRow", "Row",
           "WaitsOn", "classify", "decide", "progress_words"]


@dataclass(frozen=True, slots=True)
class Decision:
    state: State
    rule: str  # the table row that decided
    reason: str


def _hung_why(e: Evidence) -> str:
    return f"{e.hung_why}; this rank: {e.why}" + (f"; it waits for {e.waits_detail}" if e.waits_detail else "") + e.hung_ref


def _holds_up_why(e: Evidence) -> str:
    plural = "," in e.peers_wait_for_it
    return f"rank{'s' if plural else ''} {e.peers_wait_for_it} wait{'' if plural else 's'} for it in a collective; this rank: {e.why}"


@dataclass(frozen=True, slots=True)
class Row:
    """A row of the state table: it applies when all of its ``all`` facts hold and none of its
    ``none`` facts; ``state`` is a State, "previous" (keep it) or "reading" (what its reading says)."""

    rule: str
    when: str  # the condition in words, as docs/analysis.md has it
    state: str
    why: Callable[[Evidence], str]  # the reason, in words
    all: tuple[StateFact, ...] = ()
    none: tuple[StateFact, ...] = ()


# The decision table, checked in order. docs/analysis.md shows the same rows (a test compares them).
TABLE: tuple[Row, ...] = (
    Row("orphaned", "its launcher is gone and it was re-parented", State.ORPHANED,
        lambda e: f"{e.orphan_why}; now {e.why}", all=(ev.orphaned,)),
    Row("job_hung", "its job is judged hung: every rank of a hung job is hung", State.HUNG, _hung_why, all=(ev.job_hung,)),
    Row("stopped", "it is stopped by a signal (SIGSTOP, Ctrl-Z): it runs no code until continued", State.HUNG,
        lambda e: e.why + (f"; rank {e.peers_wait_for_it} wait for it" if e.peers_wait_for_it else ""), all=(ev.stopped,)),
    Row("waits_for_stopped", "it waits in a collective for a rank that is stopped: it cannot go on until that one is "
        "continued", State.HUNG, lambda e: f"{e.why}; rank {e.waits_for_stopped} it waits for is stopped",
        all=(ev.waits_for_stopped,)),
    Row("idle_server", "its job serves with no request in: nobody works and every wait is for outside input "
        "or keeps ending", State.IDLE, lambda e: f"{e.idle_why}; this rank: {e.why}",
        all=(ev.idle_server,), none=(ev.works_on_its_own,)),
    Row("setting_up", "it has shown nothing yet of what it is for", State.STARTING,
        lambda e: f"started {e.age_s:.0f} s ago and still setting up: {e.why}", none=(ev.showed_purpose,)),
    # a rank whose own evidence shows the capture says so itself (its reading, by the last row)
    Row("job_captures", "its job captures CUDA graphs (a rank's stack or own log says so) and it works on its GPU or "
        "waits in the capture's collectives", State.GRAPH_CAPTURE,
        lambda e: f"its job captures CUDA graphs: {e.capture_why}; this rank: {e.why}",
        all=(ev.job_captures, ev.capture_part), none=(ev.shows_capture,)),
    Row("collectives_at_work", "it waits in a collective, and so does every rank of its job, each of which progressed "
        "within the window: their collectives at work", State.BUSY, lambda e: f"{e.at_work_why}; this rank: {e.why}",
        all=(ev.collectives_at_work, ev.in_peer_wait)),
    Row("one_wait", "it waits in a collective, and every rank of its job waits at the same call, none missing "
        "from it (shorter than the hang threshold for that): their collectives run, slowly", State.BUSY,
        lambda e: f"{e.one_wait_why}; this rank: {e.why}", all=(ev.one_wait, ev.in_peer_wait)),
    # a rank that set up but showed nothing else yet keeps "starting" through the first wait too
    Row("hold", "a first wait or silence in its job, or a wait on its own workers that do not move, younger than "
        "the hang threshold, not a pattern (unless every rank waits), not a compiling rank whose stack now shows a "
        "wait, not a wait that began while a peer went on working, and not a wait in a job a rank of which exited", "previous",
        lambda e: e.why_previous or "keeps its state: a first wait or silence, shorter than the hang threshold",
        all=(ev.hold, ev.has_previous, ev.holdable), none=(ev.starting_though_set_up,)),
    Row("waits_for_peer", "it waits in a collective or the rendezvous store", State.WAITING_PEER,
        lambda e: e.why + (f"; waiting for rank {e.it_waits_for}" if e.it_waits_for else ""), all=(ev.in_peer_wait,)),
    Row("holds_others_up", "peers wait for it in a collective (not in the rendezvous store) and no work of its own explains it",
        State.STRAGGLER, _holds_up_why, all=(ev.peers_wait_for_it, ev.idle_hands)),
    Row("workers_work", "it waits on workers of its own that work (a DataLoader filling its queue)", State.BUSY,
        lambda e: f"{e.why}; they work: {e.how.get('children', 'its workers work')}",
        all=(ev.waits_on_its_workers, ev.workers_moved)),
    Row("own_reading", "otherwise: what it does on its own", "reading", lambda e: e.why),
)


def decide(e: Evidence) -> Decision:
    """The rank's reported state: the first row of ``TABLE`` that applies."""
    for row in TABLE:
        if not all(f(e) for f in row.all) or any(f(e) for f in row.none):
            continue
        if row.state == "previous":
            assert e.previous is not None  # the row applies only with a previous state
            return Decision(e.previous, row.rule, row.why(e))
        if row.state == "reading":
            return Decision(LOCAL_TO_STATE.get(e.local, State.IDLE), row.rule, row.why(e))
        return Decision(State(row.state), row.rule, row.why(e))
    raise AssertionError("the last row always applies")  # pragma: no cover


def progress_words(e: Evidence) -> str:
    """What moved, in words ("read 130 MB/s (rchar); wrote to its log"), or "" when nothing did."""
    return "; ".join(e.how[s] for s in SOURCES if e.progress.get(s) == Moved.YES and s in e.how)


# ------------------------------------------------------------------ the reading: what it does on its own


@dataclass(frozen=True, slots=True)
class ReadingRow:
    """A row of ``READING``: ``local`` when every fact of ``all`` holds, one of ``any`` if it names
    some, and none of ``none``; ``why`` says so in words."""

    local: Local
    why: Callable[[RankIn], str]
    all: tuple[Fact, ...] = ()
    any: tuple[Fact, ...] = ()
    none: tuple[Fact, ...] = ()


def _mbps(x: float | None) -> str:
    return f"{(x or 0) / 1e6:.0f}"


def _loading_why(r: RankIn) -> str:
    s, th, v = r.s, r.th, r.ctx.verdict
    if io.moves_in(r) and not io.reads_fast(r):
        why = f"reading {_mbps(s.in_long_per_s)} MB/s over the last {th.io_window_s:.0f} s ({s.in_counter})"
    elif io.reads_fast(r):
        why = f"reading {((s.read_per_s or 0) + (s.rchar_per_s or 0)) / 1e6:.0f} MB/s from disk"
    elif io.reads_slowly(r):
        why = f"reading {_mbps(s.in_long_per_s)} MB/s from disk over the last {th.io_window_s:.0f} s"
    elif v.kind == "loading":
        why = f"its stack is {v.why} ({v.frame})"
    else:
        why = "its log says it loads weights"
    if s.gpu_mem_rate > 0:
        why += f", GPU memory growing {s.gpu_mem_rate / 1e6:.0f} MB/s"
    return why


def _capture_why(r: RankIn) -> str:
    g, s = r.s.gpu, r.s
    why = "its log says it captures CUDA graphs" if "graph_capture" in s.log_kinds else \
        f"GPU memory growing {s.gpu_mem_rate / 1e6:.0f} MB/s while the GPU runs short bursts"
    return why + f" (util {g.util or 0:.0f}%, SM {g.sm or 0:.0f}%)"


def _gpu_works_why(r: RankIn) -> str:
    g = r.s.gpu
    return (f"GPU working: tensor {pct_text(g.tensor)}%, DRAM {pct_text(g.dram)}%, NVLink "
            f"{g.nvlink_mibs or 0:.0f} MiB/s, {g.power_w or 0:.0f} W") if g.has_gpm else \
        f"GPU working: util {g.util or 0:.0f}%, memory controller {g.util_mem or 0:.0f}%"


def _spin_why(r: RankIn) -> str:
    g = r.s.gpu
    return (f"spinning in a GPU collective: util {g.util or 0:.0f}% but SM {g.sm or 0:.0f}%, "
            f"tensor {pct_text(g.tensor)}%, DRAM {pct_text(g.dram)}%, no NVLink traffic, "
            f"{g.power_w or 0:.0f} W") if g.has_gpm else \
        f"spinning on the GPU: util {g.util or 0:.0f}% with the memory controller idle"


def _transport_rate(r: RankIn) -> str:
    return f"{max(r.s.in_long_per_s or 0, r.s.out_long_per_s or 0) / 1e6:.1f}"


def _compiling_why(r: RankIn) -> str:
    s = r.s
    return f"{s.compile_children} compiler processes under it" if s.compile_children else \
        "its log says it compiles" if "compiling" in s.log_kinds else \
        "its log said it compiles, and it has been on the CPU since"


def _stack(r: RankIn) -> str:
    return f"its stack is {r.ctx.verdict.why} ({r.ctx.verdict.frame})"


def _frame(r: RankIn) -> str:
    v = r.ctx.verdict
    return f" ({v.frame})" if v.known else ""


def _other_end(r: RankIn, joint: str, part: str) -> str:
    """Its descriptors' wait in words: the call, its frame, then ``joint`` and the other end's ``part``."""
    oe = r.ctx.other_end
    assert oe is not None  # the rows that say so hold only with one
    return f"{oe.call}{_frame(r)}{joint}{getattr(oe, part)}"


def _quiet_why(r: RankIn) -> str:
    s, v = r.s, r.ctx.verdict
    if v.known:
        what = f"its stack is {v.why} ({v.frame})"
    elif s.state in ("S", "D", "I") and s.wchan and s.wchan != "0":
        what = f"sleeping in {s.wchan}"
    elif s.state == "R":
        what = "running (state R) with little CPU"
    else:
        what = f"sleeping (state {s.state or '?'})"
    if s.gpu_indexes and s.gpu_mem > 0:
        what += f"; GPU idle, {s.gpu_mem / GiB:.1f} GiB held"
    elif s.gpu_indexes:
        what += "; GPU idle, no GPU memory held"
    return what


# The reading table. A bytes-moving row comes before the GPU rows that would also hold (a loader's
# first kernels), a stack that names a phase before the rates that guess one, descriptors before a
# frame's name, and a rank's CPU alone last: a guess. docs/analysis.md shows the same rows.
READING: tuple[ReadingRow, ...] = (
    ReadingRow(Local.ZOMBIE, lambda r: "zombie: exited, not yet reaped", all=(waits.zombie,)),
    ReadingRow(Local.STOPPED, lambda r: "stopped (SIGSTOP or a debugger): it runs no code at all", all=(waits.stopped,)),
    # awake in its own model's code: it works, whatever bytes come in meanwhile (CUDA libraries
    # paged in as their kernels first run read like a loader)
    ReadingRow(Local.BUSY, _stack, all=(stack.stack_computing,), none=(gpu.gpu_works, gpu.gpu_spins)),
    ReadingRow(Local.LOADING, _loading_why, any=(io.reads_fast, io.reads_slowly, io.moves_in, stack.stack_loading,
                                                  io.log_loads_from_disk), none=(gpu.gpu_works,)),
    ReadingRow(Local.WRITING, lambda r: f"writing {_mbps(r.s.out_long_per_s)} MB/s over the last "
                                        f"{r.th.io_window_s:.0f} s ({r.s.out_counter})",
               all=(io.moves_out,), none=(gpu.gpu_works,)),
    ReadingRow(Local.GRAPH_CAPTURE, lambda r: f"its stack is capturing a CUDA graph ({r.ctx.verdict.frame})",
               all=(stack.stack_captures,)),
    ReadingRow(Local.GRAPH_CAPTURE, _capture_why, all=(gpu.gpu_active,), any=(stack.log_captures, gpu.memory_grows_in_bursts)),
    ReadingRow(Local.BUSY, _gpu_works_why, all=(gpu.gpu_works,)),
    # NCCL over sockets (ranks sharing one GPU, nodes with no RDMA): its kernels spin between the chunks
    ReadingRow(Local.BUSY, lambda r: f"its collectives move {_transport_rate(r)} MB/s through its sockets while its "
                                     f"GPU waits on them (util {r.s.gpu.util or 0:.0f}%, SM {r.s.gpu.sm or 0:.0f}%)",
               all=(io.transport_bytes_under_spin,)),
    ReadingRow(Local.SPINNING, _spin_why, all=(gpu.gpu_spins,)),
    ReadingRow(Local.COMPILING, lambda r: f"its stack is compiling ({r.ctx.verdict.frame})", all=(stack.stack_compiles,)),
    ReadingRow(Local.COMPILING, _compiling_why, any=(stack.log_compiles, stack.compilers_run),
               none=(stack.out_of_compile,)),
    # back-to-back collectives at work, however many ranks share the CPU; bytes read alone may be a file's
    ReadingRow(Local.BUSY, lambda r: f"its collectives move {_transport_rate(r)} MB/s through its sockets "
                                     f"(on {r.s.cpu_cores or 0:.2f} cores)",
               all=(io.sends_at_transport_rate, waits.wakes_in_calls), none=(gpu.gpu_spins, stack.stack_sleeps)),
    ReadingRow(Local.WAITING, lambda r: f"its stack is {r.ctx.verdict.why}: {r.ctx.verdict.frame}", all=(stack.stack_waits,)),
    ReadingRow(Local.WAITING, lambda r: f"{_stack(r)} and it sleeps: DDP's gradient all_reduce waits for a peer",
               all=(stack.stack_backward, waits.asleep), none=(cpu.cpu_active,)),
    # what the descriptors say beats a frame's name: a select() may wait on a worker or a client
    ReadingRow(Local.SERVING, lambda r: f"waiting for input from outside its job in {_other_end(r, ': ', 'what')}",
               all=(waits.descriptors_decide, waits.other_end_outside)),
    ReadingRow(Local.WORKER_WAIT, lambda r: f"its main thread waits in {_other_end(r, ' on ', 'brief')}",
               all=(waits.descriptors_decide, waits.other_end_own)),
    ReadingRow(Local.WAITING, lambda r: f"its main thread waits in {_other_end(r, ' on ', 'what')}",
               all=(waits.descriptors_decide, waits.other_end_peer)),
    ReadingRow(Local.WORKER_WAIT, _stack, all=(stack.stack_worker_wait,)),
    ReadingRow(Local.BUSY, lambda r: f"on CPU ({r.s.cpu_cores or 0:.1f} cores) and progressing: {r.ctx.progress_why}",
               all=(cpu.cpu_active, cpu.progressed_recently), none=(gpu.has_gpu,)),
    # the queue a listener thread fills is also where a worker thread's result would come
    ReadingRow(Local.QUIET, lambda r: f"its stack is blocked reading a queue ({r.ctx.verdict.frame}) and an exception "
                                      "was logged as its job went still: it may wait for a thread of its own that died",
               all=(stack.stack_fed_from_outside, stack.exception_as_it_stopped)),
    ReadingRow(Local.SERVING, lambda r: _stack(r) if stack.stack_request_wait(r) else
               f"sleeping in {r.s.wchan}: waiting for requests", any=(stack.stack_request_wait, waits.wchan_request)),
    ReadingRow(Local.IO_WAIT, lambda r: f"in uninterruptible I/O (wchan {r.s.wchan})", all=(io.in_disk_wait,)),
    ReadingRow(Local.BUSY, lambda r: f"driving its GPU: util {r.s.gpu.util or 0:.0f}%, its main thread wakes "
                                     f"{r.s.wakes_per_s or 0:.0f} times a second", all=(gpu.drives_gpu,)),
    ReadingRow(Local.BUSY, lambda r: f"on CPU ({r.s.cpu_cores or 0:.1f} cores), host memory changed by "
                                     f"{(r.s.rss_change or 0) / GiB:+.2f} GiB over the last {r.th.window_s:.0f} s",
               all=(cpu.on_cpu, cpu.host_memory_moves)),
    ReadingRow(Local.CPU, lambda r: f"on CPU ({r.s.cpu_cores or 0:.1f} cores)", all=(cpu.runs_on_cpu,)),
    ReadingRow(Local.CPU, lambda r: f"runnable {r.s.r_fraction:.0%} of the time on a host short of CPU "
                                    f"({r.s.cpu_cores or 0:.2f} cores)", all=(cpu.starved_of_cores,)),
    ReadingRow(Local.QUIET, _quiet_why),
)


def classify(s: ProcSignals, ctx: Context, th: Thresholds) -> Reading:
    """What one process does on its own: the first row of ``READING`` that holds. Each fact is
    judged at most once (a fact most rows share, the GPU's work, is judged once)."""
    r = RankIn(s, ctx, th)
    seen: dict[Fact, bool] = {}

    def holds(f: Fact) -> bool:
        v = seen.get(f)
        if v is None:
            v = seen[f] = f(r)
        return v

    for row in READING:
        if all(holds(f) for f in row.all) and (not row.any or any(holds(f) for f in row.any)) \
                and not any(holds(f) for f in row.none):
            return Reading(row.local, row.why(r))
    raise AssertionError("the last row always applies")  # pragma: no cover
