"""Which kind a hang is: GPU-side (``nccl_stall``) or host-side (``host_stall``), as
docs/operator-guide.md defines them. A rank blocked in a collective of an NCCL process group is an
NCCL stall while kernels run on its GPU, whether or not they read as a spin (ranks time-sliced on
one GPU). With its GPU idle the collective never reached it (a broadcast over a CPU group of a
process that also runs NCCL, a communicator still being set up): GPUs idle, ranks blocked
host-side, a host stall. The peer it waits for is blocked in its own code either way.

Rows from the recordings: h200x1-live h1_sgl1_silent_draft (rank 1 in a gloo
``broadcast_object_list`` of an SGLang-shaped server that also runs NCCL, GPU util 0 throughout),
matrix-gpu (ranks spinning in an all-reduce), h100x1-live-wide (eight ranks on one GPU, util 100%).
"""

from __future__ import annotations

import pytest

from hangd.snapshot import GpuSample

from . import builders
from .builders import Node, P, torchrun_env

BCAST = [("torch/distributed/distributed_c10d.py", "broadcast"),
         ("torch/distributed/distributed_c10d.py", "broadcast_object_list"), ("server.py", "scheduler")]
OWN_WAIT = [("threading.py", "wait"), ("server.py", "scheduler")]
NCCL = ["pt_nccl_watchdg", "pt_nccl_heartbt", "pt_gloo_runloop"]
GLOO = ["pt_gloo_runloop"]
# kernels resident and running, neither matrix math nor a spin's low SM: another rank's kernels on
# a GPU it shares
BUSY_NO_MATH = (100, 200_000, {"SM_UTIL": 60.0, "ANY_TENSOR_UTIL": 0.0, "DRAM_BW_UTIL": 0.0,
                               "NVLINK_TOTAL_TX_PER_SEC": 0.0})


@pytest.fixture(autouse=True)
def _busy_look(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(builders.GPU_LOOK, "busy_no_math", BUSY_NO_MATH)


@pytest.mark.parametrize(("world", "look", "threads", "kind"), [
    (2, "idle", NCCL, "host_stall"),  # h1_sgl1_silent_draft: a CPU group's broadcast, GPU idle
    (4, "idle", NCCL, "host_stall"),
    (8, "idle", GLOO, "host_stall"),
    (2, "spin", NCCL, "nccl_stall"),  # the kernel spins: GPU-side
    (8, "spin", GLOO, "nccl_stall"),
    (2, "busy_no_math", NCCL, "nccl_stall"),  # kernels run, no spin read: NCCL's threads say GPU-side
    (8, "busy_no_math", ["NCCL Bootstrap", "pt_gloo_runloop"], "nccl_stall"),
    (4, "busy_no_math", ["ncclProxy"], "nccl_stall"),
    (4, "busy_no_math", GLOO, "host_stall"),  # no NCCL at all: its collective is on the host
])
def test_a_rank_blocked_in_a_collective_is_gpu_side_only_with_kernels_on_its_gpu(world, look, threads, kind):
    ranks = [P(11 + r, 10, torchrun_env(r, world), gpu=0, look="work", dist_threads=threads, vol_per_s=50)
             for r in range(world)]
    node = Node([P(10, 1), *ranks])
    node.run(12)  # serving: every rank works on the shared GPU
    culprit = ranks[0]
    culprit.look, culprit.wchan, culprit.vol_per_s = "idle", "futex_wait_queue", 0
    for r in ranks[1:]:
        r.look, r.wchan, r.vol_per_s = look, "futex_wait_queue", 0
    node.run(1)
    node.stack(culprit.pid, OWN_WAIT)
    for r in ranks[1:]:
        node.stack(r.pid, BCAST)
    node.run(25)
    hangs = [i for i in node.an.incidents() if i.kind in ("host_stall", "nccl_stall")]
    assert [(i.kind, i.culprit_ranks) for i in hangs] == [(kind, [0])], [(i.kind, i.culprit_ranks, i.summary) for i in hangs]


def test_a_gpu_read_idle_has_no_kernel_over_the_window():
    from hangd.analysis.signals import gpu_signals
    from hangd.analysis.thresholds import Thresholds

    th = Thresholds()

    def g(util: int, sm: float) -> GpuSample:
        return GpuSample(index=0, util_gpu=util, util_mem=0, mem_used=0, mem_total=1, power_mw=100_000,
                         gpm={"SM_UTIL": sm, "ANY_TENSOR_UTIL": 0.0, "DRAM_BW_UTIL": 0.0})

    assert gpu_signals([g(0, 0.0)] * 8, th).idle(th)
    assert not gpu_signals([g(0, 0.0)] * 7 + [g(100, 2.0)], th).idle(th)  # one spin in the window
    assert not gpu_signals([g(50, 60.0)] * 8, th).idle(th)
    assert not gpu_signals([], th).idle(th)  # no reading: not known idle
