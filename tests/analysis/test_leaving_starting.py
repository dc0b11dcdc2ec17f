"""A rank leaving `starting` on bytes it has moved for a while says so at once.

Setting up ends on reads only once they have lasted (`startup_work_s`), and the reads are judged
over the I/O window: that evidence has held already. Making the new state wait the dwell again
kept a loader `starting` until it had stopped reading, and it was never shown `loading`. A rank
that leaves `starting` on a core in use alone still waits the dwell."""

from __future__ import annotations

import pytest

from .builders import Node, P, torchrun_env


def _ticks_from_set_up_to_said(**rank: object) -> tuple[float, str | None]:
    rank = {"wchan": "hrtimer_nanosleep", **rank}
    r = P(11, 10, torchrun_env(0, 1), gpu=0, gpu_mem=520 << 20,
          dist_threads=["pt_nccl_watchdg"], **rank)  # type: ignore[arg-type]
    node = Node([P(10, 1), r])
    set_up_at = None
    for _ in range(int(20 * node.hz)):
        node.tick()
        p = node.an._track(11)
        if set_up_at is None and p.rule not in ("", "setting_up"):
            set_up_at = node.t
        if set_up_at is not None and node.state(11) != "starting":
            return node.t - set_up_at, node.state(11)
    return -1.0, node.state(11)


@pytest.mark.parametrize("rank, said, at_once", [
    (dict(read_per_s=150_000_000, cpu_ticks_per_s=20), "loading", True),  # reads from the page cache
    (dict(read_per_s=45_000_000, cpu_ticks_per_s=5), "loading", True),  # a slow reader
    (dict(state="R", wchan="0", cpu_ticks_per_s=100, vol_per_s=0), "busy", False),  # a core alone: the dwell
], ids=["reader", "slow_reader", "on_the_cpu"])
def test_setting_up_ends_on_what_it_showed(rank: dict, said: str, at_once: bool):
    waited, state = _ticks_from_set_up_to_said(**rank)
    assert state == said
    assert (waited == 0.0) == at_once, waited
