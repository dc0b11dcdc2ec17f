"""What one process does, judged on its own signals: a pure function, table-tested.

``classify(signals, context, thresholds) -> Reading``. The context carries what the engine knows
about the process beyond this tick's signals (its stack's verdict while it still describes it, its
recent progress); nothing here is mutated or remembered.
"""

from __future__ import annotations

from dataclasses import dataclass

from hangd.analysis import otherend, stackcat
from hangd.analysis.model import Local, Reading
from hangd.analysis.signals import ProcSignals
from hangd.analysis.thresholds import GiB, Thresholds

# Kernel wait points of a process waiting for work from outside (a socket, an event loop).
REQUEST_WCHANS = ("inet_csk_accept", "ep_poll", "do_epoll_wait", "do_select", "do_sys_poll", "unix_stream_read",
                  "sk_wait_data", "pipe_read", "do_poll")
WAIT_VERDICTS = ("collective", "store")


@dataclass(frozen=True, slots=True)
class Context:
    """What the engine knows about a process besides this tick's signals."""

    verdict: stackcat.Verdict = stackcat.UNKNOWN  # its stack's verdict, only while it still describes it
    progressed_recently: bool = False  # strong progress within the window
    progress_why: str = ""
    # whose is the other end of the descriptors its main thread sleeps on (otherend.py); None: unknown
    other_end: otherend.OtherEnd | None = None
    # its newest stack, taken after it was last seen compiling, shows its main thread in its own
    # code outside the compiler: compilers still at work under it compile in the background
    out_of_compile: bool = False
    # an exception line came in its job's logs as the job went still (report.exception_as_it_stopped)
    exception_as_it_stopped: bool = False


