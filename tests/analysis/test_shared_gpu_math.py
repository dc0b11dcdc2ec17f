"""Ranks whose GPU shows little but matrix math: eight ranks time-sliced on one GPU replay CUDA graphs
(Linear layers and an all-reduce each), queue hundreds of replays and sit for seconds in one
``torch.cuda.synchronize()``. NVML reads util 100% at SM 2%, like a kernel spinning in a collective,
and nothing on the host moves. The tensor cores say which it is: they run only matrix math, which a
spinning kernel never does (0.07-0.16% replaying, at most 0.016% with every rank spinning)."""

from __future__ import annotations

import pytest

from .builders import Node, P, torchrun_env

SYNC = [("torch/cuda/__init__.py", "synchronize"), ("server.py", "decode_loop")]
WAIT = [("torch/distributed/distributed_c10d.py", "wait"), ("server.py", "decode_loop")]


def _job(world: int, gpus: int, look: str, spins_cpu: bool, frames: list[tuple[str, str]]) -> Node:
    # a rank that synchronizes spins a core (state R); one built with blocking sync sleeps in a futex
    how = dict(state="R", wchan="0", cpu_ticks_per_s=100) if spins_cpu else \
        dict(state="S", wchan="futex_do_wait", cpu_ticks_per_s=0, vol_per_s=1)
    node = Node([P(10, 1, cmdline=["python", "launch.py"]),
                 *(P(11 + r, 10, torchrun_env(r, world), gpu=r % gpus, gpu_mem=2 << 30, look=look, **how) for r in range(world))])
    for r in range(world):
        node.stack(11 + r, frames)
    return node


def _run(node: Node, world: int, seconds: int, every: int = 5, frames: list[tuple[str, str]] = SYNC) -> None:
    for i in range(seconds):
        if i % every == 0:  # the stack hangd asks for shows the same frame each time
            for r in range(world):
                node.stack(11 + r, frames)
        node.run(1)


CASES = [(2, 2, True, SYNC), (4, 1, True, SYNC), (8, 1, True, SYNC), (8, 1, False, SYNC), (8, 8, True, SYNC),
         (4, 1, False, WAIT)]
IDS = ["2_ranks_2_gpus", "4_ranks_one_gpu", "8_ranks_one_gpu", "8_ranks_blocking_sync", "8_ranks_8_gpus",
       "4_ranks_in_work_wait"]


@pytest.mark.parametrize("world, gpus, spins_cpu, frames", CASES, ids=IDS)
def test_ranks_whose_gpu_runs_matrix_math_are_busy_however_little(world, gpus, spins_cpu, frames):
    node = _job(world, gpus, "replay_shared", spins_cpu, frames)
    _run(node, world, 40, frames=frames)
    assert node.kinds() == [], [(i.kind, i.summary) for i in node.an.incidents()]
    for r in range(world):
        assert node.state(11 + r) == "busy", next(p["reason"] for p in node.an.processes() if p["pid"] == 11 + r)
    reason = next(p["reason"] for p in node.an.processes() if p["pid"] == 11)
    assert "tensor 0.1%" in reason, reason


@pytest.mark.parametrize("world, gpus, spins_cpu, frames", CASES, ids=IDS)
def test_the_same_ranks_spinning_with_no_math_are_paged(world, gpus, spins_cpu, frames):
    node = _job(world, gpus, "replay_shared", spins_cpu, frames)
    _run(node, world, 10, frames=frames)
    for r in range(world):
        node.procs[11 + r].look = "spin_shared"
    hung_at = node.t
    _run(node, world, 35, frames=frames)
    assert node.kinds() and node.kinds()[0] in ("nccl_stall", "host_stall"), node.kinds()
    opened = node.an.incidents()[0].opened_at
    # every rank waits at the same call, none missing from it: paged once that has lasted longer
    # than a slow collective takes (hang_all_in_s), not never
    assert opened - hung_at <= node.an.th.hang_all_in_s + 1, opened - hung_at
    assert len(node.kinds()) == 1, node.kinds()
