"""The decoder's limits and the reader's normalization, case by case: where each bound lies, and
what a dump with odd fields reads as."""

from __future__ import annotations

import json
import os
import pickle

import pytest

from hangd.flightrec.reader import DumpError, decode, rank_from_name, read_file
from hangd.flightrec.safepickle import (
    MAX_DEPTH,
    BadPickle,
    UnsafePickle,
    check_tree,
    max_nodes_for,
    safe_loads,
)

from ..conftest import TRACES

NCCL = TRACES / "nccl_stall" / "files"


def _nest(depth: int) -> list:
    v: list = [1]
    for _ in range(depth - 1):
        v = [v]
    return v


# ------------------------------------------------------------------ safe_loads and its bounds


def test_plain_values_of_every_kind_decode_like_pickle_loads():
    value = {"s": "x", "b": b"\x00", "i": -(2**70), "f": 1.5, "t": (1, (2,)), "l": [None, True, False],
             "set": {1, 2}, "fs": frozenset({3}), "": {}}
    for proto in range(4, 6):  # sets and frozensets need protocol 4 to be written without a call
        assert safe_loads(pickle.dumps(value, protocol=proto)) == value
    assert safe_loads(pickle.dumps(bytearray(b"ab"), protocol=5)) == bytearray(b"ab")


def test_refusals_name_the_opcode_and_its_position():
    with pytest.raises(UnsafePickle) as e:
        safe_loads(b"\x80\x04" + b"K\x01" + b"0" + b"))R.")
    assert str(e.value).startswith("refused: opcode REDUCE at byte 7 ")
    assert "plain data only" in str(e.value)


def test_size_cap_is_inclusive():
    data = pickle.dumps([b"x" * 100])
    assert safe_loads(data, max_bytes=len(data)) == [b"x" * 100]
    with pytest.raises(BadPickle, match=f"{len(data)} bytes is over the {len(data) - 1}-byte cap"):
        safe_loads(data, max_bytes=len(data) - 1)
    with pytest.raises(BadPickle, match="empty"):
        safe_loads(b"")


def test_depth_bound_is_exact():
    assert safe_loads(pickle.dumps(_nest(MAX_DEPTH))) == _nest(MAX_DEPTH)
    with pytest.raises(BadPickle, match=f"nested more than {MAX_DEPTH} deep"):
        safe_loads(pickle.dumps(_nest(MAX_DEPTH + 1)))
    check_tree(_nest(5), max_depth=5)
    with pytest.raises(BadPickle):
        check_tree(_nest(6), max_depth=5)


def test_node_bound_counts_every_place_a_shared_value_appears():
    shared = [1, 2, 3]  # 4 values: the list and its three items
    value = [shared, shared, shared]  # 1 + 3 * 4
    check_tree(value, max_nodes=13)
    with pytest.raises(BadPickle, match="more than 12 values"):
        check_tree(value, max_nodes=12)
    check_tree(list(range(99)), max_nodes=100)
    with pytest.raises(BadPickle, match="more than 99 values"):
        check_tree(list(range(99)), max_nodes=99)
    # dict keys count too
    check_tree({"a": 1, "b": 2}, max_nodes=5)
    with pytest.raises(BadPickle):
        check_tree({"a": 1, "b": 2}, max_nodes=4)


def test_shared_frames_like_torchs_pickler_writes_them_are_fine():
    frame = {"name": "all_reduce", "filename": "c10d.py", "line": 3}
    dump = {"entries": [{"frames": [frame]}, {"frames": [frame]}], "empty": [(), (), frozenset(), frozenset()]}
    assert safe_loads(pickle.dumps(dump, protocol=4)) == dump


def test_a_list_containing_itself_is_refused():
    a: list = []
    a.append([a])
    with pytest.raises(BadPickle, match="contains itself"):
        check_tree(a)
    with pytest.raises(BadPickle, match="contains itself"):
        safe_loads(pickle.dumps(a))


def test_scalars_and_empty_values_pass_the_tree_check():
    for v in (1, "x", b"", [], {}, (), None):
        check_tree(v, max_depth=0, max_nodes=0)


def test_node_budget_grows_with_the_file():
    assert max_nodes_for(0) == 1_000_000
    assert max_nodes_for(250_000) == 1_000_000
    assert max_nodes_for(250_001) == 1_000_004
    assert max_nodes_for(64 * 1024 * 1024) == 4 * 64 * 1024 * 1024


