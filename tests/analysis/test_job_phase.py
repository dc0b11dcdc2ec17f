"""Phases a job is in as a whole, decided on facts about every rank of it:

- its collectives at work: every rank is in a collective (spinning on its GPU, or blocked by its
  stack) and every rank progresses on its own (its log, its GPU's work): a pipeline's sends and
  receives, back-to-back all-reduces. That is work (``busy``), for 2 ranks or 8; a rank that stops
  ends it, and the others then wait for it.
- graph capture: one rank's stack or its own log names the capture ("Capturing batches"), and every
  rank takes part (at work on its GPU, or in the capture's barriers): each is ``graph_capture``,
  not ``busy``; not while a rank is out of it (asleep in a wait of its own), the others then wait.
"""

from __future__ import annotations

import pytest

from .builders import ON_CPU, Node, P, torchrun_env

CAPTURE = [("torch/cuda/graphs.py", "capture_begin"), ("sglang/srt/model_executor/cuda_graph_runner.py", "capture_one_batch_size"),
           ("sglang/srt/model_executor/cuda_graph_runner.py", "capture"), ("scheduler.py", "run_scheduler_process")]
STEP = [("torch/nn/modules/module.py", "_call_impl"), ("model.py", "forward"), ("serve.py", "main")]


def _job(world: int, look: str, shared_gpu: bool = False) -> tuple[Node, list[P]]:
    ranks = [P(11 + r, 10, torchrun_env(r, world), gpu=0 if shared_gpu else r, look=look, log=f"/job/log{r}",
               dist_threads=["pt_nccl_watchdg"], wchar_per_s=80, **ON_CPU)  # type: ignore[arg-type]
             for r in range(world)]
    return Node([P(10, 1, cmdline=["torchrun", "serve.py"]), *ranks]), ranks


def _log_steps(node: Node, ranks: list[P], seconds: int, line: str = "step\n", who: list[int] | None = None) -> None:
    for _ in range(seconds):
        for r in who if who is not None else range(len(ranks)):
            node.write_log(f"/job/log{r}", line)
        node.run(1)


@pytest.mark.parametrize("world,shared", [(2, False), (4, True), (8, True)])
def test_every_rank_in_its_collectives_while_each_progresses_is_busy(world: int, shared: bool) -> None:
    node, ranks = _job(world, "spin", shared)
    _log_steps(node, ranks, 30)
    assert {node.state(p.pid) for p in ranks} == {"busy"}, [(p.pid, node.state(p.pid)) for p in ranks]
    assert node.kinds() == []


@pytest.mark.parametrize("world", [2, 8])
def test_a_rank_that_stops_ends_it_and_is_the_culprit(world: int) -> None:
    node, ranks = _job(world, "spin", shared_gpu=True)
    _log_steps(node, ranks, 20)
    stuck = ranks[-1]
    stuck.state, stuck.wchan, stuck.cpu_ticks_per_s, stuck.wchar_per_s = "S", "futex_do_wait", 0, 0
    node.stack(stuck.pid, [("threading.py", "wait"), ("serve.py", "main")])
    node.run(20)
    hangs = [i for i in node.an.incidents() if str(i.kind) in ("nccl_stall", "host_stall")]
    assert len(hangs) == 1 and hangs[0].culprit_ranks == [world - 1], [(i.kind, i.culprit_ranks) for i in hangs]
    assert {node.state(p.pid) for p in ranks} == {"hung"}


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("named_by", ["stack", "log"])
def test_a_job_capturing_cuda_graphs_is_graph_capture_on_every_rank(world: int, named_by: str) -> None:
    node, ranks = _job(world, "work")
    _log_steps(node, ranks, 10)
    for _ in range(12):
        if named_by == "stack":
            node.stack(ranks[0].pid, CAPTURE)
        else:
            node.write_log("/job/log0", "Capturing batches (bs=64 avail_mem=60.1 GB):  40%|####      | 14/35\n")
        node.run(1)
    assert {node.state(p.pid) for p in ranks} == {"graph_capture"}, [(p.pid, node.state(p.pid)) for p in ranks]
    # capture over: a stack of its model running, no capture line; the phase ends with its evidence
    node.stack(ranks[0].pid, STEP)
    _log_steps(node, ranks, 15)
    assert {node.state(p.pid) for p in ranks} == {"busy"}, [(p.pid, node.state(p.pid)) for p in ranks]