def classify(s: ProcSignals, ctx: Context, th: Thresholds) -> Reading:
    v = ctx.verdict
    g = s.gpu
    works = g.works(th)
    if s.state == "Z":
        return Reading(Local.ZOMBIE, "zombie: exited, not yet reaped")
    if s.state == "T":
        return Reading(Local.STOPPED, "stopped (SIGSTOP or a debugger): it runs no code at all")
    # reading fast *and* the data going somewhere (GPU memory, host memory) or waiting on the disk;
    # importing python packages at start reads too, but into nothing
    filling = (s.gpu_mem_rate > 0 or s.d_fraction >= th.filling_d_fraction) and (bool(s.gpu_indexes) or s.age_s >= th.startup_cpu_s)
    reading = filling and ((s.read_per_s or 0) >= th.load_read_per_s or (s.rchar_per_s or 0) >= th.load_rchar_per_s) \
        and not paged_in(s, th)
    # a slow reader: bytes from the disk (read_bytes) in bursts with sleeps between, long past start-up;
    # reads only: a checkpoint writer's bytes go the other way
    slow_reading = (s.in_long_per_s or 0) >= th.load_read_per_s and s.in_counter == "read_bytes" and \
        s.in_active_s >= th.io_sustained_s and not reads_stopped(s, th) and \
        (s.in_long_per_s or 0) >= th.moving_ratio * (s.out_long_per_s or 0) and \
        (filling or s.age_s >= th.startup_cpu_s or (s.cpu_cores or 0) < th.busy_cpu_cores) and \
        not paged_in(s, th)  # imports burn CPU
    # compiler processes write and read their files: bytes moving under a compiling rank are its compile
    compiling = v.kind in stackcat.COMPILE_KINDS or (s.compile_children > 0 and (s.cpu_cores or 0) >= th.compile_cpu_cores)
    moving_in = moves(s, th, "in") and not compiling and not paged_in(s, th)
    moving_out = moves(s, th, "out") and not compiling
    if v.kind in WAIT_VERDICTS:
        # a stack that still describes it (taken after its reads) shows it waiting: the reads over
        # the I/O window are behind it
        slow_reading = moving_in = False
    if v.kind == "computing" and not works and not g.spins(th):
        # awake in its own model's code (a forward pass, an optimizer step): it works, whatever
        # bytes come in meanwhile (CUDA libraries paged in as their kernels first run read like a loader)
        return Reading(Local.BUSY, f"its stack is {v.why} ({v.frame})")
    if not works and (reading or slow_reading or moving_in or v.kind == "loading" or ("loading" in s.log_kinds and s.d_fraction > 0)):
        if moving_in and not reading:
            why = f"reading {(s.in_long_per_s or 0) / 1e6:.0f} MB/s over the last {th.io_window_s:.0f} s ({s.in_counter})"
        elif reading:
            why = f"reading {((s.read_per_s or 0) + (s.rchar_per_s or 0)) / 1e6:.0f} MB/s from disk"
        elif slow_reading:
            why = f"reading {(s.in_long_per_s or 0) / 1e6:.0f} MB/s from disk over the last {th.io_window_s:.0f} s"
        elif v.kind == "loading":
            why = f"its stack is {v.why} ({v.frame})"
        else:
            why = "its log says it loads weights"
        if s.gpu_mem_rate > 0:
            why += f", GPU memory growing {s.gpu_mem_rate / 1e6:.0f} MB/s"
        return Reading(Local.LOADING, why)
    if not works and moving_out:
        return Reading(Local.WRITING, f"writing {(s.out_long_per_s or 0) / 1e6:.0f} MB/s over the last "
                                      f"{th.io_window_s:.0f} s ({s.out_counter})")
    if v.kind == "graph_capture":
        return Reading(Local.GRAPH_CAPTURE, f"its stack is capturing a CUDA graph ({v.frame})")
    growing = min(s.gpu_mem_rate, s.gpu_mem_rate_before) >= th.capture_growth_per_s
    saturated = (g.util or 0) >= th.saturated_util_pct and (g.sm or 0) >= th.saturated_sm_pct
    if g.active(th) and ("graph_capture" in s.log_kinds or (growing and not saturated)):
        why = "its log says it captures CUDA graphs" if "graph_capture" in s.log_kinds else \
            f"GPU memory growing {s.gpu_mem_rate / 1e6:.0f} MB/s while the GPU runs short bursts"
        return Reading(Local.GRAPH_CAPTURE, why + f" (util {g.util or 0:.0f}%, SM {g.sm or 0:.0f}%)")
    if works:
        return Reading(Local.BUSY, (f"GPU working: tensor {g.tensor or 0:.0f}%, DRAM {g.dram or 0:.0f}%, NVLink "
                                    f"{g.nvlink_mibs or 0:.0f} MiB/s, {g.power_w or 0:.0f} W") if g.has_gpm else
                       f"GPU working: util {g.util or 0:.0f}%, memory controller {g.util_mem or 0:.0f}%")
    # a kernel spinning on its GPU is a wait, whatever its last stack or log said it was doing,
    # unless bytes go through its read and write calls at a transport's rate all the while: NCCL
    # over sockets (no shared memory or NVLink between the two: ranks sharing one GPU, nodes with
    # no RDMA) moves each collective's data that way, and its kernels spin between the chunks
    if socket_transport(s, th):
        return Reading(Local.BUSY, f"its collectives move {max(s.in_long_per_s or 0, s.out_long_per_s or 0) / 1e6:.1f} "
                                   f"MB/s through its sockets while its GPU waits on them (util {g.util or 0:.0f}%, "
                                   f"SM {g.sm or 0:.0f}%)")
    if g.spins(th):
        return Reading(Local.SPINNING, (f"spinning in a GPU collective: util {g.util or 0:.0f}% but SM {g.sm or 0:.0f}%, "
                                        f"tensor {g.tensor or 0:.0f}%, DRAM {g.dram or 0:.0f}%, no NVLink traffic, "
                                        f"{g.power_w or 0:.0f} W") if g.has_gpm else
                       f"spinning on the GPU: util {g.util or 0:.0f}% with the memory controller idle")
    # the phase its own log named last still holds while it stays on the CPU with no GPU work since
    on_cpu = (s.cpu_cores or 0) >= th.busy_cpu_cores and s.state == "R" or starved(s, th)
    log_compiles = "compiling" in s.log_kinds or (
        on_cpu and s.log_phase is not None and s.log_phase[0] == "compiling"
        and (s.gpu_work_at is None or s.gpu_work_at < s.log_phase[1]))
    if v.kind in stackcat.COMPILE_KINDS or (not ctx.out_of_compile and (
            log_compiles or (s.compile_children > 0 and (s.cpu_cores or 0) >= th.compile_cpu_cores))):
        why = f"its stack is compiling ({v.frame})" if v.kind in stackcat.COMPILE_KINDS else \
            f"{s.compile_children} compiler processes under it" if s.compile_children else \
            "its log says it compiles" if "compiling" in s.log_kinds else \
            "its log said it compiles, and it has been on the CPU since"
        return Reading(Local.COMPILING, why)
    if not g.spins(th) and v.kind not in stackcat.SLEEPING_KINDS and sends_steadily(s, th) and \
            (s.wakes_per_s or 0) >= th.wake_per_s:
        # its collectives completing (its main thread wakes many times a second as each does; a
        # thread streaming while the main thread hangs in one would not wake it), sending their
        # bytes through its write calls at a transport's rate in most
        # seconds of the window (gloo, NCCL over sockets): back-to-back collectives at work, however
        # many ranks share the CPU. (Bytes read alone may be a file's: a rank its peers wait for,
        # reading, is no rank in their collective.)
        return Reading(Local.BUSY, f"its collectives move {max(s.in_long_per_s or 0, s.out_long_per_s or 0) / 1e6:.1f} "
                                   f"MB/s through its sockets (on {s.cpu_cores or 0:.2f} cores)")
    if v.kind in WAIT_VERDICTS:
        return Reading(Local.WAITING, f"its stack is {v.why}: {v.frame}")
    if v.kind == "backward" and s.state in ("S", "D") and (s.cpu_cores or 0) < th.cpu_active_cores:
        return Reading(Local.WAITING, f"its stack is {v.why} ({v.frame}) and it sleeps: DDP's gradient "
                                      "all_reduce waits for a peer")
    oe = ctx.other_end
    if oe is not None and s.cpu_cores is not None and s.cpu_cores < th.busy_cpu_cores:
        # what the descriptors say beats a frame's name: a select() may wait on a worker or a client
        frame = f" ({v.frame})" if v.known else ""
        if oe.kind == otherend.OUTSIDE:
            return Reading(Local.SERVING, f"waiting for input from outside its job in {oe.call}{frame}: {oe.what}")
        if oe.kind in (otherend.OWN_WORKER, otherend.OWN_THREAD):
            return Reading(Local.WORKER_WAIT, f"its main thread waits in {oe.call}{frame} on {oe.brief}")
        if oe.kind == otherend.PEER:
            return Reading(Local.WAITING, f"its main thread waits in {oe.call}{frame} on {oe.what}")
    if v.kind == "worker_wait":
        return Reading(Local.WORKER_WAIT, f"its stack is {v.why} ({v.frame})")
    if not s.gpu_indexes and (s.cpu_cores or 0) >= th.cpu_active_cores and ctx.progressed_recently:
        return Reading(Local.BUSY, f"on CPU ({s.cpu_cores or 0:.1f} cores) and progressing: {ctx.progress_why}")
    if stackcat.fed_from_outside(v) and ctx.exception_as_it_stopped:
        # the queue a listener thread fills is also where a worker thread's result would come: with
        # an exception logged as the job went still, it may wait for the thread that died of it
        return Reading(Local.QUIET, f"its stack is blocked reading a queue ({v.frame}) and an exception was logged "
                                    "as its job went still: it may wait for a thread of its own that died")
    if v.kind == "request_wait" or (s.wchan or "") in REQUEST_WCHANS:
        return Reading(Local.SERVING, f"its stack is {v.why} ({v.frame})" if v.kind == "request_wait"
                       else f"sleeping in {s.wchan}: waiting for requests")
    if s.d_fraction >= th.io_wait_d_fraction:
        return Reading(Local.IO_WAIT, f"in uninterruptible I/O (wchan {s.wchan})")
    if (g.util or 0) >= th.gpu_active_util_pct and (s.wakes_per_s or 0) >= th.driving_wakes_per_s:
        # kernels keep running and its main thread wakes hundreds of times a second to feed them:
        # a step bound by a slow transport (NCCL over sockets) shows little SM and no tensor work
        return Reading(Local.BUSY, f"driving its GPU: util {g.util or 0:.0f}%, its main thread wakes "
                                   f"{s.wakes_per_s or 0:.0f} times a second")
    if on_cpu and s.rss_change is not None and abs(s.rss_change) >= th.rss_change_bytes:
        # moving data in host memory: a checkpoint's tensors coming off the GPU, a dataset decoded
        return Reading(Local.BUSY, f"on CPU ({s.cpu_cores or 0:.1f} cores), host memory changed by "
                                   f"{s.rss_change / GiB:+.2f} GiB over the last {th.window_s:.0f} s")
    if (s.cpu_cores or 0) >= th.busy_cpu_cores and s.state == "R":
        # the main thread runs; a side thread alone (a dump being written) is not the job working
        return Reading(Local.CPU, f"on CPU ({s.cpu_cores or 0:.1f} cores)")
    if starved(s, th):
        return Reading(Local.CPU, f"runnable {s.r_fraction:.0%} of the time on a host short of CPU "
                                  f"({s.cpu_cores or 0:.2f} cores)")
    return Reading(Local.QUIET, describe_quiet(s, v))


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
    return s.compile_children > 0 or (s.cpu_cores or 0) >= th.compile_cpu_cores or starved(s, th) or \
        (s.wchar_per_s or 0) >= th.io_bytes_per_s or (s.write_per_s or 0) >= th.io_bytes_per_s