@pytest.mark.parametrize(("data", "ok"), [
    (b"\x80\x02]q\x00.", True),                 # BINPUT 0: the first slot
    (b"\x80\x02]q\x01.", False),                # BINPUT 1 with no slot 0 yet
    (b"\x80\x02]r\x00\x00\x00\x00.", True),     # LONG_BINPUT 0
    (b"\x80\x02]r\x01\x00\x00\x00.", False),
    (b"(lp0\n.", True),                          # PUT 0 (protocol 0)
    (b"(lp1\n.", False),
    (b"\x80\x04]\x94]\x94h\x01.", True),         # MEMOIZE numbers slots itself
])
def test_memo_slots_must_be_numbered_in_order(data, ok):
    if ok:
        safe_loads(data)
    else:
        with pytest.raises(BadPickle, match="memo index 1 at byte"):
            safe_loads(data)


def test_memo_puts_count_every_kind_of_put():
    # slot 0 by BINPUT, slot 1 by MEMOIZE, slot 2 by LONG_BINPUT: all in order
    data = b"\x80\x04]q\x00]\x94]r\x02\x00\x00\x00h\x02.".replace(b"h\x02.", b"h\x02l.")
    data = b"\x80\x04(]q\x00]\x94]r\x02\x00\x00\x00l."
    assert safe_loads(data) == [[], [], []]


def test_broken_streams_are_bad_not_unsafe():
    for data in (b"\x80\x04", b"\x80\x04K", b"\xff", b"\x80\x04a.", b"\x80\x04}]]s.", b"\x80\x04h\x05."):
        with pytest.raises(BadPickle):
            safe_loads(data)


# ------------------------------------------------------------------ decode: JSON and pickle


def _dump(**entry) -> dict:
    e = {"collective_seq_id": 1, "profiling_name": "nccl:all_reduce", "state": "scheduled",
         "process_group": ["0", "default_pg"], "input_sizes": [[4]], "input_dtypes": ["Float"], "frames": []}
    e.update(entry)
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": [0, 1]}},
            "pg_status": {"0": {"last_enqueued_collective": 1}}, "entries": [e]}


@pytest.mark.parametrize("encode", [lambda d: pickle.dumps(d), lambda d: json.dumps(d).encode()])
def test_the_same_dump_in_both_encodings(encode):
    d = decode(encode(_dump()), 3)
    assert (d.rank, d.version, d.encoding in ("pickle", "json")) == (3, "2.10", True)
    (e,) = d.entries
    assert (e.pg, e.seq, e.op, e.state, e.completed, e.input_sizes, e.input_dtypes, e.numel()) == \
        ("0", 1, "nccl:all_reduce", "scheduled", False, [[4]], ["Float"], 4)
    assert d.pg_config == {"0": {"pg_id": "0", "desc": "default_pg", "ranks": [0, 1]}}
    assert d.pg_status == {"0": {"last_enqueued_collective": 1}}


def test_json_is_recognised_after_whitespace_and_as_a_list():
    assert decode(b"  \n" + json.dumps(_dump()).encode()).encoding == "json"
    with pytest.raises(DumpError, match="top level is not a dict"):
        decode(b" [1]")


def test_decode_cap():
    data = json.dumps(_dump()).encode()
    assert decode(data, cap=len(data)).entries
    with pytest.raises(DumpError, match="over the"):
        decode(data, cap=len(data) - 1)
    with pytest.raises(DumpError, match="over the"):
        decode(pickle.dumps(_dump()), cap=10)


@pytest.mark.parametrize(("text", "says"), [
    ('{"entries": [], "x": NaN}', "NaN is not a number"),
    ('{"entries": [], "x": Infinity}', "Infinity is not a number"),
    ('{"entries": [], "x": 1e400}', "1e400 is not a finite number"),
    ('{"entries": [], "x": -1e400}', "-1e400 is not a finite number"),
    ('{"entries": [1,', "bad JSON: "),
    ("[" * 50 + "]" * 50, "bad JSON: nested more than 32 deep"),
    ("[" * 100_000 + "]" * 100_000, "bad JSON: nested too deep"),
])
def test_json_refusals(text, says):
    with pytest.raises(DumpError) as e:
        decode(text.encode())
    assert str(e.value).startswith(says)


