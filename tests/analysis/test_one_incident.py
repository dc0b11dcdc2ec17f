"""One hang, one incident: what a hung rank does while it still waits (a dump it writes, the
lines its watchdog logs, the libraries it reads to symbolize a stack) is no end of the hang, so
no second incident opens for it; a job that really goes on resolves it."""

from __future__ import annotations

import pytest

from .builders import ON_CPU, Node, P, torchrun_env


def _job(world: int) -> tuple[Node, list[P]]:
    """``world`` ranks, one GPU each, working and logging a line a second; the last is the culprit."""
    ranks = [P(11 + r, 10, torchrun_env(r, world), gpu=r, look="work", log=f"/job/log{r}",
               dist_threads=["pt_nccl_watchdg"], wchar_per_s=80, **ON_CPU)  # type: ignore[arg-type]
             for r in range(world)]
    node = Node([P(10, 1, cmdline=["torchrun", "train.py"]), *ranks])
    for _ in range(12):
        for r in range(world):
            node.write_log(f"/job/log{r}", "step\n")
        node.run(1)
    # the culprit stops in a wait of its own; the others spin in the collective it never joins
    culprit = ranks[-1]
    culprit.look, culprit.state, culprit.wchan, culprit.cpu_ticks_per_s, culprit.wchar_per_s = "idle", "S", "futex_do_wait", 0, 0
    for p in ranks[:-1]:
        p.look, p.wchar_per_s = "spin", 0
    return node, ranks


def _hangs(node: Node) -> list:
    return [i for i in node.an.incidents() if str(i.kind) in ("nccl_stall", "host_stall")]


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("what", ["dump_bytes", "watchdog_log", "symbol_reads"])
def test_a_waiter_busy_with_its_own_dump_keeps_the_one_incident(world: int, what: str) -> None:
    node, ranks = _job(world)
    node.run(20)
    assert len(_hangs(node)) == 1 and _hangs(node)[0].open, node.kinds()
    waiters = ranks[:-1]
    for _ in range(15):  # what a rank does when its collective times out, still spinning in it
        for p in waiters:
            if what == "dump_bytes":
                p.wchar_per_s = 40_000_000  # a flight-recorder dump written to disk
            elif what == "symbol_reads":
                p.read_per_s = 3_000_000
            else:
                node.write_log(f"/job/log{ranks.index(p)}", "[E] Watchdog caught collective operation timeout\n")
        node.run(1)
    for p in waiters:
        p.wchar_per_s = p.read_per_s = 0
    node.run(20)
    hangs = _hangs(node)
    assert len(hangs) == 1, [(i.kind, i.open, [e.get("note") for e in i.timeline]) for i in hangs]
    assert hangs[0].open and hangs[0].culprit_ranks == [world - 1]


def test_a_job_that_goes_on_resolves_its_hang() -> None:
    node, ranks = _job(4)
    node.run(20)
    assert len(_hangs(node)) == 1 and _hangs(node)[0].open
    for p in ranks:  # the culprit wakes; every rank works again
        p.look, p.state, p.wchan, p.cpu_ticks_per_s, p.wchar_per_s = "work", "R", "0", 95, 80
    for _ in range(10):
        for r in range(4):
            node.write_log(f"/job/log{r}", "step\n")
        node.run(1)
    hangs = _hangs(node)
    assert len(hangs) == 1 and not hangs[0].open, [(i.kind, i.open) for i in hangs]
