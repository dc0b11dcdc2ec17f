"""When a GPU rank's setting up ends: at the first evidence of its own work, whatever its age.

Rows taken from the readings of recorded NCCL ranks on one H200 (matrix-gpu, h200x2-hf2): a rank
importing torch, then holding a CUDA context (about 520 MiB), then with torch.distributed's threads
up. With its process group up and nothing more on its GPU than it held then, no NCCL communicator
exists yet: a collective cannot hold it spinning, and a core of CPU is its own code (DDP building
its model, its first step's lazy imports): it works. Once a communicator came in (NCCL's buffers
and kernels: +660-740 MiB at once), a core of CPU may be a spin in NCCL's init or a barrier (the
rank waits for a peer that still loads): the CPU alone proves nothing, and it stays starting.
"""

from __future__ import annotations

import pytest

from .builders import Node, P, torchrun_env

MiB = 1 << 20
NCCL_THREADS = ["pt_nccl_heartbt", "pt_nccl_watchdg"]
ON_CPU = dict(state="R", wchan="0", cpu_ticks_per_s=100)  # one core, runnable

# (seconds, what the rank shows then, started at the end?)
IMPORTS = (4.0, dict(gpu=None, dist_threads=None), False)  # import torch: a core, no GPU yet
CONTEXT = (3.0, dict(gpu=0, gpu_mem=518 * MiB), False)  # set_device, the rendezvous: a context alone
ROWS = {
    # matrix-gpu parent-checkpoint-none rank 0, 5-8 s: a core for 4 s with its group up, 520 MiB held
    "group_up_bare_gpu_on_cpu": [IMPORTS, CONTEXT,
                                 (0.25, dict(gpu_mem=520 * MiB, dist_threads=NCCL_THREADS), True)],
    # the same with the group's threads seen the moment its context came (it held nothing before):
    # the memory must hold still for startup_work_s first
    "group_up_with_its_context": [IMPORTS,
                                  (1.75, dict(gpu=0, gpu_mem=520 * MiB, dist_threads=NCCL_THREADS), False),
                                  (0.5, dict(), True)],
    # h200x2-hf2 slow_load rank 0, 15-21 s: group and context at once, 1266 MiB a tick later (its
    # barrier's communicator), a core for 6 s while its peer loads: it waits, the CPU says nothing
    "communicator_came_in": [IMPORTS,
                             (0.25, dict(gpu=0, gpu_mem=526 * MiB, dist_threads=NCCL_THREADS), False),
                             (6.0, dict(gpu_mem=1266 * MiB), False)],
}


@pytest.mark.parametrize("phases", list(ROWS.values()), ids=list(ROWS))
def test_a_gpu_rank_on_the_cpu_with_its_group_up_and_no_communicator_has_set_up(phases: list):
    rank = P(11, 10, torchrun_env(0, 2), start=999.0, **ON_CPU)
    node = Node([P(10, 1), rank, P(12, 10, torchrun_env(1, 2), wchan="hrtimer_nanosleep")])
    for seconds, shows, started in phases:
        for k, v in shows.items():
            setattr(rank, k, v)
        node.run(seconds)
        assert node.an.tracks[11].started is started, (shows, node.t)
    if phases[-1][2]:
        node.run(node.an.th.dwell_s + 0.25)
        assert node.state(11) == "busy"
    else:
        assert node.state(11) == "starting"
