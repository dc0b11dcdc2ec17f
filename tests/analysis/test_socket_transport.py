"""Two ranks sharing one GPU talk over NCCL's socket transport (each its own NCCL_HOSTID): each
collective's data goes through their read calls, a few MB/s, and the kernels spin between the
chunks. NVML reads that as a GPU spinning in a collective, and both ranks share that reading. While
the bytes come steadily at a transport's rate, the collectives complete: the ranks train.

Seen on matrix-gpu mpargv-load_slow-none: after their loads, both ranks trained for 10 s, read 3-5
MB/s each, and were held `loading`, then said to wait for each other."""

from __future__ import annotations

import pytest

from .builders import Node, P, torchrun_env

ON_CPU = dict(state="R", wchan="0", cpu_ticks_per_s=95)
MB = 1_000_000


def _two_on_one_gpu(read_per_s: int, shared: bool = True, seconds: float = 8.0) -> Node:
    """Two ranks, set up and working on the GPU (one GPU, or one each), then both read as
    spinning while each reads ``read_per_s`` bytes a second through its calls."""
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, gpu_mem=1200 << 20, look="work", dist_threads=["pt_nccl_watchdg"],
           **ON_CPU)  # type: ignore[arg-type]
    r1 = P(12, 10, torchrun_env(1, 2), gpu=0 if shared else 1, gpu_mem=1200 << 20, look="work",
           dist_threads=["pt_nccl_watchdg"], **ON_CPU)  # type: ignore[arg-type]
    node = Node([P(10, 1), r0, r1])
    node.run(12)
    for r in (r0, r1):
        r.look, r.read_per_s = "spin", read_per_s
    node.run(seconds)
    return node


def test_ranks_whose_collectives_move_data_over_sockets_on_a_shared_gpu_are_busy():
    node = _two_on_one_gpu(4 * MB)
    assert [node.state(p) for p in (11, 12)] == ["busy", "busy"]
    assert "through its sockets" in node.an._track(11).reason, node.an._track(11).reason


@pytest.mark.parametrize("read_per_s, shared", [
    (0, True),  # no bytes: a spin in a collective that does not move
    (100_000, True),  # a trickle, below a transport's rate
    (4 * MB, False),  # a GPU each: their spins are their own (the bytes are something else)
], ids=["no_bytes", "a_trickle", "a_gpu_each"])
def test_a_spin_with_no_transport_s_bytes_is_a_wait(read_per_s: int, shared: bool):
    node = _two_on_one_gpu(read_per_s, shared)
    assert "through its sockets" not in node.an._track(11).reason, node.an._track(11).reason


def test_the_tail_of_a_load_is_no_transport():
    """A loader's last bursts (60 MB/s) as its GPU starts to spin in the barrier after the load:
    the bytes come at a loader's rate and stop; they are not a collective's. Read each tick, the
    rank is not said to move its collectives' data while it reads at that rate, nor once it stops."""
    node = _two_on_one_gpu(60 * MB, seconds=0.0)
    seen = []
    for _ in range(int(2 * node.hz)):  # the bursts go on 2 s
        node.run(1 / node.hz)
        seen.append(node.an._track(11).reading.why)
    for p in (11, 12):
        node.procs[p].read_per_s = 0
    for _ in range(int(3 * node.hz)):
        node.run(1 / node.hz)
        seen.append(node.an._track(11).reading.why)
    assert not [w for w in seen if "through its sockets" in w], seen


def test_a_hang_on_a_shared_gpu_is_found_when_the_bytes_stop():
    node = _two_on_one_gpu(4 * MB)
    for p in (11, 12):
        node.procs[p].read_per_s = 0
    node.procs[12].state, node.procs[12].wchan, node.procs[12].cpu_ticks_per_s = "S", "futex_do_wait", 0
    node.run(25)
    assert {"nccl_stall", "host_stall"} & set(node.kinds()), node.kinds()
