"""A rank that started the other ranks (a parent that holds a GPU itself, multiprocessing with the
rank as an argument) has them as children. They are its peers, not workers of its own: one of them
spinning a core in a collective, waiting for it, is no worker of it at work.

Seen on matrix-gpu parent-serve_poll-thread_dies-event: rank 0's record said "its workers pid 2711
work" of rank 1, which spun in the broadcast rank 0 never joined. Counted so, a parent blocked for
good in a wait of its own was not judged stuck until the longer host threshold (12 s, not 6 s)."""

from __future__ import annotations

from .builders import ON_CPU, P, logged_cpu_pair

ASLEEP = dict(state="S", wchan="futex_do_wait", cpu_ticks_per_s=0)
EVENT_WAIT = [("threading.py", "Condition.wait"), ("threading.py", "Event.wait"), ("serve.py", "handle")]
COLLECTIVE = [("torch/distributed/distributed_c10d.py", "all_reduce"), ("train.py", "step")]


def _seconds_to_a_hang(worker: dict) -> tuple[float | None, list[str]]:
    """Rank 0 (pid 11) started rank 1 (pid 12) and a worker of its own (pid 13); after a logged
    while, rank 0 blocks in an event forever and rank 1 waits for it, spinning a core in a gloo
    collective; the worker does ``worker``."""
    w = P(13, 11, cmdline=["python", "-c", "worker"], **ASLEEP)  # type: ignore[arg-type]
    node, r0, r1 = logged_cpu_pair(rank1_parent=11, run_id="job7", extra=(w,))
    assert [j["ranks"] for j in node.jobs()] == [{"0": 11, "1": 12}]
    r0.wchar_per_s = r1.wchar_per_s = 0
    for k, v in ASLEEP.items():
        setattr(r0, k, v)
    for k, v in worker.items():
        setattr(w, k, v)
    node.stack(11, EVENT_WAIT)
    node.stack(12, COLLECTIVE)
    t0 = node.t
    while node.t - t0 < 20:
        node.run(0.5)
        if {"host_stall", "nccl_stall"} & set(node.kinds()):
            return node.t - t0, node.kinds()
    return None, node.kinds()


def test_a_parent_blocked_in_its_own_wait_while_its_child_rank_spins_is_stuck():
    took, kinds = _seconds_to_a_hang(ASLEEP)
    assert took is not None and took <= 7.0, (took, kinds)  # hang_stuck_s, not hang_host_s


def test_a_worker_of_its_own_at_work_still_keeps_it_from_being_stuck():
    took, _ = _seconds_to_a_hang(ON_CPU)
    assert took is None or took > 7.0, took
