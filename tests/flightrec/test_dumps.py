"""Flight-recorder dumps: the restricted decoder, the reader, cross-rank findings on real dumps."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hangd.flightrec.analyze import analyze
from hangd.flightrec.cli import analyze_paths, collect
from hangd.flightrec.reader import DumpError, decode, read_file
from hangd.flightrec.safepickle import BadPickle, UnsafePickle, safe_loads

from ..conftest import ROOT, TRACES, WORKLOADS, run_hangd
from ..fuzz import examples

NCCL_DUMPS = TRACES / "nccl_stall" / "files"


# ------------------------------------------------------------------ the restricted decoder

def _plain(leaves):
    return st.recursive(
        leaves,
        lambda kids: st.lists(kids) | st.tuples(kids, kids) | st.dictionaries(st.text() | st.integers(), kids),
        max_leaves=30,
    )


scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
plain = _plain(scalars | st.binary())


@settings(max_examples=examples(300), deadline=None)
@given(obj=plain, proto=st.integers(min_value=3, max_value=5))
def test_decoder_matches_plain_pickles(obj, proto):
    assert safe_loads(pickle.dumps(obj, protocol=proto)) == obj


@settings(max_examples=examples(200), deadline=None)
@given(obj=_plain(scalars), proto=st.integers(min_value=0, max_value=2))
def test_decoder_matches_old_protocols(obj, proto):
    # protocols 0-2 write bytes through codecs.encode (a call), so they are left out here
    assert safe_loads(pickle.dumps(obj, protocol=proto)) == obj


@settings(max_examples=examples(300), deadline=None)
@given(data=st.binary(max_size=400))
def test_decoder_never_crashes_on_garbage(data):
    try:
        safe_loads(data)
    except (BadPickle, UnsafePickle):
        pass


@settings(max_examples=examples(200), deadline=None)
@given(obj=plain, cut=st.integers(min_value=1, max_value=200))
def test_truncated_pickles_are_refused_cleanly(obj, cut):
    data = pickle.dumps(obj, protocol=4)
    if cut < len(data):
        with pytest.raises((BadPickle, UnsafePickle)):
            safe_loads(data[: len(data) - cut])


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/hangd-pwned",))


def test_malicious_pickle_is_refused_and_nothing_runs(tmp_path):
    marker = Path("/tmp/hangd-pwned")
    marker.unlink(missing_ok=True)
    evil = pickle.dumps({"version": "2.10", "entries": [Evil()]})
    with pytest.raises(UnsafePickle, match=r"refused: opcode (STACK_GLOBAL|GLOBAL)"):
        safe_loads(evil)
    p = tmp_path / "fr_rank_0"
    p.write_bytes(evil)
    with pytest.raises(DumpError, match="would import or call"):
        read_file(str(p))
    out = run_hangd("fr", "analyze", str(p), "--json", check=False)
    assert out.returncode == 2  # nothing could be read
    doc = json.loads(out.stdout)
    assert doc["findings"][0]["kind"] == "unreadable" and "refused" in doc["findings"][0]["message"]
    assert not marker.exists()
    for proto in (0, 1, 2):
        with pytest.raises(UnsafePickle):
            safe_loads(pickle.dumps(Evil(), protocol=proto))


def test_bad_files_do_not_take_the_other_ranks_down(tmp_path):
    d = tmp_path / "dumps"
    d.mkdir()
    good = (NCCL_DUMPS / "nccl_trace_rank_0").read_bytes()
    (d / "fr_rank_0").write_bytes(good)
    (d / "fr_rank_1").write_bytes(good[: len(good) // 2])  # truncated
    (d / "fr_rank_2").write_bytes(b"")  # empty
    (d / "fr_rank_3").write_bytes(os.urandom(4096))  # garbage
    big = tmp_path / "fr_rank_4"
    with open(big, "wb") as f:
        f.truncate(100 * 1024 * 1024)
    link = tmp_path / "fr_rank_5"
    link.symlink_to(d / "fr_rank_0")
    files = [str(d / f"fr_rank_{r}") for r in range(4)] + [str(big), str(link)]
    dumps, errors = collect(files)
    assert [x.rank for x in dumps] == [0]
    assert set(errors) == {1, 2, 3, 4, 5}
    assert "truncated" in errors[1] and "empty" in errors[2]
    assert "cap" in errors[4] and "symlink" in errors[5]
    out, text = analyze_paths(files)
    assert out["ranks"][0]["owner"]
    assert "UNREADABLE" in text


def test_real_nccl_dumps_one_missing_rank_finding():
    r = run_hangd("fr", "analyze", str(NCCL_DUMPS), "--json", check=False)
    assert r.returncode == 1  # a finding
    doc = json.loads(r.stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    f = [x for x in doc["findings"] if x["kind"] != "stuck"]
    assert len(f) == 1
    f = f[0]
    assert (f["kind"], f["missing_ranks"], f["seq"], f["op"]) == ("missing_rank", [1], 399, "nccl:all_reduce")
    assert f["sizes"]["0"] == [[67108864]] and f["numel"] == 67108864
    assert f["frames"][0]["name"] == "all_reduce"
    assert doc["groups"][0]["desc"] == "default_pg"


def test_ring_buffer_wrap_gives_no_false_missing_rank():
    d0 = read_file(str(NCCL_DUMPS / "nccl_trace_rank_0"))
    d1 = read_file(str(NCCL_DUMPS / "nccl_trace_rank_1"))
    # rank 1 completed 1..398 like rank 0; drop rank 0's oldest 100 records as a small buffer would
    d0.entries = d0.entries[100:]
    kinds = [(f.kind, f.seq) for f in analyze([d0, d1])]
    assert kinds == [("missing_rank", 399)]


def test_version_and_encoding_differences_are_normalized():
    old = {"version": "2.1", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": [0, 1]}},
           "entries": [{"seq_id": 5, "profiling_name": "nccl:all_reduce", "state": "completed", "input_sizes": [(4,)],
                        "input_dtypes": ["Float"], "process_group": ("0", "default_pg"), "frames": [],
                        "time_created_ns": 0}]}
    new = json.loads(json.dumps({**old, "version": "2.10", "entries": [{**old["entries"][0], "collective_seq_id": 5,
                                                                        "time_created_ns": None}]}))
    a, b = decode(pickle.dumps(old), 0), decode(json.dumps(new).encode(), 1)
    assert a.entries[0].seq == b.entries[0].seq == 5
    assert a.entries[0].input_sizes == b.entries[0].input_sizes == [[4]]
    assert a.entries[0].time_created_ns is None and b.entries[0].time_created_ns is None
    assert a.pg_config["0"]["ranks"] == [0, 1]


def _gloo_dumps(tmp_path: Path, mode: str) -> Path:
    out = tmp_path / mode
    out.mkdir()
    subprocess.run([sys.executable, str(WORKLOADS / "launch.py"), "2", str(out), str(WORKLOADS / "gloo_job.py"), mode,
                    "--steps", "3", "--size", "1024", "--step-sleep", "0", "--dump-dir", str(out)],
                   timeout=180, check=False, cwd=ROOT)
    assert (out / "pickle" / "fr_rank_0").exists() and (out / "json" / "fr_rank_1").exists(), \
        (out / "log_0.txt").read_text()[-2000:]
    return out


def _fr_json(path: Path) -> dict:
    r = run_hangd("fr", "analyze", str(path), "--json", check=False)
    assert r.returncode == 1, r.stderr
    return json.loads(r.stdout)


def _kinds(doc: dict) -> list[tuple]:
    return sorted((f["kind"], f["seq"], tuple(f["missing_ranks"]), json.dumps(f["sizes"], sort_keys=True))
                  for f in doc["findings"] if f["kind"] != "stuck")


@pytest.mark.torchrun
def test_real_gloo_job_that_skips_a_collective(tmp_path):
    out = _gloo_dumps(tmp_path, "skip")
    p, j = _fr_json(out / "pickle"), _fr_json(out / "json")
    assert {r["encoding"] for r in p["ranks"]} == {"pickle"} and {r["encoding"] for r in j["ranks"]} == {"json"}
    assert _kinds(p) == _kinds(j)
    f = [x for x in p["findings"] if x["kind"] == "missing_rank"]
    assert len(f) == 1 and f[0]["missing_ranks"] == [1] and f[0]["seq"] == 4 and f[0]["op"] == "gloo:all_reduce"


@pytest.mark.torchrun
def test_real_gloo_job_with_different_sizes(tmp_path):
    out = _gloo_dumps(tmp_path, "size")
    p, j = _fr_json(out / "pickle"), _fr_json(out / "json")
    assert _kinds(p) == _kinds(j)
    f = [x for x in p["findings"] if x["kind"] == "size_mismatch"]
    assert len(f) == 1 and f[0]["seq"] == 4
    assert f[0]["sizes"] == {"0": [[1024]], "1": [[2048]]}


def test_our_findings_include_pytorchs_analyzer_findings(tmp_path):
    """PyTorch's own analyzer (it unpickles: run only on the reference dumps) vs ours."""
    d = tmp_path / "dumps"
    d.mkdir()
    for r in (0, 1):
        (d / f"nccl_trace_rank_{r}").write_bytes((NCCL_DUMPS / f"nccl_trace_rank_{r}").read_bytes())
    res = subprocess.run([sys.executable, "-W", "ignore", "-m", "torch.distributed.flight_recorder.fr_trace", str(d),
                          "-p", "nccl_trace_rank_"], capture_output=True, text=True, timeout=300)
    theirs = set()
    for m in re.finditer(r"Not all ranks joining collective, sequence number: (\d+).*?missing ranks: \{([\d, ]+)\}",
                         res.stdout + res.stderr, re.S):
        theirs.add(("missing_rank", int(m.group(1)), tuple(int(x) for x in m.group(2).split(","))))
    assert theirs, res.stdout[-2000:] + res.stderr[-2000:]
    ours = {(f.kind, f.seq, tuple(f.missing_ranks)) for f in analyze([read_file(str(p)) for p in sorted(d.iterdir())])}
    assert theirs <= ours


