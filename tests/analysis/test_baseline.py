"""No recording gets worse: every recording under tests/data/traces/ with a ground truth, judged
against its entry in tests/data/traces/baseline.json.

The entry (written by `python scripts/baseline.py --write`) holds what the analysis did on the
recording when it was written: its per-second score, the incidents it opened with their culprits,
and whether they meet the recording's expect.json. A recording fails here when it does worse
(scripts/baseline.py `regressions`): a score more than 0.005 under its entry, or under 0.95 where the
entry was at 0.95 or more; an expect.json met no longer met, or missed in more ways; other incidents
or culprits where the entry met its expect.json. A recording that does better passes: write the
baseline again to hold it there. A new recording needs its entry written first.

The other tests judge most of these recordings too; each is replayed once a session
(``tests.replays.result``), and under pytest-xdist each of these tests runs on the worker that
replays its recording for the others (``worker_group`` in tests/conftest.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hangd.evaluate import score

from ..replays import result

_spec = importlib.util.spec_from_file_location("baseline_script", Path(__file__).parents[2] / "scripts" / "baseline.py")
assert _spec is not None and _spec.loader is not None
baseline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(baseline)

NAMES = baseline.recordings()
BASE = baseline.load()


@pytest.mark.parametrize("name", NAMES)
def test_no_recording_gets_worse(name: str) -> None:
    if name not in BASE:
        pytest.fail(f"{name} has no entry in the baseline: {baseline.WRITE_HINT}")
    d = baseline.TRACES / name
    now = baseline.entry(d, result(d))
    worse = baseline.regressions(BASE[name], now)
    if worse:
        wrong = {pid: v["wrong"][:8] for pid, v in score(str(d), result(d)["states"])["per_pid"].items() if v["wrong"]}
        pytest.fail(f"{name} does worse than its baseline entry:\n  " + "\n  ".join(worse)
                    + f"\nnow: {now}\nwrong seconds (second, truth, said): {wrong}"
                    + f"\nIf this is intended (or the recording changed), {baseline.WRITE_HINT}", pytrace=False)


def test_the_baseline_names_only_recordings_that_exist() -> None:
    gone = sorted(set(BASE) - set(NAMES))
    assert not gone, f"entries of recordings that are gone: {gone}; {baseline.WRITE_HINT}"


def test_the_baseline_covers_the_recorded_traces() -> None:
    """Every kind of recording is in it: the job matrix, the real H200 jobs, the held-back ones."""
    groups = {n.split("/", 1)[0] for n in NAMES}
    assert {"matrix-cpu", "matrix-gpu", "h200x2", "h200x2-live", "h200x2-more", "h200x1-live"} <= groups, groups
    assert len(NAMES) >= 200


def test_regressions_finds_each_way_of_getting_worse() -> None:
    met = {"score": 0.97, "seconds": 100, "incidents": ["nccl_stall [1]"], "meets_expect": True}
    assert baseline.regressions(met, met) == []
    assert baseline.regressions(met, {**met, "score": 1.0}) == []
    assert baseline.regressions(met, {**met, "score": 0.966}) == []  # within the slack
    assert baseline.regressions(met, {**met, "score": 0.96}) == ["per-second score 0.960 < 0.970 in the baseline"]
    at_bar = {**met, "score": 0.952}
    assert baseline.regressions(at_bar, {**at_bar, "score": 0.949}) == \
        ["per-second score 0.949 fell under the bar 0.95 (baseline 0.952)"]
    missed = {**met, "meets_expect": False, "problems": ["no nccl_stall incident"]}
    assert baseline.regressions(met, {**missed, "incidents": []}) == [
        "no longer meets expect.json: ['no nccl_stall incident']",
        "incidents (kind [culprit ranks]) changed: ['nccl_stall [1]'] -> []"]
    assert baseline.regressions(met, {**met, "incidents": ["nccl_stall [0]"]}) == \
        ["incidents (kind [culprit ranks]) changed: ['nccl_stall [1]'] -> ['nccl_stall [0]']"]
    # a recording that missed its expect.json: it may open other incidents, not miss more
    assert baseline.regressions(missed, {**missed, "incidents": ["host_stall [1]"]}) == []
    assert baseline.regressions(missed, {**missed, "problems": ["no nccl_stall incident", "opened straggler"]}) == \
        ["misses more of expect.json: ['opened straggler'] (baseline missed ['no nccl_stall incident'])"]
    assert baseline.regressions(missed, met) == []
    # no expect.json when written, one now: judged by nothing yet
    none = {**met, "meets_expect": None}
    assert baseline.regressions(none, {**none, "incidents": []}) == []
    assert "expect.json the baseline did not judge" in baseline.regressions(none, met)[0]