def socket_transport(s: ProcSignals, th: Thresholds) -> bool:
    """A rank on a shared GPU read as spinning while its collectives' bytes go through its sockets
    (``over_sockets``): ranks sharing a GPU talk over NCCL's socket transport, and its kernels spin
    between the chunks. ``classify`` reads it busy, ``progress`` credits the bytes."""
    return bool(s.gpu_indexes) and s.gpu_shared and s.gpu.spins(th) and over_sockets(s, th)


def over_sockets(s: ProcSignals, th: Thresholds) -> bool:
    """Bytes through its read or write calls (``rchar``/``wchar`` beyond the disk's counters) at a
    socket transport's rate: at least ``socket_char_per_s`` over the I/O window, moving in half its
    seconds or more (a second counts when a reading moved ``io_bytes_per_s / 4``: 1 MiB/s at 4 Hz),
    under a loader's rate now and over the window, with no burst at a loader's rate in the last
    ``window_s``: a collective whose data moves. A rank spinning in a collective for good moves
    none, and a load's last bursts come at a loader's rate, then stop."""
    steady, now = th.io_window_s / 2, max(s.rchar_per_s or 0, s.read_per_s or 0, s.wchar_per_s or 0, s.write_per_s or 0)
    loading = s.in_quiet_s is not None and s.in_quiet_s <= th.window_s
    return now < th.load_read_per_s and not loading and any(
        counter in ("rchar", "wchar") and th.socket_char_per_s <= (rate or 0) < th.load_read_per_s and active >= steady
        for rate, active, counter in ((s.in_long_per_s, s.in_active_s, s.in_counter),
                                      (s.out_long_per_s, s.out_active_s, s.out_counter)))


