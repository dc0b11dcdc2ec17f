"""The rank-state decision table: the code's rows are the documented ones, and each row decides."""

from __future__ import annotations

import importlib.util
import inspect
from dataclasses import replace

import pytest

from hangd.analysis.model import Local, State
from hangd.analysis.rankstate import READING, TABLE, Evidence, Moved, decide, progress_words

from ..conftest import ROOT

_spec = importlib.util.spec_from_file_location("analysis_doc", ROOT / "scripts" / "analysis_doc.py")
assert _spec is not None and _spec.loader is not None
analysis_doc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(analysis_doc)


@pytest.mark.parametrize("name", sorted(analysis_doc.TABLES))
def test_the_documented_tables_are_generated_from_the_code(name: str) -> None:
    documented = analysis_doc.documented((ROOT / "docs" / "analysis.md").read_text())[name]
    assert documented is not None, f"docs/analysis.md has no markers for the {name} table"
    assert documented == analysis_doc.TABLES[name](), \
        f"docs/analysis.md's {name} table differs from the code's: run `python scripts/analysis_doc.py --write`"


def test_a_changed_row_is_a_changed_document() -> None:
    """The check can fail: a row moved in the code no longer matches the document."""
    text = (ROOT / "docs" / "analysis.md").read_text()
    assert analysis_doc.generated(text) == text
    swapped = text.replace("| 1 | zombie |", "| 1 | stopped |", 1)
    assert analysis_doc.generated(swapped) != swapped


def test_every_fact_of_the_reading_table_is_a_documented_pure_function() -> None:
    for row in READING:
        for f in (*row.all, *row.any, *row.none):
            assert f.__module__.startswith("hangd.analysis.facts."), f
            assert (f.__doc__ or "").strip(), f"{f.__module__}.{f.__name__} says nothing in words"
            assert list(inspect.signature(f).parameters) == ["r"], f


BASE = Evidence(local=Local.BUSY, why="GPU working", started=True, previous=State.BUSY)

# one case per row of the table: the evidence, the state, the row that must decide
ROWS = [
    (replace(BASE, orphaned=True, orphan_why="its launcher (pid 9) is gone", job_hung=True), State.ORPHANED, "orphaned"),
    (replace(BASE, local=Local.QUIET, job_hung=True, hung_why="job hung", started=False), State.HUNG, "job_hung"),
    (replace(BASE, local=Local.WAITING, idle_server=True, idle_why="idle server", started=False), State.IDLE, "idle_server"),
    (replace(BASE, local=Local.CPU, started=False, previous=None), State.STARTING, "setting_up"),
    (replace(BASE, local=Local.SPINNING, hold=True, previous=State.BUSY), State.BUSY, "hold"),
    (replace(BASE, local=Local.SPINNING, it_waits_for="1"), State.WAITING_PEER, "waits_for_peer"),
    (replace(BASE, local=Local.QUIET, peers_wait_for_it="0"), State.STRAGGLER, "holds_others_up"),
    (replace(BASE, local=Local.STOPPED, peers_wait_for_it="0"), State.HUNG, "stopped"),
    # waiting for a stopped rank: hung at once, whichever wait (a GPU spin, a host-side wait), and
    # ahead of a first wait's hold and of an idle server
    (replace(BASE, local=Local.SPINNING, it_waits_for="3", waits_for_stopped="3", hold=True), State.HUNG,
     "waits_for_stopped"),
    (replace(BASE, local=Local.WAITING, it_waits_for="1, 3", waits_for_stopped="3", idle_server=True), State.HUNG,
     "waits_for_stopped"),
    (replace(BASE, local=Local.WORKER_WAIT, why="its stack is waiting for a worker of its own",
             progress={"children": Moved.YES}, how={"children": "its workers pid 41, 42 work"}), State.BUSY, "workers_work"),
    (replace(BASE, local=Local.WORKER_WAIT, why="its stack is waiting for a worker of its own",
             progress={"children": Moved.NO}), State.BUSY, "own_reading"),
    (replace(BASE, local=Local.WORKER_WAIT, why="its main thread waits in poll on a pipe held by its child",
             progress={"children": Moved.NO}, hold=True, previous=State.LOADING), State.LOADING, "hold"),
    (replace(BASE, local=Local.LOADING, why="reading 130 MB/s (rchar)"), State.LOADING, "own_reading"),
    (replace(BASE, local=Local.SPINNING, job_captures=True, capture_why="rank 0's log says it captures CUDA graphs",
             hold=True), State.GRAPH_CAPTURE, "job_captures"),
    (replace(BASE, local=Local.GRAPH_CAPTURE, job_captures=True), State.GRAPH_CAPTURE, "own_reading"),
    (replace(BASE, local=Local.QUIET, job_captures=True, previous=State.BUSY), State.IDLE, "own_reading"),
    (replace(BASE, local=Local.SPINNING, collectives_at_work=True, at_work_why="every rank progresses", hold=True,
             previous=State.LOADING), State.BUSY, "collectives_at_work"),
    (replace(BASE, local=Local.QUIET, collectives_at_work=True, previous=State.LOADING), State.IDLE, "own_reading"),
    # every rank at one call, none missing: their collectives run, and a first wait's hold does not keep a load
    (replace(BASE, local=Local.SPINNING, one_wait=True, one_wait_why="every rank waits at the same call", hold=True,
             previous=State.LOADING), State.BUSY, "one_wait"),
    (replace(BASE, local=Local.QUIET, one_wait=True, previous=State.LOADING), State.IDLE, "own_reading"),
]


