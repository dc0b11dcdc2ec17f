"""What a stack says beyond its main thread's innermost wait.

A stack in the rank's own model (a forward pass, an optimizer step) says it works.

Seen on an H200: a rank in its first DDP forward pass read `starting`, then `loading` for 4 s,
because the CUDA libraries paging in as their kernels first ran read like a loader (read_bytes at
30 MB/s, GPU memory growing). Such a stack describes the rank while its CPU or GPU works; once
both are still the rank has moved on, into a wait no capture has shown yet.

A main thread reading a queue that a thread of its own fills from outside (a listener in accept(),
a ZMQ poller) waits for requests: a server's scheduling loop, not a lock of its own."""

from __future__ import annotations

from hangd.analysis import stackcat
from hangd.snapshot import Frame, StackSample, ThreadStack

from .builders import Node, P, torchrun_env

FORWARD = [("torch/nn/modules/linear.py", "Linear.forward"), ("torch/nn/modules/module.py", "Module._call_impl"),
           ("torch/nn/parallel/distributed.py", "DistributedDataParallel.forward"),
           ("torch/nn/modules/module.py", "Module._call_impl"), ("train.py", "train")]
STEP = [("torch/optim/sgd.py", "SGD.step"), ("torch/optim/optimizer.py", "Optimizer.profile_hook_step.<locals>.wrapper"),
        ("train.py", "train")]


def _verdict(frames: list[tuple[str, str]]) -> str:
    th = ThreadStack(tid=1, name="MainThread", active=True, owns_gil=True,
                     frames=[Frame(name=n, filename=f, line=1) for f, n in frames])
    return stackcat.classify([StackSample(pid=1, threads=[th])]).kind


def test_a_forward_pass_or_a_step_is_computing_and_any_wait_inside_it_wins():
    assert _verdict(FORWARD) == "computing"
    assert _verdict(STEP) == "computing"
    # tensor parallelism's all_reduce inside the forward pass, a lock in a hook, a sleep: the wait
    assert _verdict([("torch/distributed/distributed_c10d.py", "all_reduce"), *FORWARD]) == "collective"
    assert _verdict([("threading.py", "Condition.wait"), *FORWARD]) == "lock_wait"
    assert _verdict([("time.py", "sleep"), *FORWARD]) == "sleeping"
    # dynamo tracing the forward pass compiles; the compiled forward pass running computes
    assert _verdict([("torch/_dynamo/symbolic_convert.py", "InstructionTranslator.run"), *FORWARD]) in stackcat.COMPILE_KINDS
    assert _verdict([("torch/_dynamo/eval_frame.py", "_fn"), *FORWARD]) == "computing"
    assert _verdict([("train.py", "train")]) == "unknown"


def _rank_reading_as_it_computes() -> tuple[Node, P]:
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, state="R", wchan="0", cpu_ticks_per_s=90, read_per_s=30_000_000,
           dist_threads=["pt_nccl_watchdg"])
    r1 = P(12, 10, torchrun_env(1, 2), gpu=1, look="work", state="R", wchan="0", cpu_ticks_per_s=90,
           dist_threads=["pt_nccl_watchdg"])
    node = Node([P(10, 1), r0, r1])
    node.run(3)
    node.stack(11, FORWARD)
    node.run(4)
    return node, r0


def test_a_rank_in_its_forward_pass_reading_bytes_is_busy_not_loading():
    node, _ = _rank_reading_as_it_computes()
    assert node.state(11) == "busy", node.an.processes()
    assert "running its model" in next(p["reason"] for p in node.an.processes() if p["pid"] == 11)


def test_the_forward_pass_stack_stops_describing_a_rank_whose_cpu_and_gpu_went_still():
    node, r0 = _rank_reading_as_it_computes()
    r0.state, r0.wchan, r0.cpu_ticks_per_s, r0.read_per_s = "S", "futex_do_wait", 0, 0
    node.run(8)  # the rates' window, then the dwell
    assert "running its model" not in next(p["reason"] for p in node.an.processes() if p["pid"] == 11)


def _process(main: list[tuple[str, str]], **others: list[tuple[str, str]]) -> stackcat.Verdict:
    ths = [ThreadStack(tid=1, name="MainThread", active=False, owns_gil=False,
                       frames=[Frame(name=n, filename=f, line=1) for f, n in main])]
    for i, (name, frames) in enumerate(others.items()):
        ths.append(ThreadStack(tid=2 + i, name=name, active=False, owns_gil=False,
                               frames=[Frame(name=n, filename=f, line=1) for f, n in frames]))
    return stackcat.classify([StackSample(pid=1, threads=ths)])


