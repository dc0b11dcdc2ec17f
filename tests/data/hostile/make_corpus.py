"""Writes the hostile flight-recorder corpus beside this file, and ``expected.json``: for each
file, ``"reads"`` or a phrase the refusal must contain. Run it again after changing a payload:
``python tests/data/hostile/make_corpus.py``. The payloads that would run code call harmless
functions (os.getpid, print), so a file loaded by mistake does no damage."""

from __future__ import annotations

import json
import pickle
import random
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REAL = HERE.parent / "traces" / "h200x2" / "nccl_stall" / "files" / "nccl_trace_rank_0"


def _s(text: str) -> bytes:  # SHORT_BINUNICODE
    b = text.encode()
    return b"\x8c" + bytes([len(b)]) + b


def _dump(entry: dict) -> dict:
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": [0, 1]}},
            "pg_status": {"0": {"last_enqueued_collective": 1, "last_completed_collective": 0}},
            "entries": [{"collective_seq_id": 1, "profiling_name": "nccl:all_reduce", "state": "scheduled",
                         "process_group": ["0", "default_pg"], "input_sizes": [[4]], "input_dtypes": ["Float"],
                         "frames": [], **entry}]}


def _nested_list(depth: int) -> bytes:
    # EMPTY_LIST, then depth times (EMPTY_LIST ... APPEND): built without recursion
    return b"\x80\x04" + b"]" * (depth + 1) + b"a" * depth + b"."


