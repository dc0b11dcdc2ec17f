"""Traces recorded with `hangd record` on 2 real H200s (tests/data/traces/h200x2-live), replayed.

Each scenario's ground truth comes from the ranks themselves (they log their phase as they change
it) and from the driver's actions (SIGKILL the launcher, SIGSTOP or SIGKILL a rank)."""

from __future__ import annotations

import json

import pytest

from hangd.evaluate import expect_problems, score
from hangd.incidents import HANG_KINDS
from hangd.replay import replay_result

from ..conftest import DATA, PLANTED_SECRET
from ..replays import replayed

LIVE = DATA / "traces" / "h200x2-live"
EXPECT = {
    # scenario: (incident kinds, culprit ranks of the first incident)
    "nccl_stall": (["nccl_stall"], [1]),
    "straggler": (["straggler"], [1]),
    "orphan": (["orphaned_gpu_memory"], [0, 1]),
    "compile": (["nccl_stall"], [0]),  # after compiling, a wall-clock-bounded loop desyncs the ranks
    "mismatch": (["collective_mismatch"], [1]),
    "sigstop": (["nccl_stall"], [1]),
    "kill": (["rank_exited"], [1]),
    # recorded on one H200: two ranks on the one GPU, gloo between them on CUDA tensors; rank 1 stops
    # calling collectives, rank 0 blocks in all_reduce host-side while the GPU idles
    "../h200x1-live/gloo_cuda_stall": (["host_stall"], [1]),
}
_cache: dict[str, dict] = {}


def replay(name: str) -> dict:
    if name not in _cache:
        an, _ = replayed(LIVE / name)
        _cache[name] = replay_result(an)
    return _cache[name]


def hang_start(name: str) -> float | None:
    lines = [json.loads(x) for x in (LIVE / name / "truth.jsonl").read_text().splitlines()]
    hung = [x["t"] for x in lines if x["state"] in ("hung", "gone")]
    return min(hung) if hung else None


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_accuracy_on_live_gpu_traces(name):
    sc = score(str(LIVE / name), replay(name)["states"])
    assert sc["accuracy"] >= 0.95, (name, {p: d["wrong"] for p, d in sc["per_pid"].items()})


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_incidents_and_culprits_on_live_gpu_traces(name):
    kinds, culprits = EXPECT[name]
    incs = replay(name)["incidents"]
    assert [i["kind"] for i in incs] == kinds
    assert incs[0]["culprit_ranks"] == culprits
    start = hang_start(name)
    if kinds[0] in HANG_KINDS or kinds[0] == "rank_exited":
        assert start is not None and incs[0]["opened_at"] - start <= 15.0, incs[0]["opened_at"] - start


def test_states_seen_on_live_gpu_traces():
    seen = {name: {s["state"] for s in replay(name)["states"]} for name in EXPECT}
    assert {"waiting_peer", "straggler"} <= seen["straggler"]
    assert "orphaned" in seen["orphan"]
    assert "compiling" in seen["compile"]
    assert "hung" in seen["sigstop"] and "hung" in seen["kill"]


def test_mismatch_finding_names_the_sizes():
    f = [x for x in replay("mismatch")["findings"] if x["kind"] == "size_mismatch"]
    assert len(f) == 1 and f[0]["seq"] == 50
    assert f[0]["sizes"] == {"0": [[1 << 20]], "1": [[1 << 24]]}


def test_nccl_stall_live_names_the_sequence():
    inc = replay("nccl_stall")["incidents"][0]
    miss = [f for f in inc["findings"] if f["kind"] == "missing_rank"]
    assert miss and miss[0]["missing_ranks"] == [1] and miss[0]["op"] == "nccl:all_reduce"
    assert f"all_reduce #{miss[0]['seq']}" in inc["summary"]


def test_recorded_traces_hold_no_secret():
    for p in LIVE.rglob("*"):
        if p.is_file():
            assert PLANTED_SECRET.encode() not in p.read_bytes(), p


