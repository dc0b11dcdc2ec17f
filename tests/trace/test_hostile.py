"""A trace is untrusted input: a malformed one is one line and exit 2, never a traceback.

The hostile corpus is written here, case by case (each names what is wrong with it), then the
reader is fuzzed with hypothesis: any bytes, any JSON events built from the format's field names.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hangd.cli import main
from hangd.trace import TraceError, TraceReader

from ..conftest import ROOT, hangd_cmd
from ..realpg import free_port

META = b'{"format": "hangd-trace/1"}'


def ev(**kw: object) -> bytes:
    return json.dumps(kw).encode() + b"\n"


OK = ev(t=1.0, kind="proc", pid=5, comm="python")
# name -> (meta.json bytes or None for the default, trace.jsonl bytes)
CASES: dict[str, tuple[bytes | None, bytes]] = {
    "t_string": (None, OK + ev(t="2.0", kind="proc", pid=5)),
    "t_null": (None, ev(t=None, kind="proc", pid=5)),
    "t_bool": (None, ev(t=True, kind="proc", pid=5)),
    "t_nan": (None, b'{"t": NaN, "kind": "proc", "pid": 5}\n'),
    "t_overflows_to_inf": (None, b'{"t": 1e999, "kind": "proc", "pid": 5}\n'),
    "t_negative": (None, ev(t=-5, kind="proc", pid=5)),
    "not_utf8": (None, OK + b'{"t": 2.0, "kind": "proc", "pid": 5, "comm": "\xff\xfe"}\n'),
    "binary": (None, bytes(range(256)) * 64),
    "deep_json": (None, b'{"t": 1, "kind": "x", "a": ' + b"[" * 200_000 + b"]" * 200_000 + b"}\n"),
    "line_not_object": (None, OK + b"[1, 2, 3]\n"),
    "kind_missing": (None, b'{"t": 1}\n'),
    "kind_not_string": (None, ev(t=1, kind=5)),
    "proc_without_pid": (None, ev(t=1, kind="proc", comm="x")),
    "pid_string": (None, ev(t=1, kind="proc", pid="5")),
    "pid_bool": (None, ev(t=1, kind="proc", pid=True)),
    "pid_too_large": (None, ev(t=1, kind="proc", pid=2**70)),
    "gpu_util_string": (None, ev(t=1, kind="gpu", index=0, util_gpu="high")),
    "gpu_procs_not_list": (None, ev(t=1, kind="gpu", index=0, procs={"pid": 1})),
    "gpu_proc_pid_null": (None, ev(t=1, kind="gpu", index=0, procs=[{"pid": None}])),
    "gpm_nan": (None, b'{"t": 1, "kind": "gpu", "index": 0, "gpm": {"SM_UTIL": NaN}}\n'),
    "gpm_inf": (None, b'{"t": 1, "kind": "gpu", "index": 0, "gpm": {"SM_UTIL": -1e999}}\n'),
    "environ_list": (None, ev(t=1, kind="proc_info", pid=5, environ=["RANK=0"])),
    "environ_value_int": (None, ev(t=1, kind="proc_info", pid=5, environ={"RANK": 0})),
    "cmdline_string": (None, ev(t=1, kind="proc_info", pid=5, cmdline="python train.py")),
    "file_size_string": (None, ev(t=1, kind="file", path="/x.log", size="big")),
    "file_path_missing": (None, ev(t=1, kind="file", size=3)),
    "stack_pid_float": (None, ev(t=1, kind="stack", pid=1.5, file="files/s.json")),
    "stack_file_number": (None, ev(t=1, kind="stack", pid=1, file=7)),
    "fr_rank_string": (None, ev(t=1, kind="fr_dump", pid=1, rank="zero", file="files/fr")),
    "unavailable_why_null": (None, ev(t=1, kind="unavailable", source="nvml", why=None)),
    "remote_ranks_not_list": (None, ev(t=1, kind="remote", node="a", ranks={"job": "j"})),
    "remote_rank_not_object": (None, ev(t=1, kind="remote", node="a", ranks=[5])),
    "remote_rank_pid_string": (None, ev(t=1, kind="remote", ranks=[{"job": "j", "node": "b", "pid": "7",
                                                                    "reported_at": 1.0}])),
    "remote_rank_without_node": (None, ev(t=1, kind="remote", ranks=[{"job": "j", "pid": 7, "reported_at": 1.0}])),
    "remote_dumps_not_list": (None, ev(t=1, kind="remote_dumps", dumps={"job": "j"})),
    "remote_dumps_missing": (None, ev(t=1, kind="remote_dumps")),
    "remote_dump_not_object": (None, ev(t=1, kind="remote_dumps", dumps=["files/d.json"])),
    "remote_dump_rank_float": (None, ev(t=1, kind="remote_dumps", dumps=[{"job": "j", "node": "b", "rank": 1.5,
                                                                          "read_at": 1.0, "reported_at": 1.0,
                                                                          "file": "files/d.json"}])),
    "remote_dump_file_missing": (None, ev(t=1, kind="remote_dumps", dumps=[{"job": "j", "node": "b", "rank": 1,
                                                                            "read_at": 1.0, "reported_at": 1.0,
                                                                            "file": "files/none.json"}])),
    "xid_inf": (None, b'{"t": 1, "kind": "gpu", "index": 0, "xid": [{"t": Infinity}]}\n'),
    "meta_list": (b"[1, 2]", OK),
    "meta_string": (b'"hangd-trace/1"', OK),
    "meta_t_start_string": (b'{"format": "hangd-trace/1", "t_start": "yesterday"}', OK),
    "meta_log_files_list": (b'{"format": "hangd-trace/1", "log_files": ["a.log"]}', OK),
    "meta_format_int": (b'{"format": 1}', OK),
    "meta_nan": (b'{"format": "hangd-trace/1", "t_end": NaN}', OK),
    "meta_not_utf8": (b'{"format": "hangd-trace/\xff"}', OK),
    "meta_deep": (b"[" * 200_000 + b"]" * 200_000, OK),
}


def write_trace(d: Path, meta: bytes | None, events: bytes) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "meta.json").write_bytes(META if meta is None else meta)
    (d / "trace.jsonl").write_bytes(events)
    return d


def test_a_well_formed_case_reads():
    """The corpus's building block is valid: each case fails for the one thing it changes."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        assert TraceReader(write_trace(Path(tmp), None, OK)).check() == 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_trace_is_a_trace_error(tmp_path, name):
    meta, events = CASES[name]
    d = write_trace(tmp_path / name, meta, events)
    with pytest.raises(TraceError) as e:
        TraceReader(d).check()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", sorted(CASES))
