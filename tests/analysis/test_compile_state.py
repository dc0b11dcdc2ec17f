"""Ranks compiling on the CPU (torch.compile with gloo), as a table: what a rank shows, then
the state it must be in. A compile leaves few signs besides its stack: the call of
torch.compile() importing its compiler, compilers under it, its own CPU, the files it writes.
A compile that ended, or a rank that went on to wait for a peer, is no longer compiling."""

from __future__ import annotations

import pytest

from hangd.analysis import stackcat
from hangd.replay import run_replay
from hangd.snapshot import Frame, ThreadStack
from tests.conftest import DATA

from .builders import Node, P, torchrun_env

DYNAMO_IMPORT = [("torch/_dynamo/variables/builder.py", "<module>"), ("torch/_dynamo/convert_frame.py", "<module>"),
                 ("torch/_dynamo/__init__.py", "<module>"), ("torch/__init__.py", "compile"),
                 ("train.py", "build_model"), ("train.py", "main")]
CODEGEN = [("torch/_inductor/codegen/cpp.py", "codegen_kernel"), ("torch/_inductor/graph.py", "codegen"),
           ("torch/_inductor/compile_fx.py", "fx_codegen_and_compile"), ("train.py", "main")]
BARRIER = [("torch/distributed/distributed_c10d.py", "barrier"), ("train.py", "main")]
TRAIN = [("train.py", "step"), ("train.py", "main")]
FORWARD = [("torch/nn/modules/module.py", "Module._call_impl"), ("train.py", "step"), ("train.py", "main")]


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
    elif after == "trains, compilers busy under it":
        # its main thread back in its training loop, a compile worker still busy under it (a
        # background compile, a warm pool's work): seen on an H200 as 'compiling' to the end
        p.state, p.wchan, p.cpu_ticks_per_s = "R", "0", 30
        cc = P(40 + pid, pid, cmdline=["python", "-m", "torch._inductor.compile_worker", "--workers=4"],
               state="R", wchan="0", cpu_ticks_per_s=60)
        node.procs[cc.pid] = cc
        node.stack(pid, TRAIN)
    elif after == "waits in a barrier":
        p.state, p.wchan, p.cpu_ticks_per_s = "S", "futex_do_wait", 0
        node.stack(pid, BARRIER)


