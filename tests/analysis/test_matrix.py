"""The job matrix (tests/data/traces/matrix-*/), replayed: every cell must be right per second and about
its incidents.

Each cell is a real 2-rank job (torch.distributed on gloo on the CPU, NCCL on a GPU host) that crosses
four axes (launcher, phase, fault, how the culprit waits), recorded with `hangd record` by
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
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from hangd.evaluate import expect_problems, gap_key, is_check_cell, score
from hangd.incidents import HANG_KINDS
from hangd.replay import replay_result, run_replay
from tests.conftest import DATA

CELLS = sorted(p.parent for p in (DATA / "traces").glob("matrix-*/*/expect.json"))
GAPS: dict[str, dict[str, Any]] = json.loads((Path(__file__).parent / "matrix_gaps.json").read_text())
BAR = 0.95


def _gap(d: Path) -> dict[str, Any]:
    return GAPS.get(f"{d.parent.name}/{d.name}", {"accuracy": BAR, "problems": []})


def _id(d: Path) -> str:
    return f"{d.parent.name}/{d.name}" + (" [check]" if is_check_cell(d.name) else "")


@cache
def replay(d: Path) -> dict[str, Any]:
    an, _ = run_replay(str(d))
    return replay_result(an)


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
