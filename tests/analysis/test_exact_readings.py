"""What the operator reads where the sampled mutants of the analysis survived: a sentence read
whole where it was only searched for a word (one rank against several, one error against several),
a worker's CPU at either side of the line that says it works, an XID hangd's table does not know,
and a hang that ends with the waits that led to it still in the straggler's window."""

from __future__ import annotations

from collections.abc import Callable

from hangd.analysis.report import clock
from hangd.snapshot import Snapshot

from .builders import Node, P, torchrun_env
from .test_detectors import _diverged

COLL = [("torch/distributed/distributed_c10d.py", "all_reduce"), ("train.py", "step")]
ELSEWHERE = [("threading.py", "wait"), ("train.py", "load")]
WORK = [("model.py", "forward"), ("train.py", "step")]
LOADER = [("torch/utils/data/dataloader.py", "_next_data"), ("train.py", "step")]
AR = ("torch/distributed/distributed_c10d.py", "all_reduce", 2950)
BAR = ("torch/distributed/distributed_c10d.py", "barrier", 5356)


def _ranks(n: int, **kw: object) -> Node:
    ranks = [P(11 + r, 10, torchrun_env(r, n), gpu=r, log=f"/job/log{r}", **kw)  # type: ignore[arg-type]
             for r in range(n)]
    return Node([P(10, 1), *ranks])


def _reason(node: Node, pid: int) -> str:
    return next(p["reason"] for p in node.an.processes() if p["pid"] == pid)


def test_one_rank_odd_one_out_is_said_in_the_singular():
    loop = [("train.py", "train", 40), ("train.py", "<module>", 99)]
    odd = [("train.py", "train", 30), ("train.py", "<module>", 99)]
    inc = _diverged({11: [AR, *loop], 12: [BAR, *odd], 13: [AR, *loop]}, world=3)
    assert inc.culprit_ranks == [1]
    assert "rank 1 is the odd one out: 2 ranks wait in all_reduce" in inc.summary, inc.summary


def test_one_rank_further_along_is_the_likely_culprit_in_the_singular():
    loop = [("train.py", "train", 40), ("train.py", "<module>", 99)]
    after = [("train.py", "train", 52), ("train.py", "<module>", 99)]
    inc = _diverged({11: [AR, *loop], 12: [BAR, *after]})
    assert inc.culprit_ranks == [1]
    assert "rank 1 (pid 12) is the likely culprit, where the ranks' collectives diverged: rank 1: " in inc.summary, \
        inc.summary


def test_one_orphaned_process_is_said_in_the_singular():
    node = _ranks(2)
    node.run(3)
    node.procs[12].state = "Z"  # exited, not reaped, and NVML still lists its 20 GiB on GPU 1
    node.run(node.an.th.orphan_gpu_s + 2)
    inc = next(i for i in node.an.incidents() if i.kind == "orphaned_gpu_memory")
    assert inc.summary.startswith("1 process of job "), inc.summary
    assert " hold 20.0 GiB of GPU memory after losing their launcher: pid 12 (rank 1, GPU 1)" in inc.summary, \
        inc.summary


def test_old_dumps_of_two_ranks_on_a_node_are_said_in_the_plural():
    from .test_fleet import _dump, _fr_node

    node = _fr_node([_dump(2, 12), _dump(3, 11)], read_at=1001.0)
    (silent,) = [f for f in node.an.findings if f["kind"] == "node_silent"]
    assert silent["message"] == (f"node-b: its newest flight-recorder dumps (read at {clock(1001.0)}) are older "
                                 "than 15 s; the flight-recorder entries of its ranks 2, 3 are not compared"), \
        silent["message"]


def _with_workers(*ticks_per_s: int) -> Node:
    """Rank 0 (pid 11) blocked on its DataLoader queue; its workers (pids 21...) sleep on their pipe
    using this many CPU ticks (1/100 s) a second."""
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0),
                 *(P(21 + i, 11, cpu_ticks_per_s=n, wchan="pipe_read") for i, n in enumerate(ticks_per_s))])
    node.run(3)
    node.stack(11, LOADER)
    node.run(3)
    return node


def test_a_worker_on_a_fifth_of_a_core_is_not_working_and_on_a_third_is():
    node = _with_workers(20, 33)
    reason = _reason(node, 11)
    assert "its DataLoader workers pid 21 (sleeping in pipe_read), pid 22 (working)" in reason, reason
    assert node.state(11) == "busy" and reason.endswith("; they work: its workers pid 22 work"), reason