@pytest.mark.parametrize(("ev", "state", "rule"), ROWS, ids=[r for _, _, r in ROWS])
def test_each_row_decides(ev, state, rule):
    d = decide(ev)
    assert (d.state, d.rule) == (state, rule), d.reason


@pytest.mark.parametrize("rule", [r.rule for r in TABLE])
def test_every_row_has_a_case(rule):
    assert rule in {r for _, _, r in ROWS}


# Readings taken from the recorded traces (the record the engine built at that second).
TRACE_ROWS = [
    # h200x2-more/sgl_ok, rank 1 at +20 s: in the gloo broadcast of an idle scheduler, waking 38/s
    (replace(BASE, local=Local.WAITING, why="its stack is inside a collective: broadcast", idle_server=True,
             idle_why="idle server: the collectives with rank 0 keep completing (38 a second) and no rank works",
             progress={"collectives": Moved.YES, "gpu_work": Moved.NO}), State.IDLE),
    # ... and rank 0, sleeping between polls of its empty queue while rank 1 waits for it
    (replace(BASE, local=Local.QUIET, why="sleeping in hrtimer_nanosleep", idle_server=True, peers_wait_for_it="1",
             idle_why="idle server"), State.IDLE),
    # h200x2-more/ckpt_straggler, rank 0 writing its checkpoint while rank 1 waits in the next all_reduce
    (replace(BASE, local=Local.WRITING, why="writing 78 MB/s over the last 6 s (write_bytes)", peers_wait_for_it="1",
             progress={"write": Moved.YES}), State.BUSY),
    # h200x2-more/hf_slow_shards, rank 1 reading from the page cache (rchar alone moves) past its setup
    (replace(BASE, local=Local.LOADING, why="reading 130 MB/s over the last 6 s (rchar)", peers_wait_for_it="0"),
     State.LOADING),
    # h200x2/cpu_hang: the quiet rank of a job judged hung, which never finished its setup
    (replace(BASE, local=Local.QUIET, started=False, previous=State.STARTING, job_hung=True, hung_why="job hung"),
     State.HUNG),
    # a rank waiting on its DataLoader worker while the job is hung names the worker
    (replace(BASE, local=Local.WORKER_WAIT, job_hung=True, hung_why="job hung",
             waits_detail="its DataLoader worker pid 4242 (sleeping in futex_wait)"), State.HUNG),
]


@pytest.mark.parametrize(("ev", "state"), TRACE_ROWS)
def test_readings_from_recorded_traces(ev, state):
    d = decide(ev)
    assert d.state == state, d.reason
    if ev.waits_detail and d.state == State.HUNG:
        assert "DataLoader worker pid 4242" in d.reason


def test_a_missing_source_is_unknown_not_stuck():
    ev = replace(BASE, local=Local.QUIET, progress={"stack": Moved.UNKNOWN, "gpu_work": Moved.UNKNOWN})
    assert not ev.moved("stack", "gpu_work")
    assert decide(ev).state == State.IDLE
    assert progress_words(replace(ev, progress={"read": Moved.YES}, how={"read": "read 130 MB/s (rchar)"})) == \
        "read 130 MB/s (rchar)"