def test_a_large_json_dump_is_not_refused_for_its_size():
    # JSON cannot share values, so a big dump is a big tree: the budget grows with the file
    data = json.dumps({"entries": [], "pad": [0] * 1_100_000}).encode()
    assert decode(data).entries == []


def test_json_floats_that_are_finite_are_kept():
    d = decode(json.dumps(_dump(collective_seq_id=7.0, timeout_ms=1.5e3)).encode())
    assert (d.entries[0].seq, d.entries[0].timeout_ms) == (7, 1500)


def test_pickle_refusal_and_breakage_messages():
    with pytest.raises(DumpError) as e:
        decode(b"cos\nsystem\n.")
    assert str(e.value).startswith("refused: opcode GLOBAL")
    with pytest.raises(DumpError) as e:
        decode(b"\x80\x04K")
    assert str(e.value).startswith("not a readable dump: ")
    with pytest.raises(DumpError, match="empty file"):
        decode(b"")


# ------------------------------------------------------------------ normalize: field by field


@pytest.mark.parametrize(("value", "seq"), [
    (5, 5), (5.9, 5), ("12", 12), (" 12 ", 12), ("-3", -3), (True, 1), (False, 0), (None, None),
    ("x", None), ("1.5", None), ([1], None), (2**63 - 1, 2**63 - 1), (-(2**63), -(2**63)),
    ("9" * 18, int("9" * 18)),
])
def test_counters_read_as_whole_numbers(value, seq):
    assert decode(pickle.dumps(_dump(collective_seq_id=value))).entries[0].seq == seq


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, float("inf"), float("-inf"), float("nan"),
                                   "9" * 22, "-" + "9" * 22])
def test_counters_no_64_bit_counter_holds_are_refused(value):
    with pytest.raises(DumpError):
        decode(pickle.dumps(_dump(collective_seq_id=value)))


def test_a_21_digit_string_is_range_checked_not_refused_for_length():
    with pytest.raises(DumpError, match="beyond 64 bits"):
        decode(pickle.dumps(_dump(collective_seq_id="1" * 21)))
    assert decode(pickle.dumps(_dump(collective_seq_id="-" + "0" * 20))).entries[0].seq == 0


def test_names_of_the_wrong_type_read_as_question_marks():
    raw = _dump(profiling_name=["x"], state=3, input_dtypes=[1, "Half", None])
    raw["version"] = 2.5
    raw["comm_lib_version"] = 7
    d = decode(pickle.dumps(raw))
    e = d.entries[0]
    assert (e.op, e.state, e.input_dtypes) == ("?", "3", ["1", "Half", "?"])
    assert (d.version, d.comm_lib_version) == ("2.5", None)
    assert decode(pickle.dumps({**_dump(), "version": None})).version == "?"
    assert decode(pickle.dumps({"entries": []})).version == "?"


def test_frames_keep_text_and_line_numbers_only():
    d = decode(pickle.dumps(_dump(frames=[{"name": "f", "filename": "a.py", "line": "12"}, {"name": 3, "line": "x"}, "junk"])))
    assert d.entries[0].frames == [{"name": "f", "filename": "a.py", "line": 12},
                                   {"name": None, "filename": None, "line": None}]


def test_ranks_from_lists_and_strings():
    raw = _dump()
    raw["pg_config"] = {"0": {"name": "a", "ranks": "[0, 1, -1]"}, "1": {"name": "b", "ranks": [2, "3", "x", 4.0]},
                        "2": {"name": "c", "ranks": None}, "3": "junk"}
    d = decode(pickle.dumps(raw))
    assert {k: v["ranks"] for k, v in d.pg_config.items()} == {"a": [0, 1, -1], "b": [2, 3, 4], "c": []}


def test_group_identity_falls_back_from_name_to_desc_to_id():
    e = _dump()["entries"][0]
    raw = {"entries": [{**e, "process_group": ["", "mygroup"]}, {**e, "process_group": "named"},
                       {**e, "process_group": [], "pg_id": 4}, {**e, "process_group": None}]}
    assert [x.pg for x in decode(pickle.dumps(raw)).entries] == ["mygroup", "named", "4", "?"]


