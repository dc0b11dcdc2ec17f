"""Never harm the job: no flight-recorder dump is asked for while a rank may be capturing CUDA
graphs (the dump thread's CUDA event queries invalidate a global-mode capture, and the rank dies),
whether the capture shows in a stack or a log, and whether the job is hung in it or only waits."""

from __future__ import annotations

import pytest

from hangd.evidence import Requests

from .builders import ON_CPU, Node, P, torchrun_env

CAPTURE = [("torch/cuda/graphs.py", "capture_begin"), ("sglang/srt/model_executor/cuda_graph_runner.py", "capture"),
           ("scheduler.py", "run_scheduler_process")]
BARRIER = [("torch/distributed/distributed_c10d.py", "barrier"), ("sglang/srt/model_executor/cuda_graph_runner.py", "capture"),
           ("scheduler.py", "run_scheduler_process")]


def _recording(node: Node) -> list[Requests]:
    asked: list[Requests] = []
    real = node.an.take_requests

    def take() -> Requests:
        r = real()
        asked.append(r)
        return r

    node.an.take_requests = take  # type: ignore[method-assign]
    return asked


def _capturing_job(world: int) -> tuple[Node, list[P], list[Requests]]:
    ranks = [P(11 + r, 10, torchrun_env(r, world), gpu=r, look="work", log=f"/job/log{r}",
               dist_threads=["pt_nccl_watchdg"], wchar_per_s=80, **ON_CPU)  # type: ignore[arg-type]
             for r in range(world)]
    node = Node([P(10, 1, cmdline=["python", "-m", "sglang.launch_server"]), *ranks])
    asked = _recording(node)
    for _ in range(10):
        for r in range(world):
            node.write_log(f"/job/log{r}", "step\n")
        node.run(1)
    return node, ranks, asked


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("seen_in", ["stack", "log"])
def test_a_job_stuck_in_graph_capture_gets_no_dump_request(world: int, seen_in: str) -> None:
    node, ranks, asked = _capturing_job(world)
    # capture begins; the last rank blocks in it, the others wait in the capture's barrier, spinning
    for p in ranks:
        if seen_in == "stack":
            node.stack(p.pid, CAPTURE)
    node.write_log("/job/log0", "Capture cuda graph begin. This can take up to several minutes.\n")
    node.run(1)
    stuck = ranks[-1]
    stuck.look, stuck.state, stuck.wchan, stuck.cpu_ticks_per_s, stuck.wchar_per_s = "idle", "S", "futex_do_wait", 0, 0
    for p in ranks[:-1]:
        p.look, p.wchar_per_s = "spin", 0
        if seen_in == "stack":
            node.stack(p.pid, BARRIER)
    node.run(40)
    assert any(str(k) in ("nccl_stall", "host_stall") for k in node.kinds()), node.kinds()
    assert not any(r.fr_dumps or r.fr_probes for r in asked), [(r.fr_dumps, r.fr_probes) for r in asked if r.fr_dumps or r.fr_probes]


def test_a_hung_job_outside_any_capture_still_gets_its_dumps() -> None:
    ranks = [P(11 + r, 10, torchrun_env(r, 2), gpu=r, look="work", log=f"/job/log{r}",
               dist_threads=["pt_nccl_watchdg"], wchar_per_s=80, **ON_CPU)  # type: ignore[arg-type]
             for r in range(2)]
    node = Node([P(10, 1, cmdline=["torchrun", "train.py"]), *ranks])
    asked = _recording(node)
    for _ in range(10):
        for r in range(2):
            node.write_log(f"/job/log{r}", "step\n")
        node.run(1)
    ranks[1].look, ranks[1].state, ranks[1].cpu_ticks_per_s, ranks[1].wchar_per_s = "idle", "S", 0, 0
    ranks[0].look, ranks[0].wchar_per_s = "spin", 0
    node.run(30)
    assert node.kinds(), node.kinds()
    assert any(r.fr_dumps for r in asked)


@pytest.mark.parametrize("title", ["sglang::scheduler_TP{r}", "python -m worker --rank {r}"])
def test_dumps_of_ranks_known_by_their_argument_carry_their_rank(title: str) -> None:
    """Ranks whose environment has no RANK are asked for dumps with the rank the analysis read off
    their arguments; a rank only guessed (start order) is not: a dump asked under a wrong rank
    would be another's."""
    ranks = [P(11 + r, 10, {"MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "4"}, cmdline=title.format(r=r).split(),
               comm=title.format(r=r).split()[0][:15], gpu=r, look="work", dist_threads=["pt_nccl_watchdg"],
               log=f"/job/log{r}", wchar_per_s=80, **ON_CPU)  # type: ignore[arg-type]
             for r in range(4)]
    node = Node([P(10, 1, cmdline=["python", "-m", "sglang.launch_server"]), *ranks])
    asked = _recording(node)
    for _ in range(10):
        for r in range(4):
            node.write_log(f"/job/log{r}", "step\n")
        node.run(1)
    ranks[3].look, ranks[3].state, ranks[3].cpu_ticks_per_s, ranks[3].wchar_per_s = "idle", "S", 0, 0
    for p in ranks[:3]:
        p.look, p.wchar_per_s = "spin", 0
    node.run(30)
    told = {pid: r for req in asked for pid, r in req.ranks.items()}
    assert any(req.fr_dumps for req in asked), node.kinds()
    assert told == {p.pid: r for r, p in enumerate(ranks)}, told


def test_an_operator_snapshot_dumps_no_rank_of_a_capturing_job() -> None:
    """What the snapshot API and `hangd record --fr-every` may dump: not a job that captures."""
    node, ranks, _ = _capturing_job(4)
    assert sorted(node.an.dumpable_pids()) == [p.pid for p in ranks]
    for _ in range(3):
        node.stack(ranks[0].pid, CAPTURE)
        node.run(1)
    assert node.an.dumpable_pids() == []


def test_a_hang_first_seen_in_a_capture_is_dumped_once_its_stacks_show_it_out_of_it() -> None:
    node, ranks, asked = _capturing_job(2)
    ranks[1].look, ranks[1].state, ranks[1].cpu_ticks_per_s, ranks[1].wchar_per_s = "idle", "S", 0, 0
    ranks[0].look, ranks[0].wchar_per_s = "spin", 0
    node.stack(ranks[1].pid, CAPTURE)  # the culprit stopped inside the capture
    node.run(20)
    assert node.kinds() and not any(r.fr_dumps for r in asked), node.kinds()
    # its newest stack shows no capture: a wait of its own
    node.stack(ranks[1].pid, [("threading.py", "wait"), ("train.py", "main")])
    node.run(3)
    assert any(r.fr_dumps for r in asked)