def test_hangd_replay_says_one_line_and_exits_2(tmp_path, capsys, name):
    meta, events = CASES[name]
    d = write_trace(tmp_path / name, meta, events)
    rc = main(["replay", str(d)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("hangd: ") and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("name", ["t_string", "not_utf8", "meta_list", "deep_json"])
def test_hangd_serve_replay_refuses_a_hostile_trace(tmp_path, name):
    meta, events = CASES[name]
    d = write_trace(tmp_path / name, meta, events)
    out = subprocess.run([*hangd_cmd(), "serve", "--listen", f"127.0.0.1:{free_port()}", "--replay", str(d)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


FIELDS = ["t", "kind", "pid", "index", "util_gpu", "procs", "gpm", "environ", "cmdline", "path", "size", "file",
          "rank", "format", "native", "seconds", "what", "source", "why", "state", "io", "thread_states", "fds",
          "ranks", "dumps"]
KINDS = ["gpu", "proc", "proc_info", "file", "stack", "fr_dump", "nccl_ras", "action", "unavailable", "remote",
         "remote_dumps", "other"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8), st.sampled_from(KINDS))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                      max_leaves=8)
events = st.dictionaries(st.sampled_from(FIELDS), values, max_size=6).map(
    lambda d: {"t": 1.0, "kind": "proc", **d})


def _read_all(d: Path) -> None:
    try:
        r = TraceReader(d)
        r.check()
        r.truth()
    except TraceError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(events, min_size=1, max_size=4))
def test_fuzzed_events_are_read_or_refused(tmp_path, lines):
    body = "".join(json.dumps(e, allow_nan=True) + "\n" for e in lines).encode()
    _read_all(write_trace(tmp_path / "fuzz", None, body))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(meta=st.binary(max_size=200), body=st.binary(max_size=400))
def test_fuzzed_bytes_are_read_or_refused(tmp_path, meta, body):
    _read_all(write_trace(tmp_path / "bytes", meta, body))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(meta=st.dictionaries(st.sampled_from(["format", "t_start", "t_end", "log_files", "ranks", "world_size",
                                             "gpus", "sample_hz", "other"]), values, max_size=4))
def test_fuzzed_meta_is_read_or_refused(tmp_path, meta):
    _read_all(write_trace(tmp_path / "meta", json.dumps(meta, allow_nan=True).encode(), OK))


def _gz_trace(d: Path, events: bytes) -> Path:
    import gzip
    d.mkdir(parents=True, exist_ok=True)
    (d / "meta.json").write_bytes(META)
    (d / "trace.jsonl.gz").write_bytes(gzip.compress(events))
    return d


def test_a_gzipped_trace_reads_as_the_plain_one(tmp_path):
    """Committed traces are kept as trace.jsonl.gz: the same events come out."""
    plain = list(TraceReader(write_trace(tmp_path / "plain", None, OK)).events())
    assert plain and list(TraceReader(_gz_trace(tmp_path / "gz", OK)).events()) == plain


@pytest.mark.parametrize("cut", ["truncated", "not_gzip"])
def test_a_broken_gzipped_trace_is_a_trace_error(tmp_path, cut):
    import gzip
    d = _gz_trace(tmp_path / cut, OK * 50)
    raw = (d / "trace.jsonl.gz").read_bytes()
    (d / "trace.jsonl.gz").write_bytes(raw[: len(raw) // 2] if cut == "truncated" else b"not a gzip stream" + raw)
    with pytest.raises(TraceError) as e:
        TraceReader(d).check()
    assert "\n" not in str(e.value)
    assert gzip  # the module the reader uses for these files