QUEUE_GET = [("threading.py", "Condition.wait"), ("queue.py", "Queue.get"), ("server.py", "serve")]
EVENT_WAIT = [("threading.py", "Condition.wait"), ("threading.py", "Event.wait"), ("server.py", "serve")]
ACCEPT = [("socket.py", "socket.accept"), ("server.py", "listener"), ("threading.py", "Thread.run")]
ZMQ = [("zmq/sugar/socket.py", "Socket.recv_pyobj"), ("server.py", "recv_loop"), ("threading.py", "Thread.run")]
POOL = [("threading.py", "Condition.wait"), ("queue.py", "Queue.get"), ("concurrent/futures/thread.py", "_worker")]


def test_a_queue_read_fed_by_a_thread_that_waits_for_outside_input_waits_for_requests():
    # an inference server's scheduling loop polls the queue its listener thread fills (seen on an
    # H200: the GPU's broadcast to rank 1 looked stuck, and an idle server opened an nccl_stall)
    v = _process(QUEUE_GET, listener=ACCEPT)
    assert v.kind == "request_wait" and "listener" in v.why, v
    assert _process(QUEUE_GET, zmq_recv=ZMQ).kind == "request_wait"
    # a queue its own pool fills, or an event, is the rank's own wait, listener or not
    assert _process(QUEUE_GET, worker=POOL).kind == "lock_wait"
    assert _process(EVENT_WAIT, listener=ACCEPT).kind == "lock_wait"
    assert _process(QUEUE_GET).kind == "lock_wait"


# An import Python's machinery runs (innermost first), then who asked for it: the flag is whether
# the frame's full path lies in the stdlib or site-packages (py-spy's short name hides it).
IMPORT = [("<frozen importlib._bootstrap>", "_call_with_frames_removed", True),
          ("<frozen importlib._bootstrap>", "_find_and_load", True)]
IMPORT_MODULE = [*IMPORT, ("importlib/__init__.py", "import_module", True)]
MAIN = [("train.py", "main", False), ("train.py", "<module>", False)]


def _frames(frames: list[tuple[str, str, bool]]) -> list[Frame]:
    return [Frame(name=n, filename=f, line=1, library=lib) for f, n, lib in frames]


def _import_verdict(frames: list[tuple[str, str, bool]]) -> stackcat.Verdict:
    th = ThreadStack(tid=1, name="MainThread", active=True, owns_gil=True, frames=_frames(frames))
    return stackcat.classify([StackSample(pid=1, threads=[th])])


def test_an_import_a_library_call_of_its_own_code_makes_is_work_not_start_up():
    # DDP's constructor importing torch._dynamo through torch's lazy attribute (seen on an H200:
    # the rank read `starting` 9 s into its training)
    ddp = [*IMPORT_MODULE, ("torch/__init__.py", "__getattr__", True),
           ("torch/nn/parallel/distributed.py", "DistributedDataParallel.__init__", True), ("train.py", "train", False),
           *MAIN]
    v = _import_verdict(ddp)
    assert v.kind == "lazy_import" and "DistributedDataParallel.__init__" in (v.frame or ""), v
    # a DataLoader's first iterator importing its worker machinery, straight from the import statement
    assert _import_verdict([*IMPORT, ("torch/utils/data/dataloader.py", "DataLoader.__iter__", True),
                            ("train.py", "fit", False), *MAIN]).kind == "lazy_import"
    # the job's own package calling a library (its code outside site-packages, in a package of its own)
    assert _import_verdict([*IMPORT, ("transformers/pipelines/__init__.py", "pipeline", True),
                            ("myjob/serve.py", "Server.load", False), ("myjob/serve.py", "main", False)]
                           ).kind == "lazy_import"


def test_imports_of_its_own_start_up_stay_start_up():
    # from its script's top level, from one of its functions, through a lazy module's attribute
    # (``from transformers import AutoModel`` inside main), or by a library's module being imported
    assert _import_verdict([*IMPORT, ("train.py", "<module>", False)]).kind == "unknown"
    assert _import_verdict([*IMPORT, *MAIN]).kind == "unknown"
    assert _import_verdict([*IMPORT_MODULE, ("transformers/utils/import_utils.py", "_LazyModule.__getattr__", True),
                            *MAIN]).kind == "unknown"
    assert _import_verdict([*IMPORT, ("torch/__init__.py", "<module>", True), *IMPORT, *MAIN]).kind == "unknown"
    # all library, no code of its own below (a server installed as a package): nothing to say
    assert _import_verdict([*IMPORT, ("sglang/srt/managers/scheduler.py", "run_scheduler_process", True),
                            ("multiprocessing/process.py", "BaseProcess.run", True)]).kind == "unknown"


