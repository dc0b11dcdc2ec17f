"""Job identity and rank discovery: a job is one launch; ranks are found under any parent."""

from __future__ import annotations

from .builders import Node, P, torchrun_env

GPU_MEM = 20 << 30


def ranks_by_job(node: Node) -> dict[str, dict[str, int]]:
    return {j["job"]: j["ranks"] for j in node.jobs()}


def test_back_to_back_torchrun_launches_with_the_default_run_id_are_two_jobs():
    first = [P(101, 100, torchrun_env(0, 2), gpu=0, look="work"), P(102, 100, torchrun_env(1, 2), gpu=1, look="work")]
    node = Node([P(100, 1, {}, cmdline=["torchrun", "train.py"]), *first])
    node.run(8)
    for p in first:
        node.kill(p.pid)
    node.kill(100)
    node.run(2)
    second = [P(201, 200, torchrun_env(0, 2), gpu=0, look="work"), P(202, 200, torchrun_env(1, 2), gpu=1, look="work")]
    node.procs.update({200: P(200, 1, {}, cmdline=["torchrun", "train.py"]), **{p.pid: p for p in second}})
    node.run(15)
    jobs = ranks_by_job(node)
    assert list(jobs.values()) == [{"0": 201, "1": 202}], jobs  # numbered 0 and 1, not 2 and 3
    assert not node.kinds(), node.kinds()  # a clean end is not rank_exited; the new start is not either


def test_two_processes_with_the_same_rank_are_never_one_job():
    # same rendezvous, same run id, but two launchers: two launches
    a = [P(11, 10, torchrun_env(0, 1, run_id="exp")), P(21, 20, torchrun_env(0, 1, run_id="exp"))]
    node = Node([P(10, 1), P(20, 1), *[P(p.pid, p.ppid, p.env, gpu=i, look="work") for i, p in enumerate(a)]])
    node.run(3)
    jobs = ranks_by_job(node)
    assert len(jobs) == 2 and all(r == {"0": p} for r, p in zip(jobs.values(), (11, 21), strict=True)), jobs


def test_a_non_default_run_id_and_restart_count_key_the_job():
    env0 = torchrun_env(0, 2, run_id="llama-7b", TORCHELASTIC_RESTART_COUNT="2")
    node = Node([P(5, 1), P(6, 5, env0, gpu=0, look="work"),
                 P(7, 5, torchrun_env(1, 2, run_id="llama-7b", TORCHELASTIC_RESTART_COUNT="2"), gpu=1, look="work")])
    node.run(3)
    (job,) = node.jobs()
    assert job["identity"]["run_id"] == "llama-7b" and job["identity"]["restart"] == "2"
    assert "launcher" not in job["identity"]  # a unique run id needs no launcher to tell launches apart
    assert job["rank_from"] == {"0": "environment RANK", "1": "environment RANK"}


def test_ranks_under_a_parent_that_holds_a_gpu_are_shown():
    """A notebook or driver that touched CUDA launched torchrun: its ranks are still ranks."""
    node = Node([P(50, 1, {}, cmdline=["python", "notebook.py"], gpu=0, gpu_mem=1 << 30),
                 P(51, 50, {}, cmdline=["torchrun", "x.py"]),
                 P(52, 51, torchrun_env(0, 2), gpu=0, look="work"), P(53, 51, torchrun_env(1, 2), gpu=1, look="work")])
    node.run(6)
    ranks = {j["job"]: j["ranks"] for j in node.jobs()}
    job = next(r for r in ranks.values() if "0" in r and r["0"] == 52)
    assert job == {"0": 52, "1": 53}
    assert node.state(52) == "busy" and node.state(53) == "busy"


def test_multiprocessing_workers_with_the_rank_as_an_argument_are_one_job_ordered_by_gpu():
    """SGLang/vLLM: a launcher without GPU spawns one worker per GPU, rank as an argument."""
    spawn = ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()", "--multiprocessing-fork"]
    node = Node([P(70, 1, {}, cmdline=["python", "-m", "sglang.launch_server"]),
                 P(72, 70, {}, cmdline=spawn, gpu=1, look="work"), P(71, 70, {}, cmdline=spawn, gpu=0, look="work"),
                 P(73, 70, {}, cmdline=["python", "detokenizer"])])  # no GPU, no threads: not a rank
    node.run(6)
    (job,) = node.jobs()
    assert job["ranks"] == {"0": 71, "1": 72}
    assert job["rank_from"] == {"0": "GPU index order", "1": "GPU index order"}


