"""Two ranks sharing one GPU talk over NCCL's socket transport (each its own NCCL_HOSTID): each
collective's data goes through their read calls (``rchar`` moves, the disk's ``read_bytes`` does
not), a few MB/s, and the kernels spin between the chunks. NVML reads that as a GPU spinning in a
collective, and both ranks share that reading. While the bytes come steadily at a transport's
rate, the collectives complete: the ranks train, and no hang is declared.

Seen on matrix-gpu mpargv-load_slow-none: after their loads, both ranks trained for 10 s, read 3-5
MB/s each, and were held `loading`, then said to wait for each other."""

from __future__ import annotations

import pytest

from .builders import ON_CPU, Node, P, torchrun_env

MB = 1_000_000


def _two_on_one_gpu(sock_per_s: int, shared: bool = True, seconds: float = 8.0, read_per_s: int = 0) -> Node:
    """Two ranks, set up and working on the GPU (one GPU, or one each), then both read as
    spinning while ``sock_per_s`` bytes a second come through their socket reads (and
    ``read_per_s`` from the disk)."""
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, gpu_mem=1200 << 20, look="work", dist_threads=["pt_nccl_watchdg"],
           **ON_CPU)  # type: ignore[arg-type]
    r1 = P(12, 10, torchrun_env(1, 2), gpu=0 if shared else 1, gpu_mem=1200 << 20, look="work",
           dist_threads=["pt_nccl_watchdg"], **ON_CPU)  # type: ignore[arg-type]
    node = Node([P(10, 1), r0, r1])
    node.run(12)
    for r in (r0, r1):
        r.look, r.sock_per_s, r.read_per_s = "spin", sock_per_s, read_per_s
    node.run(seconds)
    return node


def test_ranks_whose_collectives_move_data_over_sockets_on_a_shared_gpu_are_busy():
    node = _two_on_one_gpu(4 * MB)
    assert [node.state(p) for p in (11, 12)] == ["busy", "busy"]
    assert "through its sockets" in node.an._track(11).reason, node.an._track(11).reason


@pytest.mark.parametrize("sock_per_s, read_per_s, shared", [
    (0, 0, True),  # no bytes: a spin in a collective that does not move
    (100_000, 0, True),  # a trickle, below a transport's rate
    (4 * MB, 0, False),  # a GPU each: their spins are their own (the bytes are something else)
    (0, 4 * MB, True),  # bytes from the disk (a thread reading a file): no transport's
], ids=["no_bytes", "a_trickle", "a_gpu_each", "from_the_disk"])
def test_a_spin_with_no_transport_s_bytes_is_a_wait(sock_per_s: int, read_per_s: int, shared: bool):
    node = _two_on_one_gpu(sock_per_s, shared, read_per_s=read_per_s)
    assert "through its sockets" not in node.an._track(11).reason, node.an._track(11).reason


def test_the_tail_of_a_load_is_no_transport():
    """A loader's last bursts (60 MB/s, through the page cache: its read calls alone) as its GPU
    starts to spin in the barrier after the load: they come at a loader's rate and stop; they are
    not a collective's. Read each tick, the rank is not said to move its collectives' data while it
    reads at that rate, nor after."""
    node = _two_on_one_gpu(60 * MB, seconds=0.0)
    seen = []
    for _ in range(int(2 * node.hz)):  # the bursts go on 2 s
        node.run(1 / node.hz)
        seen.append(node.an._track(11).reading.why)
    for p in (11, 12):
        node.procs[p].sock_per_s = 0
    for _ in range(int(3 * node.hz)):
        node.run(1 / node.hz)
        seen.append(node.an._track(11).reading.why)
    assert not [w for w in seen if "through its sockets" in w], seen


def test_a_long_run_over_sockets_with_a_pause_is_no_hang_and_a_stop_is_one_after_the_gpu_threshold():
    """No log, no disk: the bytes through the sockets are all that moves. 30 s of them and a 3 s
    pause (a step on the CPU) is no hang; once they stop for good, the spin is a wait, and the hang
    is judged after `hang_gpu_s` (10 s) of it, not at once."""
    node = _two_on_one_gpu(4 * MB, seconds=30.0)
    for p in (11, 12):
        node.procs[p].sock_per_s = 0
    node.run(3)
    for p in (11, 12):
        node.procs[p].sock_per_s = 4 * MB
    node.run(10)
    assert not node.kinds(), node.kinds()
    for p in (11, 12):
        node.procs[p].sock_per_s = 0
    stopped = node.t
    while node.t - stopped < 30 and not node.kinds():
        node.run(0.5)
    assert node.kinds() == ["nccl_stall"], node.kinds()
    assert node.t - stopped >= 10.0, node.t - stopped


@pytest.mark.parametrize("in_per_s, out_per_s, busy", [
    (30 * MB, 30 * MB, True),  # a ring's all-reduce among eight ranks on one GPU: above a loader's rate
    (3 * MB, 2 * MB, True),
    (30 * MB, 0, False),  # one way at a loader's rate: reads (the tail of a load)
    (30 * MB, 2 * MB, False),  # mostly one way: a loader that also logs
], ids=["both_ways_fast", "both_ways_slow", "one_way_fast", "mostly_one_way"])
def test_bytes_both_ways_at_any_rate_are_a_transport(in_per_s: int, out_per_s: int, busy: bool):
    # a collective's data goes both ways through the ranks' sockets at the rate the ranks and the
    # transport make; a loader's goes one way. Read over 8 s, each way steady
    node = _two_on_one_gpu(0, seconds=0.0)
    for p in (11, 12):
        node.procs[p].sock_per_s, node.procs[p].wchar_per_s = in_per_s, out_per_s
    node.run(8)
    said = "through its sockets" in node.an._track(11).reading.why
    assert said == busy, node.an._track(11).reading.why
