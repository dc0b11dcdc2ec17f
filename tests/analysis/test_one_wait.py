"""Every rank of a job at the same collective call, none missing from it: a slow collective, not a
rank that holds the others up. Eight tensor-parallel ranks on one GPU over NCCL's socket transport
warming up (hundreds of all-reduces queued, then CUDA's synchronize) spin in the collective for
tens of seconds with nothing else to show: no bytes through read/write calls (the transport sends
with send/recv), no log. Judged hung at `hang_gpu_s` (10 s), that was a critical page of a healthy
server (matrix-gpu mpargv-warmup-none-w8, 14 s into the warm-up). Such a stall is judged after
`hang_all_in_s`; a rank elsewhere, stopped or gone, and the ranks' own record of their collectives
(a flight recorder's finding, NCCL RAS counting a rank behind), still say at once who holds the
others up.

Also here: with many processes time-sliced on one GPU, NVML's per-process samples name a few a
reading, so a window may name none of some that use the GPU all along; and a log line that says
the CUDA graph capture ended ends the capture."""

from __future__ import annotations

import pytest

from hangd.analysis.nodeview import classify_log_lines
from hangd.analysis.thresholds import Thresholds
from hangd.flightrec.reader import Dump, Entry
from hangd.snapshot import FrDump

from .builders import ON_CPU, Node, P, torchrun_env

TH = Thresholds()
NCCL = ["pt_nccl_watchdg", "NCCL ncclProxy"]
SYNC = [("torch/cuda/__init__.py", "synchronize", 1162), ("serve.py", "warmup", 583), ("serve.py", "main", 700)]
ALL_REDUCE = [("torch/distributed/distributed_c10d.py", "all_reduce", 3068), ("train.py", "step", 40),
              ("train.py", "main", 80)]
LATER = [("torch/distributed/distributed_c10d.py", "barrier", 5030), ("train.py", "main", 95)]
ASLEEP = [("threading.py", "wait", 359), ("train.py", "main", 81)]


def _job(world: int, log0: str | None = None, setup_s: float = 12) -> tuple[Node, list[P]]:
    """``world`` ranks (pids 11...) of a torchrun job, all on GPU 0, set up and working on it
    (rank 0 writing to ``log0``)."""
    ranks = [P(11 + r, 10, torchrun_env(r, world), gpu=0, gpu_mem=1200 << 20, look="work", dist_threads=NCCL,
               log=log0 if r == 0 else None, **ON_CPU) for r in range(world)]  # type: ignore[arg-type]
    node = Node([P(10, 1), *ranks])
    node.run(setup_s)
    return node, ranks


def _spin(node: Node, ranks: list[P], stacks: list, seconds: float) -> None:
    """Every rank's GPU spins in the collective from now; 2 s in, each rank's stack shows ``stacks[i]``."""
    for r in ranks:
        r.look = "spin"
    node.run(2)
    for r, frames in zip(ranks, stacks, strict=True):
        node.stack(r.pid, frames, threads=NCCL)
    node.run(seconds - 2)


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("site", [SYNC, ALL_REDUCE], ids=["synchronize", "all_reduce"])
def test_every_rank_at_one_call_is_no_hang_until_its_own_threshold(world: int, site: list):
    node, ranks = _job(world)
    _spin(node, ranks, [site] * world, TH.hang_gpu_s + 8)
    assert node.kinds() == [], node.kinds()
    assert {node.state(r.pid) for r in ranks} == {"busy"}, [node.an._track(r.pid).reason for r in ranks]
    assert "waits at the same call" in node.an._track(ranks[-1].pid).reason, node.an._track(ranks[-1].pid).reason
    node.run(TH.hang_all_in_s - TH.hang_gpu_s - 8 + 2)
    assert node.kinds() == ["nccl_stall"], node.kinds()
    inc = node.an.incidents()[0]
    assert inc.culprit_ranks == [], inc.culprit_ranks  # none is missing: the stacks blame nobody


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("odd", ["later_call", "asleep", "stopped"])
def test_a_rank_outside_the_others_call_is_a_hang_at_the_usual_threshold(world: int, odd: str):
    node, ranks = _job(world)
    culprit = ranks[-1]
    stacks = [ALL_REDUCE] * (world - 1) + [LATER if odd == "later_call" else ASLEEP]
    if odd == "stopped":
        culprit.state, culprit.cpu_ticks_per_s = "T", 0
    elif odd == "asleep":
        culprit.state, culprit.cpu_ticks_per_s, culprit.wchan = "S", 0, "futex_do_wait"
    _spin(node, ranks, stacks, TH.hang_gpu_s + 6)
    assert node.kinds() == ["nccl_stall"], (node.kinds(), [node.an._track(r.pid).reason for r in ranks])
    if world > 2 or odd != "later_call":  # two ranks at two calls: which one diverged is not in the stacks
        assert node.an.incidents()[0].culprit_ranks == [world - 1], node.an.incidents()[0].summary


