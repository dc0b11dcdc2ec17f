"""A recording of a node of a fleet keeps the other nodes' flight-recorder dumps (``remote_dumps``
events): a replay of it finds what the live node found across nodes, a recording holds each dump
once however long it runs, and a hostile one is a TraceError.

The dumps are PyTorch's own (the ``nccl_stall`` pickles of the 2-GPU host), passed through the rows
a shared database keeps of them, as a node of a fleet receives the other nodes' dumps."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from pathlib import Path

import pytest

from hangd.analysis.engine import Analyzer
from hangd.cli import main
from hangd.flightrec.reader import Dump, read_file
from hangd.flightrec.rows import from_rows, to_rows
from hangd.snapshot import FrDump, ProcSample, RemoteDump, RemoteRank, Snapshot
from hangd.trace import TraceError, TraceReader, TraceWriter

from ..analysis.builders import Node, P, torchrun_env
from ..conftest import PLANTED_SECRET, TRACES

FR = TRACES / "nccl_stall" / "files"
JOB = "rdzv:10.0.0.1:29400"


@functools.cache
def _rows(rank: int) -> tuple[dict, list[dict]]:
    return to_rows(read_file(str(FR / f"nccl_trace_rank_{rank}"), rank))


def _as_stored(rank: int) -> Dump:
    """The real dump of ``rank`` as another node's hangd hands it over: through the store's rows."""
    return from_rows(rank, *copy.deepcopy(_rows(rank)))


def _remote(rank: int, read_at: float, reported_at: float, dump: Dump | None = None, node: str = "node-b") -> RemoteDump:
    return RemoteDump(job=JOB, node=node, rank=rank, read_at=read_at, reported_at=reported_at,
                      dump=dump if dump is not None else _as_stored(rank))


def _write(path: Path, snaps: list[Snapshot]) -> list[Snapshot]:
    with TraceWriter(path, {"scenario": "fleet"}) as w:
        for s in snaps:
            w.write(s)
    return list(TraceReader(path).snapshots())


def _events(path: Path, kind: str) -> list[dict]:
    return [e for e in map(json.loads, (path / "trace.jsonl").read_text().splitlines()) if e["kind"] == kind]


def test_the_other_nodes_dumps_come_back_equal():
    dumps = [_remote(0, 1018.25, 1019.5), _remote(1, 1018.5, 1019.5)]
    assert len(dumps[0].dump.entries) == 64 and dumps[0].dump.pg_status["0"]["last_enqueued_collective"] == 399
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        back = _write(Path(tmp), [Snapshot(t=1020.0, remote_dumps=dumps)])
    (snap,) = back
    assert snap.remote_dumps is not None
    assert [dataclasses.asdict(d) for d in snap.remote_dumps] == [dataclasses.asdict(d) for d in dumps]


def test_secrets_in_the_other_nodes_dumps_are_not_recorded(tmp_path):
    token = PLANTED_SECRET + "XYZabcdefgh"  # the shape of a Hugging Face token, wherever it appears
    dump = _as_stored(1)
    dump.pg_config["0"]["desc"] = f"pg token={PLANTED_SECRET}"
    dump.entries[-1].op = f"nccl:all_reduce {token}"
    (snap,) = _write(tmp_path, [Snapshot(t=1020.0, remote_dumps=[_remote(1, 1018.0, 1019.0, dump, node=token)])])
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and PLANTED_SECRET.encode() in p.read_bytes()]
    (rd,) = snap.remote_dumps or []
    assert "<redacted>" in rd.node and "<redacted>" in rd.dump.pg_config["0"]["desc"]
    assert "<redacted>" in rd.dump.entries[-1].op and rd.dump.entries[0].op == "nccl:all_reduce"


def test_a_recording_holds_each_dump_once_and_a_replay_keeps_the_newest(tmp_path):
    """40 ticks (10 s at 4 Hz): node-b's heartbeat moves every 2 s, rank 1's dump is read again once;
    between, the store could not be read (None) or the job was gone from it ([])."""
    d0, d1 = _as_stored(0), _as_stored(1)
    snaps = []
    for i in range(40):
        t = 1000.0 + i / 4
        beat = 1000.0 + 2 * (i // 8)
        read_1 = 990.0 if i < 20 else 1005.0
        rd: list[RemoteDump] | None = [_remote(0, 990.0, beat, d0), _remote(1, read_1, beat, d1)]
        if i in (25, 26):
            rd = None
        if i == 30:
            rd = []
        snaps.append(Snapshot(t=t, procs=[ProcSample(pid=5, state="S")], remote_dumps=rd))  # a tick has events
    back = _write(tmp_path, snaps)
    events = _events(tmp_path, "remote_dumps")
    # heartbeats at ticks 0, 8, 16, 24, 32; rank 1's new dump at 20; none at 30, again at 31
    assert [round(e["t"] - 1000.0, 2) for e in events] == [0, 2, 4, 5, 6, 7.5, 7.75, 8], events
    files = sorted(p.name for p in (tmp_path / "files").glob("*remote_fr_rank_*"))
    assert len(files) == 5, files  # ranks 0, 1; rank 1 read again; both again after the empty list
    assert sum(len(json.dumps(e)) for e in events) < 3000  # the events name the files, they do not hold the dumps
    assert len(back) == 40
    for i, (s, snap) in enumerate(zip(snaps, back, strict=True)):
        want = s.remote_dumps if s.remote_dumps is not None else snaps[24].remote_dumps
        got = snap.remote_dumps
        assert got is not None, i
        assert [(d.rank, d.read_at, d.reported_at) for d in got] == [(d.rank, d.read_at, d.reported_at) for d in want or []], i
        assert all(dataclasses.asdict(g.dump) == dataclasses.asdict(w.dump) for g, w in zip(got, want or [], strict=True))


def test_a_trace_without_remote_dumps_replays_none():
    back = list(TraceReader(TRACES / "nccl_stall").snapshots())
    assert back and all(s.remote_dumps is None for s in back)


# ------------------------------------------------------------------ a replay finds what the live node found


def _env(rank: int) -> dict[str, str]:
    return torchrun_env(rank, 2, port=29400, LOCAL_WORLD_SIZE="1", GROUP_WORLD_SIZE="2", MASTER_ADDR="10.0.0.1")


def _node_a_with_rank_1_s_dumps(with_ranks: bool) -> tuple[Node, list[Snapshot]]:
    """Node-a runs rank 0 of the nccl_stall job (spinning in all_reduce #399) for 30 s; rank 1's
    dump comes from node-b through the store at 18 s (and its rank row, ``with_ranks``), rank 0's
    own dump at 20 s. Every snapshot the analysis took is kept."""
    node = Node([P(10, 1), P(11, 10, _env(0), gpu=0, look="spin", state="R", cpu_ticks_per_s=100)])
    node.name = "node-a"
    if with_ranks:
        node.remote = lambda t: [RemoteRank(job=JOB, node="node-b", rank=1, pid=1412, state="waiting_peer",
                                            reason="blocked in a collective", waits=True, last_progress=900.0,
                                            reported_at=t - 1)]
    rank1 = _as_stored(1)
    node.remote_dumps = lambda t: [_remote(1, 1018.0, t - 1, rank1)] if t >= 1018 else []
    recorded: list[Snapshot] = []
    step = node.an.step
    node.an.step = lambda snap: (recorded.append(snap), step(snap))[1]  # type: ignore[method-assign]
    node.run(20)
    node.pending_fr = [FrDump(pid=11, rank=0, format="torch-fr-pickle", path="/var/tmp/job/nccl_trace_rank_0",
                              data=(FR / "nccl_trace_rank_0").read_bytes())]
    node.run(10)
    return node, recorded


def test_a_replay_finds_the_rank_on_another_node_that_never_entered_the_collective(tmp_path):
    """Node-a runs rank 0 of the nccl_stall job, which waits in all_reduce #399; node-b runs rank 1,
    which its hangd reports blocked in a collective. Only rank 1's flight-recorder entries, read on
    node-b and handed over through the store, show that it never entered #399. The recording of
    node-a, replayed, says the same."""
    node, recorded = _node_a_with_rank_1_s_dumps(with_ranks=True)

    live = [f for f in node.an.findings if f["kind"] == "missing_rank"]
    assert [f["message"].split(";")[0] for f in live] == \
        ["rank 1 on node-b never entered all_reduce #399 (67108864 float32) in pg 0 (default_pg)"], live
    (inc,) = node.an.incidents()
    assert inc.culprit_ranks == [1] and inc.summary.startswith("Flight recorder: rank 1 on node-b never entered"), inc.summary

    again = _write(tmp_path / "t", recorded)
    assert len(_events(tmp_path / "t", "remote_dumps")) <= len(recorded) // 2 + 2
    replayed = Analyzer()
    for snap in again:
        replayed.step(snap)
    assert [f for f in replayed.findings if f["kind"] == "missing_rank"] == live
    (rinc,) = replayed.incidents()
    assert rinc.summary == inc.summary and rinc.culprit_ranks == [1]
    assert rinc.evidence["culprits"] == inc.evidence["culprits"] == [{"rank": 1, "node": "node-b", "pid": 1412}]


def test_without_the_remote_dumps_event_the_replay_finds_nobody_missing(tmp_path):
    """The same recording with its remote_dumps events taken out: the finding above came from them."""
    node, recorded = _node_a_with_rank_1_s_dumps(with_ranks=False)
    assert [f for f in node.an.findings if f["kind"] == "missing_rank"]
    _write(tmp_path, recorded)
    lines = (tmp_path / "trace.jsonl").read_text().splitlines()
    (tmp_path / "trace.jsonl").write_text("".join(x + "\n" for x in lines if '"kind":"remote_dumps"' not in x))
    replayed = Analyzer()
    for snap in TraceReader(tmp_path).snapshots():
        replayed.step(snap)
    assert not [f for f in replayed.findings if f["kind"] == "missing_rank"]


# ------------------------------------------------------------------ hostile remote dumps


def _good_file() -> dict:
    head, rows = copy.deepcopy(_rows(1))
    return {"head": head, "entries": rows[-3:]}


def _item(**kw: object) -> dict:
    return {"job": JOB, "node": "node-b", "rank": 1, "read_at": 1.0, "reported_at": 1.0, "file": "files/d.json", **kw}


def _with(path: list, value: object) -> dict:
    doc = _good_file()
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return doc


# name -> (the event's dumps, the file's bytes or None for no file)
HOSTILE: dict[str, tuple[list, bytes | None]] = {
    "file_missing": ([_item()], None),
    "file_outside_the_trace": ([_item(file="../outside.json")], None),
    "file_not_json": ([_item()], b"\x80\x03}q\x00."),
    "file_nan": ([_item()], b'{"head": {"version": NaN}, "entries": []}'),
    "file_a_list": ([_item()], b"[]"),
    "file_without_head": ([_item()], json.dumps({"entries": []}).encode()),
    "file_entries_not_list": ([_item()], json.dumps(_with(["entries"], {"0": {}})).encode()),
    "file_deep": ([_item()], b'{"head": {}, "entries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "entry_not_object": ([_item()], json.dumps(_with(["entries", 0], 7)).encode()),
    "entry_seq_string": ([_item()], json.dumps(_with(["entries", 0, "seq"], "399")).encode()),
    "entry_seq_too_large": ([_item()], json.dumps(_with(["entries", 0, "seq"], 2**70)).encode()),
    "entry_without_op": ([_item()], json.dumps(_with(["entries", 0, "op"], None)).encode()),
    "entry_completed_string": ([_item()], json.dumps(_with(["entries", 0, "completed"], "yes")).encode()),
    "entry_size_too_large": ([_item()], json.dumps(_with(["entries", 0, "input_sizes"], [[2**70]])).encode()),
    "entry_size_an_object": ([_item()], json.dumps(_with(["entries", 0, "output_sizes"], [{"a": 1}])).encode()),
    "entry_dtypes_numbers": ([_item()], json.dumps(_with(["entries", 0, "input_dtypes"], [5])).encode()),
    "pg_status_counter_string": ([_item()], json.dumps(_with(["head", "pg_status", "0", "last_enqueued_collective"],
                                                              "399")).encode()),
    "pg_config_group_not_object": ([_item()], json.dumps(_with(["head", "pg_config", "0"], "default_pg")).encode()),
    "pg_config_ranks_strings": ([_item()], json.dumps(_with(["head", "pg_config", "0", "ranks"], ["0", "1"])).encode()),
    "item_without_file": ([{k: v for k, v in _item().items() if k != "file"}], None),
    "item_rank_string": ([_item(rank="1")], None),
    "item_read_at_null": ([_item(read_at=None)], None),
    "item_not_object": ([7], None),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_remote_dump_is_a_trace_error(tmp_path, capsys, name):
    dumps, data = HOSTILE[name]
    d = tmp_path / name
    (d / "files").mkdir(parents=True)
    (d / "meta.json").write_text('{"format": "hangd-trace/1"}')
    (tmp_path / "outside.json").write_text(json.dumps(_good_file()))
    if data is not None:
        (d / "files" / "d.json").write_bytes(data)
    (d / "trace.jsonl").write_text(json.dumps({"t": 1.0, "kind": "proc", "pid": 5}) + "\n"
                                   + json.dumps({"t": 1.0, "kind": "remote_dumps", "dumps": dumps}) + "\n")
    with pytest.raises(TraceError) as e:
        TraceReader(d).check()
    msg = str(e.value)
    assert "\n" not in msg and "remote_dumps" in msg, msg
    assert main(["replay", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hangd: ") and len(err.strip().splitlines()) == 1, err


def test_the_hostile_cases_differ_from_a_good_one_only_in_what_they_name(tmp_path):
    d = tmp_path / "ok"
    (d / "files").mkdir(parents=True)
    (d / "files" / "d.json").write_text(json.dumps(_good_file()))
    (d / "trace.jsonl").write_text(json.dumps({"t": 1.0, "kind": "remote_dumps", "dumps": [_item()]}) + "\n")
    (snap,) = TraceReader(d).snapshots()
    (rd,) = snap.remote_dumps or []
    assert rd.node == "node-b" and [e.seq for e in rd.dump.entries] == [396, 397, 398]
