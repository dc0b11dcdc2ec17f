"""I/O facts: bytes through any counter, either way (the disk's, or read and write calls: page
cache, pipes, sockets). Mostly one way is loading (in) or writing (out); a transport's steady
bytes are collectives at work. The ``(s, th)`` functions are also read by progress and the engine."""

from __future__ import annotations

from hangd.analysis.facts import RankIn, stack
from hangd.analysis.signals import ProcSignals
from hangd.analysis.thresholds import Thresholds


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


def reads_stopped(s: ProcSignals, th: Thresholds) -> bool:
    """The reads over the I/O window are over: no burst at the rate it read at for longer than
    ``window_s`` and than its own pauses between bursts inside the window. A throttled reader's
    sleeps do not end its loading; a rank that read its weights and now trains, or waits, has
    stopped, though the window's mean still carries its bytes."""
    return s.in_quiet_s is not None and s.in_quiet_s > max(th.window_s, s.in_pause_s)


def moves(s: ProcSignals, th: Thresholds, direction: str) -> bool:
    """Bytes moving one way, sustained over the I/O window and mostly that way: a loader reads
    (from the disk or the page cache: ``rchar`` alone moves then), a checkpoint writer writes. Data
    going both ways at once is a rank's own collectives over sockets, not loading or saving."""
    rate = (s.in_long_per_s if direction == "in" else s.out_long_per_s) or 0
    other = (s.out_long_per_s if direction == "in" else s.in_long_per_s) or 0
    active = s.in_active_s if direction == "in" else s.out_active_s
    return rate >= th.moving_bytes_per_s and active >= th.io_sustained_s and rate >= th.moving_ratio * other \
        and not (direction == "in" and reads_stopped(s, th))


def both_ways(s: ProcSignals, th: Thresholds) -> bool:
    """Bytes through its read and its write calls at once (``rchar`` and ``wchar`` beyond the
    disk's counters), each at ``socket_char_per_s`` or more over the I/O window and moving in half
    its seconds, neither way ``moving_ratio`` times the other: a ring's collectives send what they
    receive, at whatever rate the ranks and the transport make (eight ranks on one GPU move 3-30
    MB/s). A loader reads, a checkpoint writer writes: one way."""
    steady, i, o = th.io_window_s / 2, s.in_long_per_s or 0, s.out_long_per_s or 0
    return s.in_counter == "rchar" and s.out_counter == "wchar" and min(i, o) >= th.socket_char_per_s \
        and max(i, o) < th.moving_ratio * min(i, o) and s.in_active_s >= steady and s.out_active_s >= steady


def moves_now(s: ProcSignals, th: Thresholds) -> bool:
    """Bytes through its read or write calls (``rchar``/``wchar``) at ``socket_char_per_s`` or more
    over the last ``window_s``: collectives that carry data (gloo's sends go out through write
    calls), from their first seconds on, before the I/O window holds enough of them for
    ``over_sockets``; or a file read or written. Either is something done. An idle server's empty
    batches carry next to none."""
    return max(s.rchar_per_s or 0, s.wchar_per_s or 0) >= th.socket_char_per_s


def over_sockets(s: ProcSignals, th: Thresholds) -> bool:
    """Bytes both ways (``both_ways``), or through its read or write calls (``rchar``/``wchar``
    beyond the disk's counters) at a socket transport's rate: at least ``socket_char_per_s`` over the I/O window, moving in half its
    seconds or more (a second counts when a reading moved ``io_bytes_per_s / 4``: 1 MiB/s at 4 Hz),
    under a loader's rate now and over the window, with no burst at a loader's rate in the last
    ``window_s``: a collective whose data moves. A rank spinning in a collective for good moves
    none, and a load's last bursts come at a loader's rate, then stop."""
    steady, now = th.io_window_s / 2, max(s.rchar_per_s or 0, s.read_per_s or 0, s.wchar_per_s or 0, s.write_per_s or 0)
    loading = s.in_quiet_s is not None and s.in_quiet_s <= th.window_s
    if both_ways(s, th):
        return True
    return now < th.load_read_per_s and not loading and any(
        counter in ("rchar", "wchar") and th.socket_char_per_s <= (rate or 0) < th.load_read_per_s and active >= steady
        for rate, active, counter in ((s.in_long_per_s, s.in_active_s, s.in_counter),
                                      (s.out_long_per_s, s.out_active_s, s.out_counter)))


