"""A stack that showed a rank asleep in a wait stops describing it once the rank runs on a core.

Stacks are seconds apart. A rank caught in the rendezvous store, a lock, a queue or its workers'
queue that then burns a core for a whole window has left that wait: a process asleep uses no CPU.
Kept, the old stack showed a rank building its model as "waiting on the rendezvous store" until
the next capture (matrix-gpu spawn-serve_poll-none, rank 0: 5 s). A wait in a collective is not
such a wait: CUDA's synchronize and a transport's busy poll spin a core while it waits, and a
server's poll loop may too (an idle SGLang scheduler polls on a whole core unless told to sleep).
Nor is that stale stack proof that the core is its own code: in start-up it may be importing."""

from __future__ import annotations

import pytest

from .builders import ON_CPU, Node, P, logged_cpu_pair, torchrun_env

ASLEEP = dict(state="S", wchan="futex_do_wait", cpu_ticks_per_s=0)
STORE_BARRIER = [("torch/distributed/distributed_c10d.py", "_store_based_barrier"), ("train.py", "main")]
RENDEZVOUS = [("torch/distributed/rendezvous.py", "_create_c10d_store"),
              ("torch/distributed/rendezvous.py", "_tcp_rendezvous_handler"),
              ("torch/distributed/distributed_c10d.py", "init_process_group"), ("serve.py", "rank_main")]
COLLECTIVE = [("torch/distributed/distributed_c10d.py", "all_reduce"), ("train.py", "main")]


def _caught_then(frames: list, then: dict, seconds: int = 4) -> tuple[str | None, str]:
    """A two-rank gloo job on the CPU, set up and training, each rank logging its steps; rank 0
    starts doing ``then``, its stack is taken in ``frames``, and it goes on with ``then`` for
    ``seconds``, writing nothing, while rank 1 goes on."""
    node, r0, _ = logged_cpu_pair()
    assert node.state(11) == "busy"
    r0.wchar_per_s = 0
    for k, v in then.items():
        setattr(r0, k, v)
    node.run(0.25)
    node.stack(11, frames)
    for _ in range(seconds):
        node.write_log("/job/log1", "step\n")
        node.run(1)
    return node.state(11), node.an._track(11).reason


@pytest.mark.parametrize("frames", [STORE_BARRIER, RENDEZVOUS], ids=["store_barrier", "rendezvous"])
def test_a_rank_on_a_core_since_its_stack_showed_it_in_the_store_is_not_waiting_there(frames: list):
    state, reason = _caught_then(frames, ON_CPU)
    assert state == "busy"
    assert "rendezvous store" not in reason, reason
    assert "on CPU" in reason


@pytest.mark.parametrize("frames, then, what", [
    (STORE_BARRIER, ASLEEP, "rendezvous store"),  # asleep in it
    (COLLECTIVE, ON_CPU, "collective"),  # a collective's wait may spin a core
], ids=["asleep_in_the_store", "spinning_in_a_collective"])
def test_a_rank_that_can_still_be_in_its_stack_s_wait_is_in_it(frames: list, then: dict, what: str):
    state, _ = _caught_then(frames, then, seconds=2)
    assert state == "busy"  # its first seconds in the wait: held
    state, reason = _caught_then(frames, then, seconds=12)
    assert state == "waiting_peer"
    assert what in reason, reason


def test_a_stack_of_the_store_is_no_proof_of_own_code_in_start_up():
    """hf_slow_shards rank 0: caught in its process group's creation, then a core for seconds
    importing transformers: still setting up (the matrix's spawn-serve_poll-none rank 0 leaves
    setting up all the same, once past the imports' window)."""
    r0 = P(11, 10, torchrun_env(0, 2), gpu=0, gpu_mem=520 << 20, start=998.0, **ON_CPU)  # type: ignore[arg-type]
    r1 = P(12, 10, torchrun_env(1, 2), gpu=0, gpu_mem=520 << 20, start=998.0, **ON_CPU)  # type: ignore[arg-type]
    node = Node([P(10, 1), r0, r1])
    node.run(1.5)
    node.stack(11, RENDEZVOUS)
    node.run(5)  # 8 s old, 5 s on a core since the stack
    assert node.state(11) == "starting"