CASES = [
    # (what the rank shows, seconds after, the state it must be in then)
    ("torch.compile() importing dynamo in a rank that has set up", "import", 6, "compiling"),
    ("its compile ended: asleep between compiled steps", "sleeps between small steps", 9, "not compiling"),
    ("its compile goes on in the compilers under it", "waits on its compilers", 9, "compiling"),
    ("its stack back in its own loop, compilers busy under it", "trains, compilers busy under it", 9, "not compiling"),
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


# Main threads as py-spy caught them in the recorded CPU matrix (tests/data/traces/matrix-cpu),
# innermost first, trimmed of the importlib frames between.
DDP_IMPORTS_DYNAMO = [  # mpargv-serve_poll-sigstop-collective, rank 1 at 10.5 s: plain DDP training
    ("inspect.py", "getattr_static"), ("torch/_dynamo/utils.py", "unwrap_with_attr_name_if_wrapper"),
    ("torch/_dynamo/trace_rules.py", "_load_obj_from_str"), ("torch/_dynamo/utils.py", "is_lru_cache_wrapped_function"),
    ("torch/_dynamo/trace_rules.py", "get_torch_obj_rule_map"),
    ("torch/_dynamo/decorators.py", "substitute_in_graph.<locals>.wrapper"),
    ("torch/_dynamo/polyfills/_collections.py", "<module>"), ("<frozen importlib._bootstrap>", "_find_and_load"),
    ("torch/_dynamo/polyfills/loader.py", "<module>"), ("<frozen importlib._bootstrap>", "_find_and_load"),
    ("torch/_dynamo/__init__.py", "<module>"), ("<frozen importlib._bootstrap>", "_find_and_load"),
    ("torch/__init__.py", "__getattr__"), ("torch/nn/parallel/distributed.py", "DistributedDataParallel.__init__"),
    ("matrix_job.py", "train"), ("matrix_job.py", "main"), ("matrix_job.py", "<module>")]
COMPILE_IMPORTS_INDUCTOR = [  # parent-compile-none, rank 0 at 10.5 s: inside torch.compile()
    ("inspect.py", "Signature.from_callable"), ("dataclasses.py", "dataclass"),
    ("torch/ao/quantization/fx/custom_config.py", "<module>"), ("<frozen importlib._bootstrap>", "_find_and_load"),
    ("torch/__init__.py", "_TorchCompileInductorWrapper.get_compiler_config"),
    ("torch/_dynamo/eval_frame.py", "_optimize"), ("torch/_dynamo/eval_frame.py", "optimize"),
    ("torch/__init__.py", "compile"), ("matrix_job.py", "compile_phase"), ("matrix_job.py", "main"),
    ("matrix_job.py", "<module>")]
CODEGEN_WAITS_ON_CACHE_LOCK = [  # parent-compile-none, rank 1 at 20.6 s: its peer builds the same kernel
    ("filelock/_core/_acquire.py", "LockAcquisition._poll_until_acquired"), ("torch/utils/_filelock.py", "FileLock.__enter__"),
    ("torch/_inductor/cpu_vec_isa.py", "VecISA.check_build"), ("torch/_inductor/codegen/cpp.py", "CppKernelProxy.__init__"),
    ("torch/_inductor/scheduler.py", "Scheduler.codegen"), ("torch/_inductor/compile_fx.py", "compile_fx_inner"),
    ("matrix_job.py", "compile_phase"), ("matrix_job.py", "main"), ("matrix_job.py", "<module>")]


@pytest.mark.parametrize(("name", "frames", "kind"), [
    ("DDP importing torch._dynamo runs its decorators: importing, not compiling", DDP_IMPORTS_DYNAMO, "unknown"),
    ("torch.compile() importing inductor: setting up the compile", COMPILE_IMPORTS_INDUCTOR, "compile_setup"),
    ("inductor's codegen waiting for the cache lock its peer holds: compiling", CODEGEN_WAITS_ON_CACHE_LOCK, "compiling"),
], ids=lambda x: x if isinstance(x, str) and " " in x else "")
def test_what_a_recorded_stack_says_of_a_compile(name, frames, kind):
    th = ThreadStack(tid=1, name="MainThread", active=True, owns_gil=True,
                     frames=[Frame(name=n, filename=f"/opt/venv/lib/python3.11/site-packages/{f}", line=1) for f, n in frames])
    assert stackcat.classify_thread(th).kind == kind, name


def test_a_compile_its_stack_shows_is_said_at_once():
    """A stack is a capture, not a flickering rate: the compile it shows is said at the next tick,
    not after the dwell (parent-compile-none: 2 s of "busy" after the stack said compile)."""
    node = cpu_job()
    assert node.state(11) == "busy"
    node.stack(11, DYNAMO_IMPORT)
    node.run(0.5)
    assert node.state(11) == "compiling", node.an.tracks[11].reason


def test_a_set_up_rank_in_torch_compile_is_compiling_not_starting():
    """A gloo rank whose process group is up (its imports and init are over) that a stack catches in
    torch.compile() before any compiler runs is compiling: it does not stay "starting" until g++ starts
    (torchrun-compile-sigstop-collective: gloo's threads seen at 8 s, inside torch.compile(), g++ at 14 s)."""
    rank = P(21, 20, torchrun_env(0, 2), state="R", wchan="0", cpu_ticks_per_s=60, start=999.0)
    node = Node([P(20, 1, cmdline=["torchrun", "train.py"]), rank])
    node.run(3)
    assert node.state(21) == "starting"
    rank.dist_threads = ["pt_gloo_runloop", "gloo_tcp_loop"]
    node.stack(21, DYNAMO_IMPORT)
    node.run(3)
    assert node.state(21) == "compiling", node.an.tracks[21].reason


def test_a_stack_that_named_nothing_is_taken_again_once_the_rank_works_on():
    """Recorded parent-compile-none: both ranks were caught in their start-up imports (a stack that names
    nothing), then traced with torch.compile on the CPU for 20 s. The analysis asks for their stacks
    again a few seconds later, not 30 s after the start-up one, whether they read as a core in use or
    as busy on the CPU alone (moving a trickle of bytes): the recording, made when only the first was
    asked, has no stack of rank 0 from 1.3 s to the periodic one at 10.5 s, and shows it busy."""
    d = DATA / "traces" / "matrix-cpu" / "parent-compile-none"
    asked: dict[int, list[float]] = {}

    def seen(an, snap):
        for pid, tp in an.tracks.items():
            if tp.cpu_stack_asked is not None and tp.cpu_stack_asked not in asked.setdefault(pid, []):
                asked[pid].append(tp.cpu_stack_asked)

    _, info = run_replay(str(d), on_snapshot=seen)
    t0 = info["meta"]["t_start"]
    for pid in info["meta"]["ranks"].values():
        assert any(6 <= t - t0 <= 10 for t in asked[pid]), (pid, [round(t - t0, 1) for t in asked[pid]])


@pytest.mark.parametrize("newest, want", [(FORWARD, "busy"), (CODEGEN, "compiling")], ids=["model_runs", "compiles_on"])
def test_a_first_wait_after_a_stack_out_of_the_compiler_keeps_no_compile(newest, want):
    """The compiled model runs (a stack in its own model, taken after the compiling one), then it
    stops while its peer waits in a barrier: the first wait is held, but what it keeps is not
    "compiling" (recorded mpargv-compile-stuck-select_pipe: "compiling" kept 6 s into a hang after
    the compiled steps ran). Caught compiling again, it keeps "compiling"."""
    node = cpu_job()
    for pid in (11, 12):
        node.stack(pid, CODEGEN)
    node.run(3)
    assert node.state(11) == "compiling"
    node.stack(11, newest)
    node.run(1)
    for pid in (11, 12):
        p = node.procs[pid]
        p.state, p.wchan, p.cpu_ticks_per_s = "S", "futex_do_wait", 0
    node.stack(12, BARRIER)
    node.run(4)
    assert node.state(11) == want, node.an.tracks[11].reason