def socket_transport(s: ProcSignals, th: Thresholds) -> bool:
    """A rank on a shared GPU read as spinning while its collectives' bytes go through its sockets
    (``over_sockets``): ranks sharing a GPU talk over NCCL's socket transport, and its kernels spin
    between the chunks. Its reading is busy; ``progress`` credits the bytes."""
    return bool(s.gpu_indexes) and s.gpu_shared and s.gpu.spins(th) and over_sockets(s, th)


def sends_steadily(s: ProcSignals, th: Thresholds) -> bool:
    """Bytes out through its write calls (``wchar`` beyond the disk's ``write_bytes``) at a
    transport's rate over the I/O window, in half its seconds or more, and under a writer's rate
    or into no file (``into_no_file``): a collective's data going out, step after step. Four gloo
    ranks warming up on two cores send 21 MB/s each, above a checkpoint writer's lowest rate."""
    return s.out_counter == "wchar" and th.socket_char_per_s <= (s.out_long_per_s or 0) \
        and s.out_active_s >= th.io_window_s / 2 \
        and (max(s.out_long_per_s or 0, s.wchar_per_s or 0) < th.load_read_per_s or into_no_file(s, th))


def into_no_file(s: ProcSignals, th: Thresholds) -> bool:
    """Its write calls move bytes now that reach no file: the disk's counter (``write_bytes``,
    counted as pages are dirtied) moves ``moving_ratio`` times less than ``wchar``. Sockets and
    pipes, at whatever rate; a file writer's bytes are counted twice."""
    wchar = s.wchar_per_s or 0
    return wchar > 0 and (s.write_per_s or 0) * th.moving_ratio <= wchar


# ------------------------------------------------------------------ facts of the reading table


def filling(r: RankIn) -> bool:
    """Data coming in goes somewhere (GPU memory grows, or it waits on the disk), once it has a GPU
    or is past its imports: importing python packages at start reads too, but into nothing."""
    s, th = r.s, r.th
    return (s.gpu_mem_rate > 0 or s.d_fraction >= th.filling_d_fraction) and (bool(s.gpu_indexes) or s.age_s >= th.startup_cpu_s)


def reads_fast(r: RankIn) -> bool:
    """Reading at a loader's rate now, into memory that fills, and not pages mapped in."""
    s, th = r.s, r.th
    return filling(r) and ((s.read_per_s or 0) >= th.load_read_per_s or (s.rchar_per_s or 0) >= th.load_rchar_per_s) \
        and not paged_in(s, th)


def reads_slowly(r: RankIn) -> bool:
    """A slow reader: bytes from the disk (``read_bytes``) in bursts with sleeps between, long past
    start-up, mostly in, not yet stopped; reads only (a checkpoint writer's bytes go the other way).
    Not while a stack that still describes it shows a wait: the reads are behind it."""
    s, th = r.s, r.th
    return (s.in_long_per_s or 0) >= th.load_read_per_s and s.in_counter == "read_bytes" and \
        s.in_active_s >= th.io_sustained_s and not reads_stopped(s, th) and \
        (s.in_long_per_s or 0) >= th.moving_ratio * (s.out_long_per_s or 0) and \
        (filling(r) or s.age_s >= th.startup_cpu_s or (s.cpu_cores or 0) < th.busy_cpu_cores) and \
        not paged_in(s, th) and not stack.stack_waits(r)  # imports burn CPU


def moves_in(r: RankIn) -> bool:
    """Bytes moving in over the I/O window (``moves``), not a compile's files, not pages mapped
    in, and not behind a wait its stack shows."""
    return moves(r.s, r.th, "in") and not stack.compiles_now(r) and not paged_in(r.s, r.th) and not stack.stack_waits(r)


def moves_out(r: RankIn) -> bool:
    """Bytes moving out over the I/O window (``moves``), not a compile's files."""
    return moves(r.s, r.th, "out") and not stack.compiles_now(r)


def log_loads_from_disk(r: RankIn) -> bool:
    """Its log says it loads weights while it waits on the disk."""
    return "loading" in r.s.log_kinds and r.s.d_fraction > 0


def transport_bytes_under_spin(r: RankIn) -> bool:
    """Its GPU is shared and spins while a socket transport's bytes move (``socket_transport``)."""
    return socket_transport(r.s, r.th)


def sends_at_transport_rate(r: RankIn) -> bool:
    """Bytes go out through its write calls at a transport's rate, steadily (``sends_steadily``)."""
    return sends_steadily(r.s, r.th)


def in_disk_wait(r: RankIn) -> bool:
    """In uninterruptible I/O for much of the window."""
    return r.s.d_fraction >= r.th.io_wait_d_fraction