def test_what_a_shared_store_keeps_of_a_dump_gives_the_same_findings_and_no_frames():
    """A recorded NCCL stall (rank 1 never entered all_reduce #399): rank 1's dump as the rows a
    node writes for the others (newest 64 entries, no frames) tells the same story."""
    from hangd.flightrec.rows import KEEP_PER_GROUP, from_rows, to_rows

    d0, d1 = (read_file(str(TRACES / "nccl_stall" / "files" / f"nccl_trace_rank_{r}")) for r in (0, 1))
    head, rows = to_rows(d1)
    assert len(d1.entries) == 398 and len(rows) == KEEP_PER_GROUP and head["entries"] == 398
    assert [r["seq"] for r in rows] == [e.seq for e in d1.entries[-KEEP_PER_GROUP:]]
    assert "frames" not in rows[0] and "frames" not in json.dumps(head)
    json.dumps(rows)  # what goes into JSON columns is plain data
    back = from_rows(1, head, rows)
    assert back.pg_status == d1.pg_status and all(e.frames == [] for e in back.entries)
    msg = [(f.kind, f.seq, f.missing_ranks, f.message) for f in analyze([d0, d1])]
    assert [(k, s, m) for k, s, m, _ in msg] == [("missing_rank", 399, [1])]
    named = analyze([d0, back], nodes={1: "node-b"})
    assert [(f.kind, f.seq, f.missing_ranks, f.nodes) for f in named] == [("missing_rank", 399, [1], {1: "node-b"})]
    assert named[0].message == msg[0][3].replace("rank 1 never", "rank 1 on node-b never").replace(", 1:398", ", 1 on node-b:398")


def test_a_dump_of_many_groups_keeps_a_bounded_number_of_rows_and_clips_long_names():
    from hangd.flightrec.reader import Dump, Entry
    from hangd.flightrec.rows import KEEP_PER_RANK, to_rows

    entries = [Entry(record_id=i, pg=f"pg{i % 500}", pg_id=i % 500, seq=i // 500 + 1, p2p_seq=0, op="x" * 1000,
                     state="scheduled", completed=False, input_sizes=[[1]], input_dtypes=["Float"], output_sizes=[[1]],
                     is_p2p=False, frames=[], time_created_ns=None, timeout_ms=None) for i in range(10_000)]
    _, rows = to_rows(Dump(rank=0, version="2.10", encoding="pickle", entries=entries))
    assert len(rows) == KEEP_PER_RANK and rows[-1]["seq"] == 20 and len(rows[0]["op"]) == 128