def test_gloo_groups_are_found_by_id_when_the_name_is_empty():
    e = _dump()["entries"][0]
    raw = {"pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}},
           "pg_status": {"0": {"last_enqueued_collective": 3}},
           "entries": [{**e, "process_group": ["", ""], "pg_id": 0}]}
    d = decode(pickle.dumps(raw))
    assert d.pg_config == {"0": {"pg_id": "0", "desc": "", "ranks": [0, 1]}}
    assert d.pg_status == {"0": {"last_enqueued_collective": 3}}
    assert d.entries[0].pg == "0"


def test_named_groups_keep_their_name_across_config_status_and_entries():
    e = _dump()["entries"][0]
    raw = {"pg_config": {"5": {"name": "tp", "desc": "tensor parallel", "ranks": [0, 1]}},
           "pg_status": {"5": {"last_completed_collective": "2"}, "9": {"x": 1}, "7": "junk"},
           "entries": [{**e, "process_group": ["", ""], "pg_id": 5}]}
    d = decode(pickle.dumps(raw))
    assert d.pg_status == {"tp": {"last_completed_collective": 2}, "9": {"x": 1}}
    assert d.entries[0].pg == "tp"


def test_completion_p2p_and_times():
    e = decode(pickle.dumps(_dump(state="completed"))).entries[0]
    assert e.completed and not e.is_p2p
    e = decode(pickle.dumps(_dump(state="started", retired=True))).entries[0]
    assert e.completed
    e = decode(pickle.dumps(_dump(collective_seq_id=0, p2p_seq_id=3))).entries[0]
    assert e.is_p2p and e.p2p_seq == 3
    e = decode(pickle.dumps(_dump(is_p2p=True))).entries[0]
    assert e.is_p2p
    e = decode(pickle.dumps(_dump(time_created_ns=0, timeout_ms="600000", record_id=9, pg_id="2"))).entries[0]
    assert (e.time_created_ns, e.timeout_ms, e.record_id, e.pg_id) == (None, 600000, 9, 2)
    e = decode(pickle.dumps(_dump(seq_id=8, collective_seq_id=None))).entries[0]
    assert e.seq is None
    raw = _dump()
    del raw["entries"][0]["collective_seq_id"]
    raw["entries"][0]["seq_id"] = 8
    assert decode(pickle.dumps(raw)).entries[0].seq == 8


@pytest.mark.parametrize(("sizes", "numel"), [
    ([[4]], 4), ([[2, 3], [5]], 11), ([], None), ([[2, "x"]], None), ([7], 7), ([[]], 1),
    ([[2**62, 4]], None), ([[2**62, 2]], None), ([[2**62 - 1, 2]], 2**63 - 2), ([[2**31, 2**31]], 2**62),
])
def test_numel(sizes, numel):
    assert decode(pickle.dumps(_dump(input_sizes=sizes))).entries[0].numel() == numel


def test_tuples_become_lists_and_huge_shapes_are_refused():
    d = decode(pickle.dumps(_dump(input_sizes=((1, 2), (3,)), output_sizes=((4,),))))
    assert d.entries[0].input_sizes == [[1, 2], [3]] and d.entries[0].output_sizes == [[4]]
    with pytest.raises(DumpError, match="beyond 64 bits"):
        decode(pickle.dumps(_dump(output_sizes=[[2**64]])))
    with pytest.raises(DumpError, match="not a finite number"):
        decode(pickle.dumps(_dump(input_sizes=[[float("nan")]])))


def test_rank_comes_from_the_caller_the_dump_or_nowhere():
    raw = {**_dump(), "rank": 5}
    assert decode(pickle.dumps(raw)).rank == 5
    assert decode(pickle.dumps(raw), 2).rank == 2
    assert decode(pickle.dumps(_dump())).rank is None


def test_not_a_dump():
    with pytest.raises(DumpError, match="no entries, no pg_config"):
        decode(pickle.dumps({"version": "2.10"}))
    assert decode(pickle.dumps({"pg_config": {}})).entries == []


# ------------------------------------------------------------------ read_file


def test_rank_from_name():
    assert rank_from_name("/x/nccl_trace_rank_12") == 12
    assert rank_from_name("/x/rank_3/dump") is None
    assert rank_from_name("fr7") == 7