# Hugging Face transformers tensor parallelism under plain torchrun (tests/data/traces/h200x2-hf):
# jobs nobody here wrote; the false alarms they raised are what these pin down.
HF = DATA / "traces" / "h200x2-hf"
HF_EXPECT = {
    "healthy": ([], None),
    "back_to_back": ([], None),
    "slow_load": ([], None),  # the slow reader loads, its peer waits once: a phase, not a straggler
    "worker_died": (["nccl_stall", "orphaned_gpu_memory"], [1]),
    "gloo_handshake": (["host_stall"], [1]),
}


HF2 = DATA / "traces" / "h200x2-hf2"  # the same scenarios recorded again, with today's sources
# ... and on one H200: both ranks share the GPU, NCCL between them over sockets (each its own
# NCCL_HOSTID). Generation then drives the GPU at util 99% with SM 2% and DRAM under 1%: it read as
# a spinning kernel, and the healthy run opened a critical nccl_stall.
HF1 = DATA / "traces" / "h200x1-hf"
HF1B = DATA / "traces" / "h200x1-hf2"  # the same again, live under the serve that had the fix
# ... and again, a later round: its slow loader had opened a straggler warning live (one long wait in
# the barrier, then work: a phase, not a straggler)
HF1C = DATA / "traces" / "h200x1-hf3"
HF_RUNS = [(d, n) for d in (HF, HF2, HF1, HF1B, HF1C) for n in sorted(HF_EXPECT)]


def replay_hf(name: str, where=HF) -> dict:
    key = f"{where.name}:{name}"
    if key not in _cache:
        an, _ = replayed(where / name)
        _cache[key] = replay_result(an)
    return _cache[key]


@pytest.mark.parametrize(("where", "name"), HF_RUNS, ids=[f"{d.name}-{n}" for d, n in HF_RUNS])
def test_accuracy_on_hf_tensor_parallel_traces(where, name):
    sc = score(str(where / name), replay_hf(name, where)["states"])
    assert sc["accuracy"] >= 0.95, (name, {p: d["wrong"] for p, d in sc["per_pid"].items()})


@pytest.mark.parametrize(("where", "name"), HF_RUNS, ids=[f"{d.name}-{n}" for d, n in HF_RUNS])
def test_incidents_on_hf_tensor_parallel_traces(where, name):
    kinds, culprits = HF_EXPECT[name]
    incs = replay_hf(name, where)["incidents"]
    if where in (HF2, HF1, HF1B, HF1C) and name == "worker_died":
        kinds = ["nccl_stall"]  # torn down with its launcher: nothing left holding memory
    if (where / name / "expect.json").exists():
        assert expect_problems(json.loads((where / name / "expect.json").read_text()), incs, HANG_KINDS) == []

    assert [i["kind"] for i in incs] == kinds, [(i["kind"], i["summary"][:200]) for i in incs]
    if culprits is not None:
        assert incs[0]["culprit_ranks"] == culprits
    lines = [json.loads(x) for x in (where / name / "truth.jsonl").read_text().splitlines()]
    hung = [x["t"] for x in lines if x["state"] == "hung"]
    if hung:
        assert incs[0]["opened_at"] - min(hung) <= 15.0


def test_the_dead_worker_thread_s_exception_is_the_probable_cause():
    inc = replay_hf("worker_died")["incidents"][0]
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x4096 and 2048x32000)" in inc["summary"]
    assert inc["evidence"]["exceptions"][-1]["line"].startswith("RuntimeError: mat1 and mat2")
    assert "TORCH_FR_BUFFER_SIZE" in inc["next_step"]  # these jobs ran without the flight recorder


def test_back_to_back_launches_are_two_jobs_with_ranks_0_and_1():
    states = replay_hf("back_to_back")["states"]
    jobs: dict[str, set[int]] = {}
    for s in states:
        jobs.setdefault(s["job"], set()).add(s["rank"])
    assert len(jobs) == 2 and all(r == {0, 1} for r in jobs.values()), jobs
