"""Where the classifier draws its lines: ``Thresholds``, every one with the measurement or the
reasoning behind it, and the byte units they are written in.
"""

from __future__ import annotations

from dataclasses import dataclass

from hangd.incidents import REFRESH_S, TIMELINE_KEPT

MiB = 1024 * 1024
GiB = 1024 * MiB


@dataclass(frozen=True)
class Thresholds:
    """Where the classifier draws its lines (see docs/operator-guide.md for the reasoning)."""

    window_s: float = 2.0  # rates and GPU readings are averaged over this window
    # GPU work: tensor or DRAM activity (GPM %), or NVLink traffic. A spinning NCCL kernel shows
    # 100% util at ~18% SM, 0% tensor, 0% DRAM, no NVLink (FIELD-NOTES).
    # Light work counts too: token-by-token generation of a small tensor-parallel model shows SM
    # 2-7%, tensor 0.1-0.3%, DRAM ~2% and NVLink 65-290 MB/s, where a spinning kernel shows 0 and 0.
    # Two ranks sharing one GPU, their collectives over sockets, generate at SM 2%, tensor 0.02-0.1%
    # and DRAM 0.5-0.9% with util at 99%: busy, not spinning (seen on an H200). Over the recorded
    # GPU traces, 2-s windows at util >= 90% and SM < 40% show DRAM 0 for hung ranks (90th
    # percentile of 3,476; more only as a wait begins) and never less than 0.54% for busy ones.
    # Tensor cores run only matrix math, which a kernel spinning on a flag never does: over 9,691
    # such readings of hung GPUs tensor is 0 in 98.5%, at most 0.016% but as a wait begins (eight
    # ranks on one GPU, all spinning), where eight ranks replaying CUDA graphs of Linear layers on
    # one H100, time-sliced, show 0.07-0.16% with DRAM 0.21-0.32%: busy.
    gpu_tensor_pct: float = 0.05
    gpu_dram_pct: float = 0.3
    gpu_nvlink_mibs: float = 20.0
    gpu_util_mem_pct: float = 3.0  # fallback without GPM: memory-controller activity
    spin_util_pct: float = 90.0
    spin_sm_max_pct: float = 40.0
    gpu_active_util_pct: float = 10.0
    # host-side progress
    io_bytes_per_s: float = 1 * MiB
    io_window_s: float = 6.0  # disk I/O is judged over this longer window: a slow reader reads in bursts
    io_sustained_s: int = 2  # ... and counts as progress when it moved in this many distinct seconds of it
    io_sustain_s: float = 3.0  # read/write syscalls must go on this long to count (a dump being written is shorter)
    wake_window_s: float = 3.0  # main-thread wake-ups are counted over this window
    wake_per_s: float = 3.0  # a rank blocked in a collective whose main thread wakes this often: they complete
    # GPU kernels running (util above gpu_active_util_pct) while the main thread wakes this often: it
    # drives the GPU (DDP over NCCL's socket transport on one H200: util 20-47%, SM 0-1%, ~350 wakes/s;
    # compiled steps with a 50 ms sleep between: util 11%, ~20 wakes/s). Over the recordings, busy ranks at
    # GPU util >= 10% asleep on the CPU wake 19/s and more; idle ones 0/s, or 86/s and more (a poll loop)
    driving_wakes_per_s: float = 15.0
    load_read_per_s: float = 20 * MiB
    # bytes moving one way over io_window_s, whichever counter: a throttled page-cache reader (8 MB,
    # then 60 ms asleep) reads ~130 MB/s on rchar alone; a checkpoint writer 78 MB/s (FIELD-NOTES)
    # (imports read less: transformers' read 10-15 MB/s on rchar for ~10 s, on H200 hosts)
    moving_bytes_per_s: float = 40 * MiB
    moving_ratio: float = 4.0  # ... at least this many times more than the other way
    load_rchar_per_s: float = 200 * MiB
    socket_char_per_s: float = 256 * 1024
    rss_change_bytes: float = 256 * MiB
    gpu_mem_change_bytes: float = 64 * MiB
    capture_growth_per_s: float = 200 * MiB  # sustained over two windows; allocator warm-up is shorter
    busy_cpu_cores: float = 0.5
    # a server's poll loop that wakes often (its queue's timeout) stays under this: its broadcast's
    # spin takes half a core with eight ranks on one GPU; work of its own in one thread takes a core
    poll_loop_cores: float = 0.9
    # a main thread runnable (state R) in this share of the window's readings wants the CPU and
    # works, whatever it gets: on a host short of cores (2 cores at load 15) a training step gets
    # 0.15 of one
    runnable_fraction: float = 0.6
    cpu_active_cores: float = 0.02  # below this a process does nothing on the CPU
    compile_cpu_cores: float = 0.3  # ... with compiler processes under it: compiling
    compile_worker_cores: float = 0.1  # a compile worker counts while it uses this much
    filling_d_fraction: float = 0.25  # share of readings in disk wait that says data is being loaded
    io_wait_d_fraction: float = 0.5  # ... that says it is stuck in I/O when nothing moves
    saturated_util_pct: float = 98.0  # a saturated GPU (util and SM): work, not graph capture
    saturated_sm_pct: float = 75.0
    gpu_seen_s: float = 10.0  # a process's GPU memory counts while NVML listed it this recently
    # decisions
    progress_recent_s: float = 5.0  # a rank progressed "recently" within this
    # a peer that progressed this long after a rank's wait began is what the rank waits for: its wait
    # is not held as a hang's first moment when that peer stops
    peer_worked_s: float = 1.0
    hang_gpu_s: float = 10.0  # no progress while a rank spins in a GPU collective
    hang_host_s: float = 12.0  # no progress while stacks show ranks blocked host-side
    # ... while every rank of the job waits at the same collective call, none missing from it: a
    # slow collective (many ranks over a socket transport, a queue of hundreds) looks so, and names
    # no rank that holds the others up; a flight recorder's finding of the stall does not wait
    hang_all_in_s: float = 30.0
    hang_io_s: float = 30.0  # uninterruptible sleep with no I/O
    # a rank stopped by a signal (state T) runs no code until someone continues it: nothing moving
    # this long with one stopped is a hang (a debugger's stop is state t, not T)
    hang_stopped_s: float = 4.0
    # ... and with ranks waiting since an exception appeared in the job's logs as it went still
    # (a worker thread that died): what they wait for will not come
    hang_after_exception_s: float = 4.0
    # ... and with ranks waiting in a collective for one blocked in a wait of its own (an event, a
    # lock, a queue, its own thread or worker) whose main thread has not woken since its stack showed
    # that wait: a wait with no timeout that nothing of the job moves to end
    hang_stuck_s: float = 6.0
    startup_max_s: float = 600.0  # a process is "starting" at most this long
    startup_cpu_s: float = 20.0  # CPU work without a GPU counts as setup (imports) this long
    # work on the CPU or moving bytes, once its CUDA context exists, that lasts this long ends its
    # setup (a blip finishing CUDA's own init does not)
    startup_work_s: float = 2.0
    startup_imports_s: float = 8.0  # without a CUDA context, reading this young is importing (torch: 3-5 s)
    startup_quiet_s: float = 10.0  # a process asleep this long after its setup is idle, not starting
    startup_quiet_cpu_cores: float = 0.05  # ... "asleep": below this much CPU
    started_gpu_mem_bytes: float = 1.5 * GiB  # more than a CUDA context: the job has set up
    # GPU memory a rank gains past this after its process group came up is a communicator (NCCL's
    # buffers and kernels: hundreds of MB) or its model, not its context's own churn
    startup_gpu_mem_grew_bytes: float = 64 * MiB
    dwell_s: float = 2.0  # a new state must hold this long before it is reported
    # ... and "idle" longer: a rank that just went quiet is idle, or stuck in a wait its stack (taken
    # after stack_quiet_s) will show; say which once the stack is in. The same for busy on a core
    # alone after loading, compiling or a wait: a loop that never ends burns a core too
    idle_dwell_s: float = 5.0
    stack_quiet_s: float = 3.0  # capture stacks of a job quiet this long
    stack_repeat_s: float = 5.0  # ... and again this much later, to show it is stuck
    straggler_wait_s: float = 10.0  # seconds peers waited on one rank within straggler_window_s
    straggler_window_s: float = 60.0
    rank_exit_grace_s: float = 10.0
    # ... unless every rank left waits for a peer (a collective, the store) that long since the exit:
    # NCCL and the store wait for the one that left until their timeout (a gloo collective fails
    # within a second when its peer's socket closes)
    rank_exit_wait_s: float = 4.0
    orphan_gpu_s: float = 5.0
    unattributed_gpu_bytes: float = 2 * GiB
    unattributed_gpu_s: float = 30.0
    unattributed_base_bytes: float = 1 * GiB  # GPU memory in use with no process: up to this is the driver's
    # memory beyond the driver's that no listed process holds, over most of the window: a process
    # hangd cannot see is on the GPU (a CUDA context alone is about 520 MiB on an H200)
    unseen_gpu_bytes: float = 512 * MiB
    unseen_window_s: float = 10.0  # ... over more than half the readings of this window
    # a process holding no more than this on its GPU holds its CUDA context (518-520 MiB on an H200)
    # and no NCCL communicator: the smallest seen (two ranks over sockets) took one to 630 MiB, a
    # DDP job's to 1182 MiB
    context_gpu_bytes: float = 576 * MiB
    # a server caught this many captures in a row at exactly one place outside its wait for
    # requests stays there (one or two are its loop between two polls: a broadcast, a step)
    between_captures: int = 3
    verdict_fresh_s: float = 60.0  # a stack verdict describes its process at most this long
    verdict_known_s: float = 300.0  # the last known kind of wait, for telling a cycling wait from a stuck one
    stack_recapture_s: float = 300.0  # a quiet job's stacks are taken again this often
    cpu_stack_every_s: float = 30.0  # ... and a rank's on the CPU with no GPU work and no fresh stack (what it does)
    # one rank of a job busy on its GPUs has its stack taken this often, in turn (a phase such as
    # CUDA graph capture shows only there): one py-spy dump (10-16 ms of CPU) per job per period
    busy_stack_every_s: float = 4.0
    # a phase one rank's stack or log names is its job's for this long: its ranks capture together
    job_phase_s: float = 8.0
    fr_rerequest_s: float = 60.0  # flight-recorder dumps of a hung job are asked for again this often
    # a job where some ranks wait in a collective and none works (an idle server broadcasting empty
    # batches, or a hang in the making): its dumps are asked for this often, for whether its
    # collectives still complete; a completion seen in a dump counts this long (past the next dump)
    fr_probe_s: float = 5.0
    fr_findings_kept: int = 64  # cross-rank findings kept per job (a server probed all day makes many)
    collectives_seen_s: float = 12.0
    log_recent_s: float = 3.0  # a phase named by a log line holds this long
    exception_lookback_s: float = 300.0  # an exception in a log this long before a hang may be its cause
    straggler_quiet_after_s: float = 60.0  # a straggler incident resolves after this long without waits
    serve_job_quiet_s: float = 60.0  # history of a job kept this long after its last process went
    # a process that exited stays listed (state "gone") this long, then the analysis forgets it
    # (the setting of the same name)
    gone_after_s: float = 120.0
    max_incidents_in_memory: int = 500  # resolved incidents kept in memory (the store keeps all)
    max_findings_in_memory: int = 500
    # a job that spans nodes: another node whose hangd last reported longer ago than this has
    # stopped reporting; its ranks are named as unknown, never blamed. Heartbeats come every 2 s
    # (heartbeat_s): 15 s is seven missed in a row (chosen, not measured). The one default: the
    # setting, the store and the job views take it from here.
    node_stale_s: float = 15.0
    max_changes_in_memory: int = 2000
    # incidents: an open incident's ticking figures ("has waited 41 s") change every tick and
    # reach the store and watchers this often, not on every tick (what a person reads changing
    # goes out at once); an incident's timeline keeps its first entry and this many newest
    # (chosen, not measured)
    incident_refresh_s: float = REFRESH_S
    timeline_kept: int = TIMELINE_KEPT
    # stragglers: a wait is a pattern when at least this many earlier waits of the same ranks fell in
    # straggler_window_s (one earlier blip is not one), and is blamed only while the ranks that waited
    # on it worked in at least this many distinct seconds between its first and its last wait (they
    # do get through; the recorded straggler traces, tests/data/traces, show it every step)
    straggler_recurring: int = 2
    straggler_progressed_secs: int = 3
    # memory: readings kept per process, 120: the widest window (io_window_s) at 4 readings a second
    # with room to spare; what needs older readings is remembered instead (600 readings of every
    # watched process were most of a long-running daemon's memory). GPU readings per GPU: 1200.
    history_readings: int = 120
    gpu_history_readings: int = 1200
    # bounds on what is kept, chosen, not measured: stack captures per process (a stack that stands
    # still between two captures is the evidence), exception lines per log, log lines an incident quotes
    stacks_kept: int = 6
    exceptions_kept: int = 8
    # a log's last line without its newline, the file unchanged this long: judged as it stands (a
    # writer that died or hangs mid-line, a traceback whose last bytes never came)
    log_unfinished_line_s: float = 2.0
    log_lines_quoted: int = 20
    # process trees: how far up a process's ancestors are walked for its launcher and its rank, and
    # for the rank a compile worker (ptxas, cc1, inductor's workers) works for; torchrun puts its
    # ranks directly under it, so 4 leaves room for a wrapper script or two (chosen, not measured)
    ancestor_depth: int = 4
    compile_worker_depth: int = 4