def test_process_titles_name_the_rank():
    node = Node([P(80, 1, {}, cmdline=["python", "-m", "sglang.launch_server"]),
                 P(81, 80, {}, comm="sglang::schedul", cmdline=["sglang::scheduler_TP1"], gpu=0, look="work"),
                 P(82, 80, {}, comm="sglang::schedul", cmdline=["sglang::scheduler_TP0"], gpu=1, look="work")])
    node.run(4)
    (job,) = node.jobs()
    assert job["ranks"] == {"1": 81, "0": 82}
    assert set(job["rank_from"].values()) == {"process title or command line"}


def test_cpu_only_workers_found_by_their_gloo_threads():
    gloo = ["gloo_tcp_loop", "pt_gloo_runloop"]
    node = Node([P(90, 1, {}, cmdline=["python", "server.py"]),
                 P(91, 90, {}, dist_threads=gloo), P(92, 90, {}, dist_threads=gloo)])
    node.run(4)
    (job,) = node.jobs()
    assert sorted(job["ranks"].values()) == [91, 92]


def test_data_loader_and_compile_workers_are_not_ranks():
    env = torchrun_env(0, 1)
    node = Node([P(30, 1), P(31, 30, env, gpu=0, look="work"),
                 P(32, 31, env, cmdline=["python", "-c", "dataloader worker"]),  # inherits RANK=0
                 P(33, 31, env, gpu=0, gpu_mem=500 << 20)])  # touched CUDA, same rank: still a child
    node.run(4)
    (job,) = node.jobs()
    assert job["ranks"] == {"0": 31}


def test_a_gpu_holding_child_with_its_own_gpu_and_nccl_threads_is_a_rank():
    """vLLM's driver worker runs rank 0 in the engine process and spawns ranks 1..N-1."""
    node = Node([P(40, 1, {}, cmdline=["python", "-m", "vllm.entrypoints.api_server"], gpu=0, look="work",
                   dist_threads=["pt_nccl_watchdg"]),
                 P(41, 40, {}, gpu=1, look="work", dist_threads=["pt_nccl_watchdg"])])
    node.run(4)
    (job,) = node.jobs()
    assert sorted(job["ranks"].values()) == [40, 41]


def _node_env(rank: int, node_rank: int, **extra: str) -> dict[str, str]:
    """What torchrun --nnodes 2 --nproc-per-node 2 gives a worker (local_elastic_agent's env): four
    ranks, two per node, the rendezvous address of node rank 0."""
    return torchrun_env(rank, 4, port=29400, LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2", GROUP_RANK=str(node_rank),
                        GROUP_WORLD_SIZE="2", ROLE_RANK=str(rank), ROLE_WORLD_SIZE="4", **extra)


def _two_node_job(launcher_a: int, launcher_b: int, **extra: str) -> tuple[Node, Node]:
    """The same two-node job as each node sees it: other pids, other launchers, its own two ranks."""
    a = Node([P(launcher_a, 1, {}, cmdline=["torchrun", "--nnodes", "2"]),
              P(launcher_a + 1, launcher_a, _node_env(0, 0, **extra), gpu=0, look="work"),
              P(launcher_a + 2, launcher_a, _node_env(1, 0, **extra), gpu=1, look="work")])
    b = Node([P(launcher_b, 1, {}, cmdline=["torchrun", "--nnodes", "2"]),
              P(launcher_b + 1, launcher_b, _node_env(2, 1, **extra), gpu=0, look="work"),
              P(launcher_b + 2, launcher_b, _node_env(3, 1, **extra), gpu=1, look="work")])
    for n in (a, b):
        n.run(3)
    return a, b