def _young_rank_in(frames: list[tuple[str, str, bool]]) -> Node:
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, state="R", wchan="0", cpu_ticks_per_s=98, start=1000.0)
    r1 = P(12, 10, torchrun_env(1, 2), gpu=1, state="R", wchan="0", cpu_ticks_per_s=98, start=1000.0)
    node = Node([P(10, 1), r0, r1])
    node.run(3)
    for pid in (11, 12):
        node.pending_stacks.append(StackSample(pid=pid, threads=[ThreadStack(
            tid=pid, name="MainThread", active=True, owns_gil=True, frames=_frames(frames))]))
    node.run(3)
    return node


def test_a_young_rank_importing_for_a_library_call_works_and_one_importing_to_start_stays_starting():
    ddp = [*IMPORT_MODULE, ("torch/__init__.py", "__getattr__", True),
           ("torch/nn/parallel/distributed.py", "DistributedDataParallel.__init__", True), ("train.py", "train", False),
           *MAIN]
    node = _young_rank_in(ddp)
    assert node.state(11) == "busy", node.an.processes()
    assert _young_rank_in([*IMPORT, *MAIN]).state(11) == "starting"


def _server_whose_scheduler_reads_its_queue(exception: bool, broadcasts_go_on: bool = False) -> Node:
    """Rank 0 schedules: its main thread reads a queue that its listener thread (in accept()) fills,
    and its handler thread's results; rank 1 waits for it in a broadcast. With ``exception``, the
    handler thread dies on one as the job goes still (seen on an H200: no incident, an idle server)."""
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, look="work", log="/job/log0", dist_threads=["pt_nccl_watchdg"])
    r1 = P(12, 10, torchrun_env(1, 2), gpu=1, look="work", log="/job/log1", dist_threads=["pt_nccl_watchdg"])
    node = Node([P(10, 1), r0, r1])
    for _ in range(10):
        node.write_log("/job/log0", "request done\n")
        node.run(1)
    if exception:
        node.write_log("/job/log0", 'Exception in thread handler:\nTraceback (most recent call last):\n  File "s.py", '
                       'line 9, in run\nRuntimeError: mat1 and mat2 shapes cannot be multiplied (4x2048 and 4096x16)\n')
    r0.look, r1.look = "idle", "spin"
    if broadcasts_go_on:  # it still broadcasts its empty batches: rank 1 wakes in each of them
        r1.look, r1.vol_per_s = "idle", 20
    r0.state, r0.wchan = "S", "futex_do_wait"
    node.pending_stacks.append(StackSample(pid=11, threads=[
        ThreadStack(tid=11, name="MainThread", active=False, owns_gil=False,
                    frames=[Frame(name=n, filename=f, line=1) for f, n in QUEUE_GET]),
        ThreadStack(tid=13, name="listener", active=False, owns_gil=False,
                    frames=[Frame(name=n, filename=f, line=1) for f, n in ACCEPT])]))
    node.stack(12, [("torch/distributed/distributed_c10d.py", "broadcast"), ("server.py", "loop")])
    node.run(40)
    return node


def test_a_scheduler_reading_its_queue_as_an_exception_is_logged_is_a_hang_not_an_idle_server():
    hung = _server_whose_scheduler_reads_its_queue(exception=True)
    hangs = [i for i in hung.an.incidents() if i.kind in ("nccl_stall", "host_stall")]
    assert len(hangs) == 1 and hangs[0].culprit_ranks == [0], [(i.kind, i.culprit_ranks) for i in hung.an.incidents()]
    assert "mat1 and mat2 shapes cannot be multiplied" in hangs[0].summary
    assert hung.state(11) == "hung"
    idle = _server_whose_scheduler_reads_its_queue(exception=False)
    assert not [i for i in idle.an.incidents() if i.kind in ("nccl_stall", "host_stall", "straggler")], \
        [i.kind for i in idle.an.incidents()]
    assert idle.state(11) == "idle" and idle.state(12) == "idle", idle.an.processes()
    # a request that failed with a traceback, the server still polling and broadcasting: idle, no hang
    served = _server_whose_scheduler_reads_its_queue(exception=True, broadcasts_go_on=True)
    assert not [i for i in served.an.incidents() if i.kind in ("nccl_stall", "host_stall", "straggler")], \
        [(i.kind, i.summary[:120]) for i in served.an.incidents()]
    assert served.state(12) == "idle", served.an.processes()


def test_only_a_queue_read_taken_for_a_wait_for_requests_counts_as_fed_from_outside():
    assert stackcat.fed_from_outside(_process(QUEUE_GET, listener=ACCEPT))
    assert not stackcat.fed_from_outside(_process(QUEUE_GET))
    assert not stackcat.fed_from_outside(_process([("socket.py", "socket.accept"), ("server.py", "serve")]))
