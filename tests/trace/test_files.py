"""A trace's files are opened as untrusted: a FIFO swapped in after the reader looked never blocks
it, a symlink is not followed, and the schema the reader checks is the snapshot records' own."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from hangd.trace import TraceError, TraceReader, events_file
from hangd.trace.schema import EVENTS, check_event


def _trace(d: Path, events: list[dict[str, Any]]) -> Path:
    (d / "files").mkdir(parents=True)
    (d / "meta.json").write_text('{"format": "hangd-trace/1"}')
    (d / "trace.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return d


def _in_thread(fn: Any) -> dict[str, Any]:
    """Run ``fn`` on a daemon thread; what it returned or raised, or that it is still blocked
    (a blocked open of a FIFO would hold the test forever otherwise)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except Exception as e:
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    out["blocked"] = t.is_alive()
    return out


@pytest.fixture
def looked_before_the_swap(monkeypatch):
    """Every is_file() says yes, as it did before the file was swapped for a FIFO."""
    monkeypatch.setattr(Path, "is_file", lambda self: True)


def test_a_fifo_swapped_in_for_a_stack_file_does_not_block_the_reader(tmp_path, looked_before_the_swap):
    d = _trace(tmp_path / "t", [{"t": 1.0, "kind": "proc", "pid": 5, "comm": "python"},
                                {"t": 1.0, "kind": "stack", "pid": 5, "file": "files/s.json"}])
    os.mkfifo(d / "files" / "s.json")
    got = _in_thread(lambda: list(TraceReader(d).snapshots()))
    assert not got["blocked"] and "error" not in got
    (st,) = got["value"][0].stacks
    assert st.error == "file missing" and st.threads == []


@pytest.mark.parametrize("name", ["trace.jsonl", "meta.json"])
def test_a_fifo_for_the_events_or_the_meta_is_refused_without_blocking(tmp_path, looked_before_the_swap, name):
    d = _trace(tmp_path / "t", [{"t": 1.0, "kind": "proc", "pid": 5}])
    (d / name).unlink()
    os.mkfifo(d / name)
    got = _in_thread(lambda: TraceReader(d).check())
    assert not got["blocked"]
    if name == "meta.json":  # a meta.json that is no file is no meta.json, as before
        assert got.get("value") == 1
    else:
        assert isinstance(got.get("error"), TraceError) and "not a regular file" in str(got["error"])


def test_a_symlinked_events_file_is_not_followed(tmp_path):
    d = _trace(tmp_path / "t", [{"t": 1.0, "kind": "proc", "pid": 5}])
    (tmp_path / "elsewhere.jsonl").write_bytes((d / "trace.jsonl").read_bytes())
    (d / "trace.jsonl").unlink()
    (d / "trace.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    assert events_file(d) == d / "trace.jsonl"
    with pytest.raises(TraceError) as e:
        TraceReader(d).check()
    assert "\n" not in str(e.value)


def test_the_schema_is_the_snapshot_records():
    """A field of a snapshot record is checked with its declared type, strictly, with no copy of
    the record's fields kept by hand."""
    from hangd.snapshot import GpuSample, ProcSample

    for cls, kind in ((GpuSample, "gpu"), (ProcSample, "proc")):
        fields = set(EVENTS[kind].model_fields)
        assert set(cls.__dataclass_fields__) <= fields | {"procs"}
    check_event({"t": 1.0, "kind": "gpu", "index": 0, "sm_clock": 1980, "gpm": {"SM_UTIL": 3}}, "w")
    for bad, field in (({"sm_clock": "1980"}, "sm_clock"), ({"sm_clock": True}, "sm_clock"),
                       ({"gpm": {"SM_UTIL": "3"}}, "gpm.SM_UTIL"), ({"index": None}, "index")):
        with pytest.raises(TraceError) as e:
            check_event({"t": 1.0, "kind": "gpu", "index": 0, **bad}, "w")
        assert repr(field) in str(e.value)