def test_read_file_names_the_rank_the_owner_and_refuses_what_is_not_a_file(tmp_path):
    p = tmp_path / "fr_rank_1"
    p.write_bytes((NCCL / "nccl_trace_rank_1").read_bytes())
    d = read_file(str(p))
    assert (d.rank, d.path, d.owner) == (1, str(p), "root" if os.geteuid() == 0 else d.owner)
    assert read_file(str(p), rank=4).rank == 4
    with pytest.raises(DumpError, match="over the 100-byte cap"):
        read_file(str(p), cap=100)
    fifo = tmp_path / "fifo_0"
    os.mkfifo(fifo)
    with pytest.raises(DumpError, match="not a regular file"):
        read_file(str(fifo))
    with pytest.raises(DumpError, match="cannot open: No such file"):
        read_file(str(tmp_path / "nope"))
    link = tmp_path / "link_0"
    link.symlink_to(p)
    with pytest.raises(DumpError, match="symlink; hangd does not follow them"):
        read_file(str(link))


def test_read_file_reports_an_unknown_owner_by_uid(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("chown needs root")  # CI runs as root
    p = tmp_path / "fr_rank_0"
    p.write_bytes(pickle.dumps(_dump()))
    os.chown(p, 54321, 54321)
    assert read_file(str(p)).owner == "54321"


# ------------------------------------------------------------------ field details an operator sees


def test_messages_are_exact():
    cases = [
        (lambda: decode(pickle.dumps([1])), "not a flight-recorder dump (top level is not a dict)"),
        (lambda: decode(pickle.dumps({"x": 1})), "not a flight-recorder dump (no entries, no pg_config)"),
        (lambda: decode(pickle.dumps(_dump(collective_seq_id=2**64))),
         "a number beyond 64 bits; a flight-recorder dump holds 64-bit counters"),
        (lambda: decode(pickle.dumps(_dump(collective_seq_id="9" * 30))),
         "a number beyond 64 bits; a flight-recorder dump holds 64-bit counters"),
        (lambda: decode(pickle.dumps(_dump(collective_seq_id=float("inf")))),
         "inf is not a finite number; a flight-recorder dump holds counters"),
    ]
    for call, message in cases:
        with pytest.raises(DumpError) as e:
            call()
        assert str(e.value) == message


def test_read_file_messages_are_exact(tmp_path):
    with pytest.raises(DumpError) as e:
        read_file(str(tmp_path / "nope"))
    assert str(e.value) == "cannot open: No such file or directory"
    (tmp_path / "t").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "t")
    with pytest.raises(DumpError) as e:
        read_file(str(tmp_path / "link"))
    assert str(e.value) == "cannot open: Too many levels of symbolic links (a symlink; hangd does not follow them)"
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(DumpError) as e:
        read_file(str(tmp_path / "fifo"))
    assert str(e.value) == "not a regular file"


def test_read_file_cap_is_inclusive_and_is_passed_to_the_decoder(tmp_path):
    p = tmp_path / "fr_rank_0"
    data = pickle.dumps(_dump())
    p.write_bytes(data)
    assert read_file(str(p), cap=len(data)).entries
    with pytest.raises(DumpError, match=f"{len(data)} bytes is over the {len(data) - 1}-byte cap"):
        read_file(str(p), cap=len(data) - 1)
    big = tmp_path / "big_0"
    with open(big, "wb") as f:
        f.truncate(65 * 1024 * 1024)  # over the default cap, under the one asked for
    with pytest.raises(DumpError) as e:
        read_file(str(big), cap=70 * 1024 * 1024)
    assert "cap" not in str(e.value) and "malformed" in str(e.value)


def test_comm_lib_version_from_either_key():
    assert decode(pickle.dumps({**_dump(), "comm_lib_version": "2.21.5"})).comm_lib_version == "2.21.5"
    assert decode(pickle.dumps({**_dump(), "nccl_version": "2.18.1"})).comm_lib_version == "2.18.1"
    assert decode(pickle.dumps({**_dump(), "comm_lib_version": "", "nccl_version": "2.18.1"})).comm_lib_version == "2.18.1"
    assert decode(pickle.dumps(_dump())).comm_lib_version is None