def test_capture_is_not_said_while_a_rank_is_out_of_it() -> None:
    node, ranks = _job(4, "work")
    _log_steps(node, ranks, 10)
    stuck = ranks[2]
    stuck.look, stuck.state, stuck.wchan, stuck.cpu_ticks_per_s, stuck.wchar_per_s = "idle", "S", "futex_do_wait", 0, 0
    for p in ranks:
        if p is not stuck:
            p.look = "spin"
    for _ in range(8):
        node.stack(ranks[0].pid, CAPTURE)
        node.run(1)
    # rank 0's own stack shows it in the capture; the others show nothing of it, and one is out of it
    assert "graph_capture" not in {node.state(p.pid) for p in ranks[1:]}, [(p.pid, node.state(p.pid)) for p in ranks]


def _cpu_job(world: int) -> tuple[Node, list[P]]:
    """``world`` gloo ranks on the CPU in back-to-back all-reduces, sharing two cores: a quarter of a
    core each, asleep between chunks, sending 12 MB/s through their sockets, waking 60 times a second."""
    ranks = [P(11 + r, 10, torchrun_env(r, world), dist_threads=["pt_gloo"], state="S", wchan="futex_do_wait",
               cpu_ticks_per_s=25, wchar_per_s=12_000_000, vol_per_s=60) for r in range(world)]
    return Node([P(10, 1, cmdline=["torchrun", "warmup.py"]), *ranks]), ranks


@pytest.mark.parametrize("world", [2, 4, 8])
def test_collectives_sending_their_bytes_steadily_are_work_at_any_size(world: int) -> None:
    node, ranks = _cpu_job(world)
    node.run(20)
    assert {node.state(p.pid) for p in ranks} == {"busy"}, [(p.pid, node.state(p.pid)) for p in ranks]
    assert node.kinds() == []


def test_bytes_read_alone_are_no_collective() -> None:
    """A rank reading a file through the page cache (rchar alone) while waking often is not taken
    for a rank in its collectives."""
    node, ranks = _cpu_job(2)
    for p in ranks:
        p.wchar_per_s, p.sock_per_s = 0, 3_000_000
    node.run(20)
    assert "busy" not in {node.state(p.pid) for p in ranks}, [(p.pid, node.state(p.pid)) for p in ranks]


def test_when_the_bytes_stop_the_wait_is_a_wait() -> None:
    node, ranks = _cpu_job(4)
    node.run(15)
    stuck = ranks[-1]
    stuck.cpu_ticks_per_s = stuck.wchar_per_s = stuck.vol_per_s = 0
    node.stack(stuck.pid, [("threading.py", "wait"), ("warmup.py", "main")])
    for p in ranks[:-1]:
        p.wchar_per_s, p.vol_per_s, p.cpu_ticks_per_s = 0, 0, 0
        node.stack(p.pid, [("torch/distributed/distributed_c10d.py", "all_reduce"), ("warmup.py", "main")])
    node.run(30)
    hangs = [i for i in node.an.incidents() if str(i.kind) in ("nccl_stall", "host_stall")]
    assert len(hangs) == 1 and hangs[0].culprit_ranks == [3], [(i.kind, i.culprit_ranks) for i in hangs]


