"""hangd's cost per watched process per tick must not creep up.

Absolute CPU figures move with the machine and its load, so the test measures the tick against
a plain read of the same /proc files (stat, status, io of every watched process) in the same
thread and run, and fails when that ratio, at best of three runs, is more than twice the committed one
(benchmarks/results/cost-ratio.json, from ``python -m benchmarks.cost``). The targets themselves
are in BENCHMARKS.md, measured by the benchmarks, not here."""

from __future__ import annotations

import json

import pytest

from benchmarks.cost import measure

from .conftest import ROOT

pytestmark = pytest.mark.slow  # times the tick over many rounds

COMMITTED = json.loads((ROOT / "benchmarks" / "results" / "cost-ratio.json").read_text())


def test_tick_cost_per_process_stays_within_twice_the_committed_ratio():
    # Other work on a shared machine only adds to a tick's CPU time (cache and frequency), never
    # takes from it: the best of up to three runs is the code's cost, a slower one is the machine.
    # Seen on a 2-core CI machine: 9.4x in one run of code that measures 4.8-5.4x on every other.
    runs = []
    for _ in range(3):
        r = measure(ranks=6, children=3, gpus=2, ticks=16, interval=0.25)
        assert r["watched"] >= 24, f"the benchmark's 6 ranks and 18 children were not all watched: {r}"
        assert sum(n for s, n in r["states"].items() if s != "gone") >= 6, f"the ranks were not analysed as a job: {r}"
        runs.append(r)
        if r["ratio"] <= 2 * COMMITTED["ratio"]:
            return
    best = min(runs, key=lambda r: r["ratio"])
    raise AssertionError(
        f"one tick costs {best['ratio']}x a plain read of the same /proc files at best of {len(runs)} runs "
        f"(committed: {COMMITTED['ratio']}x, {best['tick_cpu_us_per_process']} us per watched process): {runs}")