def test_a_job_on_two_nodes_gets_the_same_key_on_both_made_of_what_they_share():
    a, b = _two_node_job(100, 700)
    (ja,), (jb,) = a.jobs(), b.jobs()
    assert ja["job"] == jb["job"] == "rdzv:127.0.0.1:29400", (ja, jb)
    assert ja["identity"] == jb["identity"] == {"rendezvous": "127.0.0.1:29400"}  # no launcher: it differs per node
    assert ja["spans_nodes"] == "WORLD_SIZE 4 > LOCAL_WORLD_SIZE 2" and ja["world_size"] == 4
    assert ja["ranks"] == {"0": 101, "1": 102} and jb["ranks"] == {"2": 701, "3": 702}


def test_a_two_node_job_key_takes_the_run_id_restart_and_scheduler_ids():
    a, b = _two_node_job(100, 700, TORCHELASTIC_RUN_ID="llama", TORCHELASTIC_RESTART_COUNT="1")
    assert a.jobs()[0]["job"] == b.jobs()[0]["job"] == "te:llama/r1"
    assert a.jobs()[0]["identity"] == {"run_id": "llama", "rendezvous": "127.0.0.1:29400", "restart": "1"}
    a, b = _two_node_job(100, 700, SLURM_JOB_ID="4242", SLURM_NNODES="2")
    assert a.jobs()[0]["job"] == b.jobs()[0]["job"] == "slurm:4242"
    a, b = _two_node_job(100, 700, JOBSET_NAME="pretrain-7b")
    assert a.jobs()[0]["job"] == b.jobs()[0]["job"] == "jobset:pretrain-7b"
    assert a.jobs()[0]["identity"]["jobset"] == "pretrain-7b"


def test_a_single_node_job_is_still_keyed_per_launch_and_says_nothing_of_nodes():
    node = Node([P(100, 1), P(101, 100, torchrun_env(0, 2), gpu=0, look="work"),
                 P(102, 100, torchrun_env(1, 2, LOCAL_WORLD_SIZE="2"), gpu=1, look="work")])
    node.run(3)
    (job,) = node.jobs()
    assert job["job"] == "rdzv:127.0.0.1:29500@100" and job["identity"]["launcher"] == "100"
    assert "spans_nodes" not in job


def test_two_launches_of_one_multi_node_rank_on_one_node_are_still_two_jobs():
    # the same rank twice under one rendezvous (a stale launch beside a new one): split by launcher
    node = Node([P(10, 1), P(20, 1), P(11, 10, _node_env(0, 0), gpu=0, look="work"),
                 P(21, 20, _node_env(0, 0), gpu=1, look="work")])
    node.run(3)
    jobs = node.jobs()
    assert len(jobs) == 2 and all("spans_nodes" not in j for j in jobs), jobs


def test_slurm_nodes_and_mpi_local_sizes_say_a_job_spans_nodes():
    from hangd.analysis.identity import spans_nodes
    assert spans_nodes({"SLURM_NNODES": "4"}) == "SLURM_NNODES 4"
    assert spans_nodes({"OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}).startswith("OMPI")
    assert spans_nodes({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8", "SLURM_NNODES": "1"}) is None
    assert spans_nodes({"WORLD_SIZE": "x", "LOCAL_WORLD_SIZE": "2"}) is None


def test_rank_0_that_started_ranks_given_as_arguments_is_one_job_with_them_before_their_threads():
    # vLLM's shape (and the matrix's "parent" launcher): the engine process is rank 0 and starts
    # ranks 1..N-1 with the rank as an argument; none runs gloo or NCCL threads yet
    node = Node([P(50, 1, {}, cmdline=["python", "serve.py"], role="worker"),
                 P(51, 50, {}, cmdline=["python", "worker.py", "--rank", "1"], role="worker"),
                 P(52, 50, {}, cmdline=["python", "worker.py", "--rank", "2"], role="worker"),
                 P(53, 51, {}, cmdline=["python", "worker.py", "--rank", "1"], role="child")])  # its DataLoader fork
    node.run(4)
    (job,) = node.jobs()
    assert job["ranks"] == {"0": 50, "1": 51, "2": 52}