def test_a_thread_streaming_while_the_main_thread_hangs_in_a_collective_is_no_work() -> None:
    """Every rank blocked in an all-reduce for good (its stack says so, its main thread never wakes)
    while a thread of its own streams 5 MB/s to a socket or /dev/shm: the bytes are not its
    collectives completing, and the hang opens."""
    node, ranks = _cpu_job(4)
    node.run(10)
    for p in ranks:
        p.vol_per_s, p.cpu_ticks_per_s, p.wchar_per_s = 0, 2, 5_000_000
        node.stack(p.pid, [("torch/distributed/distributed_c10d.py", "all_reduce"), ("warmup.py", "main")])
    node.run(40)
    assert any(k in ("nccl_stall", "host_stall") for k in node.kinds()), node.kinds()


def _fast_cpu_job(world: int, wchar: int, file_share: float = 0.0, wakes: int = 110) -> tuple[Node, list[P]]:
    """``_cpu_job`` with the ranks sending ``wchar`` bytes a second through their write calls, the
    share ``file_share`` of them into files (counted by the disk's ``write_bytes`` too), waking
    ``wakes`` times a second (a completion each)."""
    node, ranks = _cpu_job(world)
    for p in ranks:
        p.wchar_per_s, p.file_write_per_s, p.vol_per_s = wchar, int(wchar * file_share), wakes
    return node, ranks


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("rate", [21_000_000, 200_000_000])
def test_collectives_sending_faster_than_a_writer_are_still_work(world: int, rate: int) -> None:
    """Four gloo ranks warming up on two cores sent 21 MB/s each through their sockets (live under
    ``hangd serve``, matrix warm-up job), above a checkpoint writer's lowest rate: read as asleep,
    their collectives completing 110 times a second were taken for an idle server's, and rank 0 for
    the straggler the others wait for. A host with cores to spare sends far more."""
    node, ranks = _fast_cpu_job(world, rate)
    node.run(20)
    assert {node.state(p.pid) for p in ranks} == {"busy"}, [(p.pid, node.state(p.pid), node.an._track(p.pid).reason)
                                                           for p in ranks]
    assert node.kinds() == []


def test_bytes_written_into_a_file_are_no_collective() -> None:
    """The same bytes counted by the disk's counter too go into a file: a checkpoint writer, not a
    collective sending them."""
    node, ranks = _fast_cpu_job(2, 60_000_000, file_share=1.0, wakes=5)
    node.run(20)
    assert not any("through its sockets" in node.an._track(p.pid).reason for p in ranks), \
        [(p.pid, node.state(p.pid), node.an._track(p.pid).reason) for p in ranks]


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize(("wchar", "idle"), [(200_000_000, False), (20_000_000, False), (20_000, True)])
def test_an_idle_server_is_collectives_that_carry_next_to_no_data(world: int, wchar: int, idle: bool) -> None:
    """Ranks 1.. in a collective that completes 110 times a second, their stacks inside it; rank 0
    asleep between completions with no stack yet; none read as working. An idle server's empty
    batches when next to no bytes move (1 KB each); work when the collectives carry data, in their
    first seconds too, before the I/O window holds enough of them to read the ranks as busy (live:
    the first seconds of four gloo ranks' warm-up, taken for an idle server), whatever the rate."""
    node, ranks = _cpu_job(world)
    node.run(12)  # set up, at work
    for p in ranks:
        p.wchar_per_s = p.vol_per_s = p.cpu_ticks_per_s = 0
    node.run(8)  # asleep, the I/O window empty
    for p in ranks:
        p.wchar_per_s, p.vol_per_s, p.cpu_ticks_per_s = wchar, 110, 2
    for p in ranks[1:]:
        node.stack(p.pid, [("torch/distributed/distributed_c10d.py", "all_reduce"), ("serve.py", "main")],
                   threads=["pt_gloo"])
    node.run(2.5)
    why = [(p.pid, node.state(p.pid), node.an._track(p.pid).reason) for p in ranks]
    assert any("idle server" in node.an._track(p.pid).reason for p in ranks) is idle, why
    assert node.kinds() == [], why