def test_a_runnable_worker_on_a_twentieth_of_a_core_works_on_a_host_short_of_cores():
    node = Node([P(10, 1), P(11, 10, torchrun_env(0, 1), gpu=0), P(21, 11, cpu_ticks_per_s=5, state="R", wchan="0")])
    node.run(3)
    node.stack(11, LOADER)
    node.run(3)
    reason = _reason(node, 11)
    assert node.state(11) == "busy", reason
    assert "its DataLoader worker pid 21 (working); they work: its workers pid 21 work" in reason, reason


def test_a_rank_with_three_workers_or_fewer_names_them_all_and_no_more():
    node = _with_workers(100, 0)
    reason = _reason(node, 11)
    words = "its DataLoader workers pid 22 (sleeping in pipe_read for 6 s), pid 21 (working); they work"
    assert words in reason, reason


def test_a_hang_that_ends_is_no_straggler_for_the_waits_that_made_it():
    """Rank 0 spins in a collective while rank 1 sits idle: a hang; both work again within the
    straggler's window, which still holds the seconds rank 0 waited before the hang was found."""
    node = _ranks(2, look="work")
    node.run(5)
    node.procs[11].look, node.procs[12].look = "spin", "idle"
    node.stack(11, COLL)
    node.stack(12, ELSEWHERE)
    node.run(25)
    (hang,) = node.an.incidents()
    assert hang.kind == "nccl_stall" and hang.open
    node.procs[11].look = node.procs[12].look = "work"
    node.stack(11, WORK)
    node.stack(12, WORK)
    node.run(20)
    assert not hang.open and node.kinds() == ["nccl_stall"], [(i.kind, i.summary) for i in node.an.incidents()]
    assert node.state(11) == node.state(12) == "busy"


def _decorate(node: Node, gpu_fill: Callable[[Snapshot], None]) -> None:
    """Add what NVML says of the GPUs beyond what the builder gives (UUIDs, XIDs, ECC counts)."""
    step = node.an.step

    def step_with_hardware(snap: Snapshot):
        gpu_fill(snap)
        return step(snap)

    node.an.step = step_with_hardware  # type: ignore[method-assign]


def test_an_xid_the_table_does_not_know_and_one_new_ecc_error_before_a_hang_are_said():
    """GPU 1 reports XID 999 (not in hangd's table) twice and one new uncorrected ECC error while
    the job stands still: the hang names the GPU by its UUID, the XID as unknown with its count and
    when it first came relative to when rank 1 stopped, and the one new error in the singular."""
    posted: list[float] = []

    def fill(snap: Snapshot) -> None:
        for g in snap.gpus:
            g.uuid = f"GPU-{g.index}{g.index}{g.index}{g.index}"
            g.ecc_uncorrected = 0 if g.index == 0 else (2 if snap.t < 1003.0 else 3)
            if g.index == 1 and len(posted) < 2 and snap.t >= 1002.0 + len(posted):
                posted.append(snap.t)
                g.xid = [{"xid": 999, "t": snap.t}]

    node = _ranks(2)
    _decorate(node, fill)
    node.run(5)
    node.stack(11, [("torch/distributed/distributed_c10d.py", "broadcast_object_list"), ("server.py", "loop")])
    node.stack(12, [("threading.py", "wait"), ("server.py", "start")])
    node.run(15)
    (inc,) = node.an.incidents()
    assert inc.kind == "host_stall" and inc.culprit_ranks == [1] and len(posted) == 2
    said = (f"GPU 1 (GPU-1111) reported XID 999 (not in hangd's XID table) at {clock(posted[0])} "
            f"(2 times, the last at {clock(posted[1])}), 2 s after rank 1 stopped progressing. ")
    assert inc.summary.startswith(said), inc.summary
    assert "GPU 1 (GPU-1111) of rank 1 has 1 new uncorrected ECC error (3 since the driver loaded)" in inc.summary, \
        inc.summary
    (x,) = inc.evidence["hardware"]["xids"]
    assert {k: x[k] for k in ("gpu", "uuid", "xid", "meaning", "severity", "count", "t", "ranks")} == {
        "gpu": 1, "uuid": "GPU-1111", "xid": 999, "meaning": "not in hangd's XID table", "severity": "unknown",
        "count": 2, "t": round(posted[0], 3), "ranks": [1]}
    assert x["before_stall_s"] < 0  # it came after the stall
