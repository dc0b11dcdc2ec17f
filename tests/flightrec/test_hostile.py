"""Hostile flight-recorder files: nothing they ask for runs, every one is one clean DumpError,
and ``hangd fr analyze`` reports them without crashing."""

from __future__ import annotations

import io
import json
import pickle
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hangd.flightrec.analyze import analyze
from hangd.flightrec.cli import exit_status, report
from hangd.flightrec.reader import Dump, DumpError, decode, read_file
from hangd.flightrec.safepickle import UnsafePickle, _PlainUnpickler, safe_loads

from ..conftest import ROOT, TRACES, run_hangd
from ..fuzz import examples

HOSTILE = ROOT / "tests" / "data" / "hostile"
EXPECTED: dict[str, str] = json.loads((HOSTILE / "expected.json").read_text())
NCCL = TRACES / "nccl_stall" / "files"
CLEAN = TRACES / "load" / "files"


def _s(text: str) -> bytes:
    b = text.encode()
    return b"X" + len(b).to_bytes(4, "little") + b


# Each builder returns a pickle that makes ``pickle.loads`` create the file at ``m``.
LIVE = {
    "GLOBAL+REDUCE": lambda m: b"cos\nmkdir\n(" + _s(m) + b"tR.",
    "STACK_GLOBAL+REDUCE": lambda m: b"\x80\x04" + _s("os") + _s("mkdir") + b"\x93" + _s(m) + b"\x85R.",
    "INST": lambda m: b"(" + _s(m) + b"ios\nmkdir\n.",
    "OBJ": lambda m: b"(cos\nmkdir\n" + _s(m) + b"o.",
    "NEWOBJ": lambda m: b"\x80\x02ctests.flightrec.payloads\nMarker\n" + _s(m) + b"\x85\x81.",
    "NEWOBJ_EX": lambda m: b"\x80\x04ctests.flightrec.payloads\nMarker\n" + _s(m) + b"\x85}\x92.",
    "BUILD": lambda m: b"\x80\x02ctests.flightrec.payloads\nMarker\n)\x81}" + _s("marker") + _s(m) + b"sb.",
}


@pytest.mark.parametrize("construct", sorted(LIVE))
def test_a_pickle_that_runs_code_under_pickle_loads_runs_nothing_here(tmp_path, construct):
    build = LIVE[construct]
    # the payload is live: plain pickle.loads (in a child, to keep this process clean) runs it
    live = tmp_path / "pickle-loads-ran-it"
    subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(open(sys.argv[1], 'rb').read())",
                    str(_write(tmp_path / "p", build(str(live))))], cwd=ROOT, check=True, timeout=60)
    assert live.exists()
    marker = tmp_path / "hangd-ran-it"
    with pytest.raises(UnsafePickle, match=r"refused: opcode (GLOBAL|STACK_GLOBAL|INST)"):
        safe_loads(build(str(marker)))
    with pytest.raises(DumpError, match="would import or call"):
        decode(build(str(marker)))
    assert not marker.exists()


def _write(p: Path, data: bytes) -> Path:
    p.write_bytes(data)
    return p


EXT_CHILD = r"""
import copyreg, io, pickle, sys
from hangd.flightrec.safepickle import UnsafePickle, _PlainUnpickler, safe_loads
code, op, live, marker = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
opcode, width = {"EXT1": (b"\x82", 1), "EXT2": (b"\x83", 2), "EXT4": (b"\x84", 4)}[op]
arg = opcode + code.to_bytes(width, "little")
def payload(path):
    b = path.encode()
    return b"\x80\x04" + arg + b"X" + len(b).to_bytes(4, "little") + b + b"\x85R."
copyreg.add_extension("os", "mkdir", code)
pickle.loads(b"\x80\x04" + arg + b".")  # some other code in the process used the extension once
# find_class alone is not enough: the cached extension reaches REDUCE without it
_PlainUnpickler(io.BytesIO(payload(live))).load()
try:
    safe_loads(payload(marker))
except UnsafePickle as e:
    print(e)
"""