def sends_steadily(s: ProcSignals, th: Thresholds) -> bool:
    """Bytes out through its write calls (``wchar`` beyond the disk's ``write_bytes``) at a
    transport's rate over the I/O window, in half its seconds or more, and under a writer's rate
    now: a collective's data going out, step after step."""
    return s.out_counter == "wchar" and th.socket_char_per_s <= (s.out_long_per_s or 0) < th.load_read_per_s \
        and s.out_active_s >= th.io_window_s / 2 and (s.wchar_per_s or 0) < th.load_read_per_s


def paged_in(s: ProcSignals, th: Thresholds) -> bool:
    """Bytes from the disk with next to no read calls, into no memory that grows: pages of files it
    maps coming in as they are first touched (a compiled kernel's library it loads, CUDA's libraries
    as their kernels first run), not a loader's reads. Weights mapped by safetensors come in the
    same way, but fill memory: its RSS (mapped pages count there) or its GPU's."""
    came = (s.read_per_s or 0) * th.window_s
    if (s.read_per_s or 0) <= 4 * (s.rchar_per_s or 0) or s.rss_change is None:
        return False
    # into no memory that grows, or into host memory growing far faster than pages come in: a
    # process allocating (CUDA's first kernels and their workspaces) while its libraries page in
    return s.gpu_mem_rate <= 0 and s.rss_change < came / 4 or s.rss_change > 3 * came


def computing_goes_on(s: ProcSignals, th: Thresholds) -> bool:
    """What a rank running its model shows between two captures: its main thread on the CPU
    (launching kernels, a CPU model's math) or its GPU running them."""
    return ((s.cpu_cores or 0) >= th.busy_cpu_cores and s.state == "R") or (s.gpu.util or 0) >= th.gpu_active_util_pct


def starved(s: ProcSignals, th: Thresholds) -> bool:
    """Its main thread wants the CPU most of the time and gets some: it works, slowed by a host
    short of cores (a thread that waits sleeps; it is not runnable)."""
    return s.r_fraction >= th.runnable_fraction and s.state == "R" and (s.cpu_cores or 0) >= 2 * th.cpu_active_cores


def moves(s: ProcSignals, th: Thresholds, direction: str) -> bool:
    """Bytes moving one way, sustained over the I/O window and mostly that way: a loader reads
    (from the disk or the page cache: ``rchar`` alone moves then), a checkpoint writer writes. Data
    going both ways at once is a rank's own collectives over sockets, not loading or saving."""
    rate = (s.in_long_per_s if direction == "in" else s.out_long_per_s) or 0
    other = (s.out_long_per_s if direction == "in" else s.in_long_per_s) or 0
    active = s.in_active_s if direction == "in" else s.out_active_s
    return rate >= th.moving_bytes_per_s and active >= th.io_sustained_s and rate >= th.moving_ratio * other \
        and not (direction == "in" and reads_stopped(s, th))


def reads_stopped(s: ProcSignals, th: Thresholds) -> bool:
    """The reads over the I/O window are over: no burst at the rate it read at for longer than
    ``window_s`` and than its own pauses between bursts inside the window. A throttled reader's
    sleeps do not end its loading; a rank that read its weights and now trains, or waits, has
    stopped, though the window's mean still carries its bytes."""
    return s.in_quiet_s is not None and s.in_quiet_s > max(th.window_s, s.in_pause_s)


def describe_quiet(s: ProcSignals, v: stackcat.Verdict) -> str:
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
