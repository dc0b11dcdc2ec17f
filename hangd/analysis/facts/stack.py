"""Phase facts: what its stack (while it still describes it) or its own log names: computing,
loading, compiling, graph capture, a wait in a collective or the store, a wait of its own."""

from __future__ import annotations

from hangd.analysis import stackcat
from hangd.analysis.facts import RankIn, cpu
from hangd.analysis.signals import ProcSignals
from hangd.analysis.thresholds import Thresholds

# Stack kinds of a wait for a peer: in a collective, or in the rendezvous store.
WAIT_VERDICTS = ("collective", "store")


def compile_goes_on(s: ProcSignals, th: Thresholds) -> bool:
    """What a compile shows while it goes on, with no new stack to say so: its compilers run under
    it, it works on the CPU (dynamo tracing, inductor's code generation), or it writes its files
    (sources, objects, the libraries it loads). A compiled program's steps asleep between them
    show none of it (a few hundred KB/s of collectives over sockets, a few % of a core). Nor does a
    rank whose own kernels run while its main thread sleeps: its compiled program runs, and the
    compile workers still busy under it warm up their pool in the background (inductor starts
    them as the compile begins; each imports torch for seconds, after the compile is done)."""
    if (s.cpu_cores or 0) < th.compile_cpu_cores and s.gpu.active(th) and not s.gpu.spins(th):
        return False
    return s.compile_children > 0 or (s.cpu_cores or 0) >= th.compile_cpu_cores or cpu.starved(s, th) or \
        (s.wchar_per_s or 0) >= th.io_bytes_per_s or (s.write_per_s or 0) >= th.io_bytes_per_s


def computing_goes_on(s: ProcSignals, th: Thresholds) -> bool:
    """What a rank running its model shows between two captures: its main thread on the CPU
    (launching kernels, a CPU model's math) or its GPU running them."""
    return ((s.cpu_cores or 0) >= th.busy_cpu_cores and s.state == "R") or (s.gpu.util or 0) >= th.gpu_active_util_pct


# ------------------------------------------------------------------ facts of the reading table


def stack_waits(r: RankIn) -> bool:
    """Its stack shows a wait for a peer: a collective, or the rendezvous store."""
    return r.ctx.verdict.kind in WAIT_VERDICTS


def stack_computing(r: RankIn) -> bool:
    """Its stack is in its own model's code: a forward pass, an optimizer's step."""
    return r.ctx.verdict.kind == "computing"


def stack_loading(r: RankIn) -> bool:
    """Its stack is loading weights or data."""
    return r.ctx.verdict.kind == "loading"


def stack_captures(r: RankIn) -> bool:
    """Its stack is capturing a CUDA graph."""
    return r.ctx.verdict.kind == "graph_capture"


def stack_compiles(r: RankIn) -> bool:
    """Its stack is in torch.compile (or its set-up)."""
    return r.ctx.verdict.kind in stackcat.COMPILE_KINDS


def compilers_run(r: RankIn) -> bool:
    """Compiler processes run under it while it uses ``compile_cpu_cores``."""
    return r.s.compile_children > 0 and (r.s.cpu_cores or 0) >= r.th.compile_cpu_cores


def compiles_now(r: RankIn) -> bool:
    """Its stack or its compilers say it compiles: bytes moving under it are the compile's files."""
    return stack_compiles(r) or compilers_run(r)


def log_compiles(r: RankIn) -> bool:
    """Its log says it compiles, or said so last and it has been on the CPU with no GPU work since."""
    s = r.s
    return "compiling" in s.log_kinds or (
        cpu.on_cpu(r) and s.log_phase is not None and s.log_phase[0] == "compiling"
        and (s.gpu_work_at is None or s.gpu_work_at < s.log_phase[1]))


def log_captures(r: RankIn) -> bool:
    """Its log says it captures CUDA graphs ("Capture cuda graph", "Capturing batches")."""
    return "graph_capture" in r.s.log_kinds


def out_of_compile(r: RankIn) -> bool:
    """Its newest stack, taken after it was last seen compiling, is in its own code: compilers
    still at work under it compile in the background."""
    return r.ctx.out_of_compile


def stack_sleeps(r: RankIn) -> bool:
    """Its stack shows it asleep in a wait (the store, a lock, its workers, a sleep)."""
    return r.ctx.verdict.kind in stackcat.SLEEPING_KINDS


def stack_backward(r: RankIn) -> bool:
    """Its stack is in the backward pass (DDP's gradient all_reduce runs from its hooks)."""
    return r.ctx.verdict.kind == "backward"


def stack_worker_wait(r: RankIn) -> bool:
    """Its stack waits on a worker of its job: a DataLoader's queue, a pool, a future, a join."""
    return r.ctx.verdict.kind == "worker_wait"


def stack_request_wait(r: RankIn) -> bool:
    """Its stack waits for requests: a server's accept, event loop or poll."""
    return r.ctx.verdict.kind == "request_wait"


def stack_fed_from_outside(r: RankIn) -> bool:
    """Its stack reads a queue that a listener thread of its own fills from outside."""
    return stackcat.fed_from_outside(r.ctx.verdict)


def exception_as_it_stopped(r: RankIn) -> bool:
    """An exception line came in its job's logs as the job went still."""
    return r.ctx.exception_as_it_stopped