@pytest.mark.parametrize(("op", "code"), [("EXT1", 0xF1), ("EXT2", 0x1F2), ("EXT4", 0x1F2F3)])
def test_extension_opcodes_are_refused_even_when_copyreg_has_them_cached(tmp_path, op, code):
    live, marker = tmp_path / "find-class-missed-it", tmp_path / "hangd-ran-it"
    r = subprocess.run([sys.executable, "-c", EXT_CHILD, str(code), op, str(live), str(marker)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, check=True)
    assert live.exists(), "the C unpickler no longer consults the cache first: the scan is belt and braces"
    assert f"refused: opcode {op} at byte 2" in r.stdout
    assert not marker.exists()


def test_persistent_ids_and_out_of_band_buffers_are_refused():
    with pytest.raises(UnsafePickle, match="PERSID"):
        safe_loads(b"Pfoo\n.")
    with pytest.raises(UnsafePickle, match="BINPERSID"):
        safe_loads(b"\x80\x04\x8c\x03fooQ.")
    # behind the scan, the unpickler itself refuses too
    with pytest.raises(UnsafePickle) as e:
        _PlainUnpickler(io.BytesIO(b"Pfoo\n.")).load()
    assert str(e.value) == ("refused: the pickle asks for a persistent object; "
                            "a flight-recorder dump holds plain data only")
    with pytest.raises(UnsafePickle) as e:
        _PlainUnpickler(io.BytesIO(b"cos\nsystem\n.")).load()
    assert str(e.value) == "refused: the pickle asks for os.system; a flight-recorder dump holds plain data only"
    bufs: list[pickle.PickleBuffer] = []
    data = pickle.dumps({"entries": [pickle.PickleBuffer(b"secret")]}, protocol=5, buffer_callback=bufs.append)
    with pytest.raises(UnsafePickle, match="NEXT_BUFFER"):
        safe_loads(data)


# ------------------------------------------------------------------ the corpus


def test_the_corpus_covers_every_refused_construct_in_both_encodings():
    names = set(EXPECTED)
    assert {p.name for p in HOSTILE.iterdir()} - {"expected.json", "make_corpus.py"} == names
    refused_ops = {v.split()[1] for v in EXPECTED.values() if v.startswith("opcode ")}
    assert refused_ops == {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX",
                           "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID", "NEXT_BUFFER", "READONLY_BUFFER"}
    assert sum(n.endswith(".json") for n in names) >= 10 and sum(n.endswith(".pkl") for n in names) >= 30


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_hostile_file_is_one_clean_dump_error_or_reads(name):
    t0 = time.monotonic()
    expect = EXPECTED[name]
    if expect == "reads":
        d = read_file(str(HOSTILE / name), rank=1)
        good = read_file(str(NCCL / "nccl_trace_rank_0"))
        out, text = report([good, d], {}, {}, [])
        json.dumps(out, default=str)
        assert "rank 1" in text
    else:
        with pytest.raises(DumpError) as e:
            read_file(str(HOSTILE / name))
        assert expect in str(e.value)
        assert "\n" not in str(e.value) and len(str(e.value)) < 400
    assert time.monotonic() - t0 < 10  # no file may keep the reader busy


def test_fr_analyze_on_the_corpus_reports_every_file_and_exits_2():
    refused = [str(HOSTILE / n) for n, e in sorted(EXPECTED.items()) if e != "reads"]
    r = run_hangd("fr", "analyze", *refused, "--json", check=False)
    assert r.returncode == 2, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ranks"] == []
    assert sorted(f["message"].split(":")[0] for f in doc["findings"]) == sorted(refused)
    assert {f["kind"] for f in doc["findings"]} == {"unreadable"}
    text = run_hangd("fr", "analyze", *refused, check=False)
    assert text.returncode == 2 and "No flight-recorder dump could be read" in text.stdout
    assert "Traceback" not in text.stderr + r.stderr


def test_fr_analyze_exit_status_and_missing_ranks(tmp_path):
    # clean: both ranks of the group read, nothing wrong
    clean = run_hangd("fr", "analyze", str(CLEAN), check=False)
    assert clean.returncode == 0 and "No findings" in clean.stdout
    # a finding
    assert run_hangd("fr", "analyze", str(NCCL), check=False).returncode == 1
    # one rank of a two-rank group: not "no findings", but which rank is missing
    one = run_hangd("fr", "analyze", str(CLEAN / "nccl_trace_rank_0"), check=False)
    assert one.returncode == 1
    assert "No findings" not in one.stdout
    assert "MISSING_DUMP: pg 0 (default_pg) has 2 ranks; no dump was given for rank 1" in one.stdout
    doc = json.loads(run_hangd("fr", "analyze", str(CLEAN / "nccl_trace_rank_0"), "--json", check=False).stdout)
    (f,) = doc["findings"]
    assert (f["kind"], f["pg"], f["ranks"], f["missing_ranks"]) == ("missing_dump", "0", [0], [1])
    # a rank whose file was given but is unreadable is reported as unreadable, not as missing
    (tmp_path / "fr_rank_1").write_bytes(b"garbage")
    both = json.loads(run_hangd("fr", "analyze", str(CLEAN / "nccl_trace_rank_0"), str(tmp_path / "fr_rank_1"),
                                "--json", check=False).stdout)
    assert [x["kind"] for x in both["findings"]] == ["unreadable"]
    # nothing read: a missing file, an empty directory
    assert run_hangd("fr", "analyze", str(tmp_path / "nope"), check=False).returncode == 2
    (tmp_path / "empty").mkdir()
    assert run_hangd("fr", "analyze", str(tmp_path / "empty"), check=False).returncode == 2


def test_a_directory_of_hostile_rank_files_says_what_it_skipped(tmp_path):
    for r, name in enumerate(("global_reduce.pkl", "nested_100000.json")):
        (tmp_path / f"fr_rank_{r}").write_bytes((HOSTILE / name).read_bytes())
    r = run_hangd("fr", "analyze", str(tmp_path), check=False)
    assert r.returncode == 2
    assert f"skipped {tmp_path}/fr_rank_0: refused: opcode GLOBAL" in r.stdout
    assert f"skipped {tmp_path}/fr_rank_1: bad JSON: nested too deep" in r.stdout


def test_a_huge_counter_does_not_stall_the_analysis():
    d = read_file(str(HOSTILE / "last_enqueued_2_62.pkl"), rank=0)
    other = read_file(str(HOSTILE / "last_enqueued_2_62.pkl"), rank=1)
    t0 = time.monotonic()
    analyze([d, other])
    assert time.monotonic() - t0 < 1


# ------------------------------------------------------------------ fuzzing

# named, so hypothesis never has to repr a 5000-digit int (repr refuses those)
_HUGE = {"2**63": 2**63, "-2**63-1": -(2**63) - 1, "10**30": 10**30, "10**5000": 10**5000, "inf": float("inf"),
         "-inf": float("-inf"), "nan": float("nan"), "1e308": 1e308}


def _big(name: str) -> int | float:
    return _HUGE[name]


_huge = st.sampled_from(sorted(_HUGE)).map(_big)
_leaf = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | _huge | st.floats() | st.text(max_size=20)
         | st.binary(max_size=10) | st.sampled_from(["completed", "scheduled", "started", "nccl:all_reduce", "0", ""]))
