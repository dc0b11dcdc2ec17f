"""A rank blocked for good on a thread of its own is stuck whether its stack or its descriptors say
so. Seen on matrix-gpu torchrun-compile-stuck-socket_recv: rank 1's main thread sat in recvfrom
on a socketpair only it held (its thread would write it; it never did), with no stack of that
wait, while rank 0 spun in the all_reduce: the hang was judged at the GPU threshold (10 s), not at
the stuck-wait one (6 s) a stack of the wait would have given."""

from __future__ import annotations

from hangd.snapshot import FdWait

from .builders import logged_cpu_pair

COLLECTIVE = [("torch/distributed/distributed_c10d.py", "all_reduce"), ("train.py", "step")]
OWN_SOCKETPAIR = dict(state="S", wchan="unix_stream_read_generic", wait_syscall="recvfrom",
                      fd_waits=[FdWait(fd=3, kind="unix", holders=[12], remote_here=True)])


def _seconds_to_a_hang(its_thread_cpu: int) -> float | None:
    node, r0, r1 = logged_cpu_pair()
    r0.wchar_per_s = r1.wchar_per_s = 0
    r0.state, r0.wchan, r0.cpu_ticks_per_s = "S", "futex_do_wait", 0  # gloo's wait in the all_reduce
    node.stack(11, COLLECTIVE)
    for k, v in OWN_SOCKETPAIR.items():
        setattr(r1, k, v)
    r1.cpu_ticks_per_s = its_thread_cpu
    t0 = node.t
    while node.t - t0 < 20:
        node.run(0.5)
        if {"host_stall", "nccl_stall"} & set(node.kinds()):
            return node.t - t0
    return None


def test_a_rank_blocked_on_its_own_socketpair_with_its_peer_waiting_is_a_hang_at_the_stuck_threshold():
    took = _seconds_to_a_hang(its_thread_cpu=0)
    assert took is not None and took <= 7.5, took


def test_a_rank_whose_own_thread_works_is_not_stuck():
    # a third of a core: its main thread still reads as waiting on its socketpair (a rank on more
    # than half a core is read by its CPU), and the process's CPU is its thread's
    took = _seconds_to_a_hang(its_thread_cpu=30)
    assert took is None or took > 7.5, took