def test_group_keys_in_pg_config():
    raw = {"entries": [], "pg_config": {"0": "junk", "1": {"name": "", "desc": "tp"}, "3": {"name": "", "desc": ""},
                                        "4": {"desc": "dp", "name": "pp"}}}
    assert sorted(decode(pickle.dumps(raw)).pg_config) == ["3", "pp", "tp"]
    # an empty id with a name keeps the name, even with one status
    raw = {"entries": [], "pg_config": {"": {"name": "world"}}, "pg_status": {"0": {}}}
    assert list(decode(pickle.dumps(raw)).pg_config) == ["world"]
    # an empty id and name with two statuses cannot be matched: the desc names it
    raw = {"entries": [], "pg_config": {"": {"name": "", "desc": "d"}}, "pg_status": {"0": {}, "1": {}}}
    assert list(decode(pickle.dumps(raw)).pg_config) == ["d"]


def test_entry_defaults():
    raw = _dump(process_group=["only"], profiling_name="")
    del raw["entries"][0]["state"]
    e = decode(pickle.dumps(raw)).entries[0]
    assert (e.pg, e.op, e.state, e.completed) == ("only", "?", "", False)
    e = decode(pickle.dumps(_dump(state=["completed"]))).entries[0]
    assert (e.state, e.completed) == ("", False)
    e = decode(pickle.dumps(_dump(time_created_ns=1234, p2p_seq_id=3))).entries[0]
    assert (e.time_created_ns, e.is_p2p, e.seq) == (1234, False, 1)
    e = decode(pickle.dumps(_dump(collective_seq_id=None, p2p_seq_id=None))).entries[0]
    assert e.is_p2p is False
    e = decode(pickle.dumps(_dump(input_sizes=[["9" * 30]]))).entries[0]
    assert e.input_sizes == [["9" * 30]] and e.numel() is None


def test_cycles_anywhere_are_named_as_cycles():
    a: list = []
    a.append(a)
    b: list = [0]
    b.append(b)
    for value in (a, [b], {"x": [b]}):
        with pytest.raises(BadPickle) as e:
            check_tree(value)
        assert str(e.value) == "a container contains itself; a flight-recorder dump is a plain tree"


def test_node_bound_when_a_nested_container_completes():
    check_tree([[1, 2]], max_nodes=4)
    with pytest.raises(BadPickle) as e:
        check_tree([[1, 2]], max_nodes=3)
    assert str(e.value) == "decodes to more than 3 values; refused"


def test_default_node_bound_and_the_budget_safe_loads_gives():
    check_tree(list(range(999_999)))
    with pytest.raises(BadPickle):
        check_tree(list(range(1_000_000)))
    big = list(range(1_100_000))  # more than the default, fine for a file this size
    assert len(safe_loads(pickle.dumps(big, protocol=4))) == 1_100_000


def test_shared_values_are_counted_without_walking_them_again():
    import time
    laughs: object = 0
    for _ in range(40):
        laughs = [laughs, laughs]
    t0 = time.monotonic()
    with pytest.raises(BadPickle, match="more than"):
        check_tree(laughs, max_nodes=10**6)
    assert time.monotonic() - t0 < 0.2  # 2**40 places, refused after 40 distinct lists


def test_exact_refusal_and_breakage_messages():
    with pytest.raises(UnsafePickle) as e:
        safe_loads(b"\x80\x04))R.")
    assert str(e.value) == ("refused: opcode REDUCE at byte 4 would import or call code; "
                            "a flight-recorder dump holds plain data only")
    with pytest.raises(BadPickle) as e:
        safe_loads(b"")
    assert str(e.value) == "empty file"
    with pytest.raises(BadPickle) as e:
        safe_loads(b"\x80\x04a.")
    assert str(e.value) == "malformed pickle: UnpicklingError: unpickling stack underflow"
    with pytest.raises(BadPickle) as e:
        safe_loads(b"\x80\x02]q\x00]q\x02.")
    assert str(e.value) == "memo index 2 at byte 6 is out of order"


def test_names_that_are_huge_numbers_are_refused_not_crashed_on():
    for value in (10**5000, float("nan")):
        with pytest.raises(DumpError):
            decode(pickle.dumps({**_dump(), "version": value}))
    with pytest.raises(DumpError) as e:
        decode(b"")
    assert str(e.value) == "empty file"