_any = st.recursive(_leaf, lambda k: st.lists(k, max_size=4) | st.tuples(k, k)
                    | st.dictionaries(st.text(max_size=8) | st.integers(), k, max_size=4), max_leaves=20)
_ENTRY_KEYS = ["collective_seq_id", "seq_id", "p2p_seq_id", "pg_id", "record_id", "profiling_name", "state", "retired",
               "is_p2p", "input_sizes", "input_dtypes", "output_sizes", "frames", "process_group", "time_created_ns",
               "timeout_ms"]
_entry = st.dictionaries(st.sampled_from(_ENTRY_KEYS), _any, max_size=10)
_dump = st.fixed_dictionaries({
    "version": _any, "entries": st.lists(_entry | _any, max_size=5),
    "pg_config": st.dictionaries(st.text(max_size=3) | st.integers(), st.dictionaries(
        st.sampled_from(["name", "desc", "ranks"]), _any) | _any, max_size=3),
    "pg_status": st.dictionaries(st.text(max_size=3), st.dictionaries(st.text(max_size=30), _any) | _any, max_size=3),
}, optional={"rank": _any, "comm_lib_version": _any})


def _check_analysis(dumps: list[Dump]) -> None:
    out, text = report(dumps, {}, {}, [])
    json.dumps(out, default=str)
    assert exit_status(out) in (0, 1)
    assert isinstance(text, str)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=_dump, proto=st.integers(min_value=2, max_value=5), as_json=st.booleans())
def test_fuzzed_dump_shapes_give_a_dump_or_one_dump_error(raw, proto, as_json):
    """Every field of every type, huge and non-finite numbers: a Dump that analyses, or DumpError."""
    try:
        data = json.dumps(raw, default=repr).encode() if as_json else pickle.dumps(raw, protocol=proto)
    except ValueError:  # json.dumps of a 5000-digit int; the pickle corpus has those
        return
    try:
        a = decode(data, 0)
        b = decode(data, 1)
    except DumpError as e:
        assert str(e)
        return
    _check_analysis([a, b])


REAL = [NCCL / "nccl_trace_rank_0", CLEAN / "nccl_trace_rank_1"]


@settings(max_examples=examples(200), deadline=None)
@given(which=st.sampled_from(REAL), as_json=st.booleans(), seed=st.integers(0, 2**32), edits=st.integers(1, 8))
def test_mutated_real_dumps_give_a_dump_or_one_dump_error(which, as_json, seed, edits):
    """Real dumps with bytes flipped, dropped, duplicated or cut: never any other exception."""
    data = bytearray(which.read_bytes())
    if as_json:
        data = bytearray(json.dumps(safe_loads(bytes(data))).encode())
    rnd = random.Random(seed)
    for _ in range(edits):
        i = rnd.randrange(len(data))
        how = rnd.randrange(4)
        if how == 0:
            data[i] = rnd.randrange(256)
        elif how == 1:
            del data[i : i + rnd.randrange(1, 16)]
        elif how == 2:
            data[i:i] = data[i : i + rnd.randrange(1, 64)]
        else:
            del data[i:]
        if not data:
            break
    try:
        d = decode(bytes(data), 0)
    except DumpError:
        return
    _check_analysis([d, read_file(str(NCCL / "nccl_trace_rank_1"))])
