"""Ranks compiling on the CPU (torch.compile with gloo), as a table: what a rank shows, then
the state it must be in. A compile leaves few signs besides its stack: the call of
torch.compile() importing its compiler, compilers under it, its own CPU, the files it writes.
A compile that ended, or a rank that went on to wait for a peer, is no longer compiling."""

from __future__ import annotations

import pytest

from .builders import Node, P, torchrun_env

DYNAMO_IMPORT = [("torch/_dynamo/variables/builder.py", "<module>"), ("torch/_dynamo/convert_frame.py", "<module>"),
                 ("torch/_dynamo/__init__.py", "<module>"), ("torch/__init__.py", "compile"),
                 ("train.py", "build_model"), ("train.py", "main")]
CODEGEN = [("torch/_inductor/codegen/cpp.py", "codegen_kernel"), ("torch/_inductor/graph.py", "codegen"),
           ("torch/_inductor/compile_fx.py", "fx_codegen_and_compile"), ("train.py", "main")]
BARRIER = [("torch/distributed/distributed_c10d.py", "barrier"), ("train.py", "main")]
TRAIN = [("train.py", "step"), ("train.py", "main")]


def cpu_job() -> Node:
    """torchrun with two gloo ranks on the CPU, set up (process group up) and working a while."""
    procs = [P(10, 1, cmdline=["torchrun", "train.py"])]
    for r in (0, 1):
        procs.append(P(11 + r, 10, torchrun_env(r, 2), state="R", wchan="0", cpu_ticks_per_s=90,
                       dist_threads=["pt_gloo_runloop", "gloo_tcp_loop"], start=990.0))
    node = Node(procs)
    node.run(6)
    for pid in (11, 12):
        node.stack(pid, TRAIN)
    node.run(6)
    return node


def compiling_then(node: Node, pid: int, after: str) -> None:
    """Rank ``pid`` is caught in inductor's code generation, then does ``after``."""
    node.stack(pid, CODEGEN)
    node.run(5)
    p = node.procs[pid]
    if after == "sleeps between small steps":  # a compiled program's steps: asleep, a few % of a core
        p.state, p.wchan, p.cpu_ticks_per_s, p.wchar_per_s = "S", "hrtimer_nanosleep", 3, 90_000
    elif after == "waits on its compilers":  # g++ under it does the work; it sleeps on the pipe
        p.state, p.wchan, p.cpu_ticks_per_s = "S", "anon_pipe_read", 0
        cc = P(40 + pid, pid, cmdline=["g++", "/tmp/torchinductor/ab/kernel.cpp", "-shared"], comm="cc1plus",
               state="R", wchan="0", cpu_ticks_per_s=95)
        node.procs[cc.pid] = cc
    elif after == "waits in a barrier":
        p.state, p.wchan, p.cpu_ticks_per_s = "S", "futex_do_wait", 0
        node.stack(pid, BARRIER)


CASES = [
    # (what the rank shows, seconds after, the state it must be in then)
    ("torch.compile() importing dynamo in a rank that has set up", "import", 6, "compiling"),
    ("its compile ended: asleep between compiled steps", "sleeps between small steps", 9, "not compiling"),
    ("its compile goes on in the compilers under it", "waits on its compilers", 9, "compiling"),
    ("done compiling, it waits in a barrier for a peer still compiling", "waits in a barrier", 4, "waiting_peer"),
]


@pytest.mark.parametrize(("name", "what", "seconds", "want"), CASES, ids=[c[0] for c in CASES])
def test_a_cpu_compile(name, what, seconds, want):
    node = cpu_job()
    assert node.state(11) == "busy"
    node.stack(12, CODEGEN)  # the peer compiles all along
    if what == "import":
        node.stack(11, DYNAMO_IMPORT)
    else:
        compiling_then(node, 11, what)
    node.run(seconds)
    got = node.state(11)
    if want == "not compiling":
        assert got != "compiling", f"{name}: still said compiling"
    else:
        assert got == want, f"{name}: {got} ({node.an.tracks[11].reason})"


def test_torch_compile_importing_during_start_up_is_still_starting():
    """A rank still setting up (its GPU idle, nothing shown yet) inside torch.compile(): its imports
    are setting up, not a compile (the recorded H200 jobs say so)."""
    gpu_rank = P(21, 20, torchrun_env(0, 1), gpu=0, gpu_mem=1 << 29, state="R", wchan="0", cpu_ticks_per_s=100,
                 start=999.0)
    node = Node([P(20, 1, cmdline=["torchrun", "train.py"]), gpu_rank])
    node.run(3)
    node.stack(21, DYNAMO_IMPORT)
    node.run(4)
    assert node.state(21) == "starting", node.an.tracks[21].reason
