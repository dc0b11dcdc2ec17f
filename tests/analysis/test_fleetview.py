"""The cross-rank judgments over every node's flight-recorder rows: who is behind, which collective a
rank completed, and which finding stands once every node's dumps are in."""

from __future__ import annotations

import pytest

from hangd.analysis.fleetview import behind_furthest, newest_completed, standing_findings


def test_a_rank_is_behind_the_furthest_rank_of_its_own_group():
    # pg 0: ranks at #399, #399, #398 (one never entered #399); pg 1 apart, ahead of all of them
    got = behind_furthest([("0", 399), ("0", 399), ("0", 398), ("1", 1200), ("1", 1190)])
    assert got == [0, 0, 1, 0, 10]


def test_a_rank_whose_newest_collective_is_unknown_is_not_called_behind():
    assert behind_furthest([("0", None), ("0", 5)]) == [None, 0]
    assert behind_furthest([("0", None)]) == [None]
    assert behind_furthest([]) == []


@pytest.mark.parametrize(("said", "done", "want"), [
    (61, 60, 61),        # the group status is newer than the entries kept
    (59, 60, 60),        # the ring buffer holds a newer completed entry
    (None, 60, 60),
    (61, None, 61),
    (None, None, None),
    (-1, None, None),    # -1: nothing completed yet
    (True, None, None),  # a bool is not a sequence number
    ("61", 7, 7),        # nor a string
])
def test_the_newest_completed_collective_is_the_newest_either_source_says(said, done, want):
    assert newest_completed(said, done) == want


def _f(kind: str, pg: str = "0", seq: int | None = 61) -> dict:
    return {"incident": 1, "kind": kind, "pg": pg, "seq": seq, "message": f"{kind} {pg}#{seq}"}


def test_a_missing_rank_overrules_stuck_on_the_same_collective_only():
    stuck, missing = _f("stuck"), _f("missing_rank")
    other_seq, other_pg = _f("stuck", seq=60), _f("stuck", pg="1")
    mismatch = _f("size_mismatch")
    got = standing_findings([stuck, other_seq, missing, other_pg, mismatch])
    assert got == [other_seq, missing, other_pg, mismatch]


def test_stuck_stands_while_no_rank_is_missing():
    findings = [_f("stuck"), _f("op_mismatch", seq=62)]
    assert standing_findings(findings) == findings