def corpus() -> dict[str, tuple[bytes, str]]:
    P4, P5 = b"\x80\x04", b"\x80\x05"
    files: dict[str, tuple[bytes, str]] = {
        # every opcode that imports or calls, each in a stream that would run it
        "global_reduce.pkl": (b"cos\ngetpid\n(tR.", "opcode GLOBAL"),
        "stack_global_reduce.pkl": (P4 + _s("builtins") + _s("print") + b"\x93" + _s("pwned") + b"\x85R.", "opcode STACK_GLOBAL"),
        "inst.pkl": (b"(S'pwned'\nibuiltins\nprint\n.", "opcode INST"),
        "obj.pkl": (b"(cbuiltins\nprint\nS'pwned'\no.", "opcode GLOBAL"),
        "obj_alone.pkl": (P4 + b"()o.", "opcode OBJ"),
        "reduce_alone.pkl": (P4 + b"))R.", "opcode REDUCE"),
        "build_alone.pkl": (P4 + b"}}b.", "opcode BUILD"),
        "newobj_alone.pkl": (P4 + b"))\x81.", "opcode NEWOBJ"),
        "newobj_ex_alone.pkl": (P4 + b")))\x92.", "opcode NEWOBJ_EX"),
        "ext1.pkl": (P4 + b"\x82\x01)R.", "opcode EXT1"),
        "ext2.pkl": (P4 + b"\x83\x01\x01)R.", "opcode EXT2"),
        "ext4.pkl": (P4 + b"\x84\x01\x01\x01\x00)R.", "opcode EXT4"),
        "persid.pkl": (b"Ppwned\n.", "opcode PERSID"),
        "binpersid.pkl": (P4 + _s("pwned") + b"Q.", "opcode BINPERSID"),
        "next_buffer.pkl": (P5 + b"\x97.", "opcode NEXT_BUFFER"),
        "readonly_buffer.pkl": (P5 + b"C\x01a\x98.", "opcode READONLY_BUFFER"),
        "evil_entry.pkl": (pickle.dumps({"version": "2.10", "entries": [{"x": _Evil()}]}, protocol=4), "opcode STACK_GLOBAL"),
        # broken streams
        "empty.pkl": (b"", "empty"),
        "truncated.pkl": (REAL.read_bytes()[: REAL.stat().st_size // 2], "truncated"),
        "garbage.bin": (random.Random(7).randbytes(4096), "malformed"),
        "no_stop.pkl": (P4 + b"K\x01", "malformed"),
        "stack_underflow.pkl": (P4 + b"a.", "malformed"),
        "unhashable_key.pkl": (P4 + b"}]]s.", "malformed"),
        # memory and depth
        "memo_index_2_31.pkl": (P4 + b"]r" + struct.pack("<I", 2**31) + b".", "memo index"),
        "nested_list_100000.pkl": (_nested_list(100_000), "nested more than"),
        "self_reference.pkl": (P4 + b"]\x94(h\x00e.", "contains itself"),
        # {"entries": (x, x)} with x = (y, y) ... 30 levels: 2**30 values from 200 bytes
        "billion_laughs.pkl": (P4 + b"}" + _s("entries") + b"K\x00"
                               + b"".join(b"\x94h" + bytes([i]) + b"\x86" for i in range(30)) + b"s.", "more than"),
        "nested_input_sizes.pkl": (pickle.dumps(_dump({"input_sizes": _deep(5000)}), protocol=4), "nested more than"),
        # numbers no counter holds
        "seq_inf.pkl": (pickle.dumps(_dump({"collective_seq_id": float("inf")})), "not a finite number"),
        "seq_nan.pkl": (pickle.dumps(_dump({"collective_seq_id": float("nan")})), "not a finite number"),
        "seq_5000_digits.pkl": (pickle.dumps(_dump({"collective_seq_id": 10**5000})), "beyond 64 bits"),
        "shape_5000_digits.pkl": (pickle.dumps(_dump({"input_sizes": [[10**5000]]})), "beyond 64 bits"),
        "rank_string_5000_digits.pkl": (pickle.dumps({"version": "2.10", "pg_config": {"0": {"ranks": "9" * 5000}}}), "beyond 64 bits"),
        # hostile but readable: wrong types are dropped, a huge counter does not stall the analysis
        "wrong_types.pkl": (pickle.dumps({"version": 7, "pg_config": [1], "pg_status": "x", "entries": [5, {
            "collective_seq_id": "x", "input_sizes": 7, "input_dtypes": 3, "frames": "abc", "process_group": 9,
            "profiling_name": ["a"], "state": {"b": 1}}]}), "reads"),
        "last_enqueued_2_62.pkl": (pickle.dumps({**_dump({}), "pg_status": {"0": {"last_enqueued_collective": 2**62}}}), "reads"),
        # JSON
        "nested_100000.json": (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
        "nested_dump_100000.json": (b'{"version": "2.10", "entries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deep"),
        "seq_1e999.json": (json.dumps(_dump({})).replace('"collective_seq_id": 1', '"collective_seq_id": 1e999').encode(), "not a finite number"),
        "seq_nan.json": (json.dumps(_dump({"collective_seq_id": float("nan")})).encode(), "NaN"),
        "seq_infinity.json": (json.dumps(_dump({"collective_seq_id": float("-inf")})).encode(), "-Infinity"),
        "seq_5000_digits.json": (json.dumps(_dump({})).replace('"collective_seq_id": 1', '"collective_seq_id": ' + "9" * 5000).encode(), "bad JSON"),
        "deep_input_sizes.json": (json.dumps(_dump({"input_sizes": _deep(500)})).encode(), "nested more than"),
        "not_utf8.json": (b'{"version": "\xff\xfe"}', "bad JSON"),
        "top_level_list.json": (b"[1, 2]", "top level is not a dict"),
        "truncated.json": (json.dumps(_dump({})).encode()[:50], "bad JSON"),
        "wrong_types.json": (json.dumps({"version": [], "pg_config": {"0": 5}, "entries": {"a": 1}}).encode(), "reads"),
    }
    return files


def _deep(n: int) -> list:
    v: list = []
    for _ in range(n):
        v = [v]
    return v


class _Evil:
    def __reduce__(self) -> tuple:
        import os
        return (os.getpid, ())


def main() -> None:
    sys.setrecursionlimit(50_000)  # pickle.dumps and json.dumps of the 5000-deep shapes recurse
    expected = {}
    for name, (data, expect) in corpus().items():
        (HERE / name).write_bytes(data)
        expected[name] = expect
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    print(f"{len(expected)} files")


if __name__ == "__main__":
    main()