def test_a_rank_missing_from_the_job_is_no_one_wait():
    """Seven of eight ranks here (WORLD_SIZE 8), all at one call: the eighth is not in it."""
    ranks = [P(11 + r, 10, torchrun_env(r, 8), gpu=0, gpu_mem=1200 << 20, look="work", dist_threads=NCCL,
               **ON_CPU) for r in range(7)]  # type: ignore[arg-type]
    node = Node([P(10, 1), *ranks])
    node.run(12)
    _spin(node, ranks, [ALL_REDUCE] * 7, TH.hang_host_s + 6)
    assert node.kinds() == ["nccl_stall"], node.kinds()


def test_many_ranks_time_sliced_on_one_gpu_keep_their_spin():
    """Eight ranks spinning on one GPU; NVML's per-process samples name one a reading, each for two
    readings in turn (4 s to name them all, as recorded on an H100 with eight): a rank not named in
    the last 2 s still uses the GPU (it reads as spinning, not on CPU)."""
    node, ranks = _job(8)
    for r in ranks:
        r.look = "spin"
    for r, frames in zip(ranks, [ALL_REDUCE] * 8, strict=True):
        node.stack(r.pid, frames, threads=NCCL)
    seen: dict[int, set[str]] = {r.pid: set() for r in ranks}
    for i in range(int(8 * node.hz)):
        node.sm = {ranks[(i // 2) % 8].pid: 99}
        node.tick()
        if i >= node.hz * 4:
            for r in ranks:
                seen[r.pid].add(node.an._track(r.pid).reading.local.value)
    assert all(s == {"spinning"} for s in seen.values()), seen


def test_a_process_never_named_on_a_shared_gpu_does_not_own_its_spin():
    """Two processes on one GPU, NVML's samples name only one, every reading: the other's GPU is idle."""
    node, ranks = _job(2)
    for r in ranks:
        r.look = "spin"
    node.sm = {ranks[0].pid: 99}
    node.run(6)
    assert node.an._track(ranks[1].pid).reading.local.value != "spinning"
    assert node.an._track(ranks[0].pid).reading.local.value == "spinning"


@pytest.mark.parametrize("text, kinds", [
    ("Capturing batches (bs=1): 1\nCapturing batches (bs=2): 2\n", {"graph_capture"}),
    ("Capturing batches (bs=120): 18\nCapture cuda graph end. Time elapsed: 10.17 s. 24 graphs\n",
     {"graph_capture_end"}),
    ("INFO Graph capturing finished in 12 secs, took 0.52 GiB\n", {"graph_capture_end"}),
    # a second capture after the first ended: capturing again
    ("Capture cuda graph end. Time elapsed: 3 s\nCapture cuda graph begin.\n", {"graph_capture_end", "graph_capture"}),
], ids=["capturing", "sglang_end", "vllm_end", "again"])
def test_a_capture_s_end_line_ends_it(text: str, kinds: set[str]):
    assert classify_log_lines(text)[1] == kinds


def test_a_capture_the_log_said_ended_is_not_what_a_wait_keeps():
    """Eight ranks capture (rank 0 logs it), the log says it ended, then they replay the graphs: their
    collectives spin on the shared GPU with nothing else to show. What a first wait keeps is the work
    after the capture, not the capture."""
    node2, ranks = _job(8, log0="/job/log", setup_s=10)
    for _ in range(6):
        node2.write_log("/job/log", "Capturing batches (bs=8 avail_mem=68.9 GB): 4\n")
        ranks[0].wchar_per_s = 200
        node2.run(1)
    assert node2.state(ranks[0].pid) == "graph_capture", node2.an._track(ranks[0].pid).reason
    node2.write_log("/job/log", "Capture cuda graph end. Time elapsed: 10.17 s. 24 graphs\n")
    node2.run(1)
    ranks[0].wchar_per_s = 0
    for r in ranks:
        r.look = "spin"
    node2.run(6)
    assert {node2.state(r.pid) for r in ranks} <= {"busy", "waiting_peer"}, \
        [(node2.state(r.pid), node2.an._track(r.pid).reason) for r in ranks]
    # the rank whose log said so is named, whichever rank's state says it
    assert any("rank 0's log said its CUDA graph capture ended" in node2.an._track(r.pid).reason for r in ranks), \
        [node2.an._track(r.pid).reason for r in ranks]


def _probes(node: Node) -> list[tuple[float, list[int]]]:
    """(tick, pids) of every flight-recorder probe the analysis asks for from now on."""
    asked: list[tuple[float, list[int]]] = []
    take = node.an.take_requests

    def taking():  # type: ignore[no-untyped-def]
        r = take()
        if r.fr_probes:
            asked.append((node.t, sorted(r.fr_probes)))
        return r

    node.an.take_requests = taking  # type: ignore[method-assign]
    return asked


def _warmup_dump(rank: int, world: int, done: int, at: float) -> Dump:
    """A rank's dump in a warm-up: all_reduces #1..#done completed (5 a second, the last just now), the
    rest of a queue of 300 in flight, all issued 30 s ago."""
    entries = [Entry(record_id=s - 1, pg="0", pg_id=0, seq=s, p2p_seq=0, op="nccl:all_reduce",
                     state="completed" if s <= done else "scheduled", completed=s <= done,
                     input_sizes=[[64, 4096]], input_dtypes=["BFloat16"], output_sizes=[[64, 4096]], is_p2p=False,
                     frames=[], time_created_ns=int((at - 30) * 1e9), timeout_ms=None,
                     time_completed_ns=int((at - 0.2 * (done - s)) * 1e9) if s <= done else None)
               for s in range(max(1, done - 40), 301)]
    return Dump(rank=rank, version="2.10", encoding="pickle",
                pg_config={"0": {"pg_id": "0", "desc": "default_pg", "ranks": list(range(world))}},
                pg_status={"0": {"last_enqueued_collective": 300, "last_completed_collective": done}}, entries=entries)


@pytest.mark.parametrize("world", [4, 8])
def test_a_warm_up_longer_than_any_threshold_is_no_hang_while_its_recorders_see_collectives_complete(world: int):
    """Every rank in CUDA's synchronize behind a queue of 300 all_reduces for 60 s, nothing else
    moving: their flight recorders, asked every fr_probe_s once nothing else moves, show the
    completed seqs rising (5 a second). No hang; once they stop rising, one after hang_gpu_s."""
    node, ranks = _job(world)
    for r in ranks:
        r.look = "spin"
    node.run(2)
    for r in ranks:
        node.stack(r.pid, SYNC, threads=NCCL)
    asked = _probes(node)
    done = 0
    for _ in range(int(60 * node.hz)):
        node.tick()
        if asked and asked[-1][0] == node.t:  # the dumps asked for come at the next tick
            done = min(300, done + 25)
            for i, r in enumerate(ranks):
                node.pending_fr.append(FrDump(pid=r.pid, rank=i, format="pickle", path=f"/fr/rank_{i}",
                                              dump=_warmup_dump(i, world, done, node.t)))
    assert node.kinds() == [], [(i.kind, i.summary) for i in node.an.incidents()]
    assert {node.state(r.pid) for r in ranks} <= {"busy"}, [node.an._track(r.pid).reason for r in ranks]
    node.run(TH.hang_gpu_s + 8)  # the dumps stop: the collectives stopped completing
    assert node.kinds() == ["nccl_stall"], node.kinds()


@pytest.mark.parametrize("world", [2, 8])
def test_every_rank_at_one_call_is_probed_once_nothing_else_moves(world: int):
    """The flight recorders are what tell a slow collective from a stuck one: asked of every rank
    while all wait at one call and nothing moved for stack_quiet_s, again every fr_probe_s; never
    of a job that may be capturing CUDA graphs (a dump invalidates a capture)."""
    node, ranks = _job(world)
    for r in ranks:
        r.look = "spin"
    node.run(1)
    for r in ranks:
        node.stack(r.pid, SYNC, threads=NCCL)
    asked = _probes(node)
    node.run(20)
    assert asked, "no flight-recorder probe of a job whose every rank waits"
    assert all(pids == [r.pid for r in ranks] for _, pids in asked), asked
    gaps = [b[0] - a[0] for a, b in zip(asked, asked[1:], strict=False)]
    assert all(g >= TH.fr_probe_s - 0.01 for g in gaps), asked
