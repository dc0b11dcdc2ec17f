"""The job matrix (tests/data/traces/matrix-*/), replayed: every cell must be right per second and about
its incidents.

Each cell is a real job of 2 ranks, or 4 or 8 (torch.distributed on gloo on the CPU, NCCL on a GPU
host) that crosses five axes (launcher, phase, fault, how the culprit waits, world size), recorded with `hangd record` by
scripts/matrix.py, with the ranks' own truth and what a good diagnosis must say (expect.json). A
quarter of the cells is the check set (`is_check_cell`): they are judged here like the others, and
reported apart by `python scripts/matrix.py --score`.

Not every cell meets the bar yet. ``matrix_gaps.json`` (written by `python scripts/matrix.py --gaps`)
holds, for each cell that does not, its accuracy and the expectations it misses as measured: such a
cell must do no worse, every other cell must meet the bar, and a cell that improves is written
again. The file is the list of what is still wrong, in the open.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hangd.evaluate import expect_problems, gap_key, is_check_cell, score
from hangd.incidents import HANG_KINDS
from tests.conftest import DATA
from tests.replays import result

CELLS = sorted(p.parent for p in (DATA / "traces").glob("matrix-*/*/expect.json"))
GAPS: dict[str, dict[str, Any]] = json.loads((Path(__file__).parent / "matrix_gaps.json").read_text())
BAR = 0.95


def _gap(d: Path) -> dict[str, Any]:
    return GAPS.get(f"{d.parent.name}/{d.name}", {"accuracy": BAR, "problems": []})


def _id(d: Path) -> str:
    return f"{d.parent.name}/{d.name}" + (" [check]" if is_check_cell(d.name) else "")


def replay(d: Path) -> dict[str, Any]:
    return result(d)  # once a session: test_baseline.py judges the same replay


def test_the_matrix_is_there() -> None:
    """At least 60 cells on the CPU, a quarter of them (by the hash) in the check set."""
    cpu = [d for d in CELLS if d.parent.name == "matrix-cpu"]
    assert len(cpu) >= 60
    check = [d for d in cpu if is_check_cell(d.name)]
    assert 0.1 * len(cpu) <= len(check) <= 0.4 * len(cpu)


@pytest.mark.parametrize("d", CELLS, ids=_id)
def test_cell_states_per_second(d: Path) -> None:
    sc = score(str(d), replay(d)["states"])
    wrong = {pid: v["wrong"][:8] for pid, v in sc["per_pid"].items() if v["accuracy"] < 1.0}
    floor = min(BAR, _gap(d)["accuracy"])
    assert sc["accuracy"] >= floor, f"{sc['accuracy']:.3f} < {floor}; wrong (second, truth, said): {wrong}"


@pytest.mark.parametrize("d", CELLS, ids=_id)
def test_cell_incidents(d: Path) -> None:
    expect = json.loads((d / "expect.json").read_text())
    incidents = replay(d)["incidents"]
    problems = {gap_key(p) for p in expect_problems(expect, incidents, HANG_KINDS)}
    new = problems - set(_gap(d)["problems"])
    assert not new, f"{sorted(new)}; incidents: {[(i['kind'], i.get('culprit_ranks'), i.get('summary')) for i in incidents]}"


def test_the_gaps_file_names_only_cells_that_exist():
    names = {f"{d.parent.name}/{d.name}" for d in CELLS}
    assert set(GAPS) <= names, sorted(set(GAPS) - names)


def test_expect_problems_finds_each_mistake() -> None:
    """The judge itself: each way an incident list can miss an expect.json is reported."""
    hang = {"hang": True, "incident_kind": "host_stall", "culprit_rank": 1, "summary_quotes": "mat1 and mat2",
            "summary_names_pid": 4242, "must_not_open": ["straggler"]}
    right = {"kind": "host_stall", "culprit_ranks": [1], "summary": "rank 1 waits for pid 4242: mat1 and mat2 ..."}
    assert expect_problems(hang, [right], HANG_KINDS) == []
    assert expect_problems(hang, [], HANG_KINDS) == ["missed hang (incidents: [])"]
    assert expect_problems(hang, [{**right, "culprit_ranks": [0]}], HANG_KINDS) == ["culprit [0] != 1"]
    assert expect_problems(hang, [{**right, "summary": "rank 1 waits for pid 4242"}], HANG_KINDS) == \
        ["cause not quoted ('mat1 and mat2')"]
    assert expect_problems(hang, [{**right, "summary": "mat1 and mat2"}], HANG_KINDS) == \
        ["pid 4242 (what the culprit waits on) not named"]
    assert expect_problems(hang, [{**right, "kind": "nccl_stall"}], HANG_KINDS) == \
        ["no host_stall incident (got ['nccl_stall'])"]
    assert expect_problems(hang, [right, {"kind": "straggler"}], HANG_KINDS) == ["opened straggler"]
    ok = {"hang": False, "must_not_open": ["nccl_stall", "host_stall", "rank_exited", "straggler"]}
    assert expect_problems(ok, [], HANG_KINDS) == []
    assert expect_problems(ok, [{"kind": "host_stall"}], HANG_KINDS) == ["false hang incident ['host_stall']"]
    assert expect_problems(ok, [{"kind": "straggler"}], HANG_KINDS) == ["opened straggler"]
    # no hang, but an incident of another kind expected (a collective mismatch the flight recorder
    # caught before anything hung): it is the incident wanted, not a false hang
    other = {"hang": False, "incident_kind": "collective_mismatch", "culprit_rank": 1, "fr_seq_in_incident": "398"}
    mismatch = {"kind": "collective_mismatch", "culprit_ranks": [1], "summary": "seq 398: all_reduce against broadcast"}
    assert expect_problems(other, [mismatch], HANG_KINDS) == []
    assert expect_problems(other, [], HANG_KINDS) == ["no collective_mismatch incident (got [])"]
    assert expect_problems(other, [{**mismatch, "summary": "seq 397"}], HANG_KINDS) == ["flight-recorder seq 398 not cited"]
    assert expect_problems(other, [mismatch, {"kind": "nccl_stall"}], HANG_KINDS) == ["false hang incident ['nccl_stall']"]


def test_neutral_paths_keep_the_log_sizes_the_trace_recorded_at_the_same_lines(tmp_path: Path) -> None:
    """A host path in a job's log made shorter or longer by the recorder's neutral one: each size the
    trace recorded of the log still ends at the line it ended at, the last one included (else a
    replay never reads a rank's last words: the exception a hang must quote)."""
    import gzip
    import importlib.util

    spec = importlib.util.spec_from_file_location("matrix_script", Path(__file__).parents[2] / "scripts" / "matrix.py")
    assert spec is not None and spec.loader is not None
    matrix = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(matrix)
    for host in ("/h", "/home/someone/checkouts/this-project"):  # shorter than /opt/job, and longer
        d = tmp_path / host.replace("/", "_")
        (d / "files").mkdir(parents=True)
        lines = [f"[rank0] step {i}\n" for i in range(3)] + [
            f'  File "{host}/tests/workloads/matrix_job.py", line 174, in work\n',
            "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x2048 and 4096x16)\n"]
        log = "".join(lines).encode()
        (d / "files" / "log_0_launcher.log").write_bytes(log)
        (d / "meta.json").write_text(json.dumps({"log_files": {f"{host}/job/launcher.log": "files/log_0_launcher.log"}}))
        cuts = [len("".join(lines[:n]).encode()) for n in range(1, len(lines) + 1)]
        with gzip.open(d / "trace.jsonl.gz", "wt") as f:
            for i, size in enumerate(cuts):
                f.write(json.dumps({"t": float(i), "kind": "file", "path": f"{host}/job/launcher.log", "size": size}) + "\n")
        matrix.neutralize_cell(d, [(host, "/opt/job")])
        neutral = (d / "files" / "log_0_launcher.log").read_bytes()
        with gzip.open(d / "trace.jsonl.gz", "rt") as f:
            sizes = [json.loads(x)["size"] for x in f]
        assert [neutral[:s].decode().splitlines()[-1] for s in sizes] == [x.rstrip("\n").replace(host, "/opt/job") for x in lines]
        assert sizes[-1] == len(neutral) and b"/opt/job/tests" in neutral
