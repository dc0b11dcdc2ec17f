"""Dumps the analysis asks to see whether collectives still complete go only to ranks with a dump
pipe, and say nothing of the others (a server probed every 5 s all day would fill its recordings
with 'no dump pipe' otherwise); the dumps a hang asks for still say why one could not be had."""

from __future__ import annotations

import os

from hangd.config import Settings
from hangd.evidence import Requests
from hangd.sources.live import LiveNode


def test_probes_go_to_ranks_with_a_dump_pipe_and_say_nothing_of_the_others():
    node = LiveNode(Settings(nvml=False, stacks=False))
    me = os.getpid()  # a real process, with no dump pipe
    node.request(Requests(fr_probes=[me]))
    snap = node.sample()
    assert not [a for a in snap.actions if a.pid == me], snap.actions
    node.request(Requests(fr_dumps=[me]))
    snap = node.sample()
    assert [a.what for a in snap.actions if a.pid == me] == \
        ["fr_dump_not_requested: no dump pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE unset)"], snap.actions


def test_a_probe_of_a_rank_with_a_dump_pipe_asks_its_dump(monkeypatch):
    node = LiveNode(Settings(nvml=False, stacks=False))
    me = os.getpid()
    asked: list[int] = []
    monkeypatch.setattr(node.flight, "has_pipe", lambda pid: pid == me)
    monkeypatch.setattr(node.flight, "request_dump", lambda pid: asked.append(pid))  # the pipe's write
    node.request(Requests(fr_probes=[me, me + 1]))
    snap = node.sample()
    assert asked == [me] and [a.what for a in snap.actions if a.pid == me] == ["fr_dump_requested"], snap.actions


def test_a_rank_known_by_its_argument_gets_its_dump_through_the_pipe_of_that_rank(tmp_path):
    """A server's scheduler has no RANK in its environment (its rank is an argument, as SGLang and
    vLLM start them) but sets up the dump pipe: the rank the analysis knows is taught to the source,
    which then writes to that rank's pipe, and to nobody's before."""
    from hangd.snapshot import ProcInfo, Snapshot

    node = LiveNode(Settings(nvml=False, stacks=False))
    me = os.getpid()
    stem = str(tmp_path / "nccl_pipe_")
    fifo = f"{stem}3.pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the rank's watchdog thread, reading
    try:
        node.flight.collect(Snapshot(t=0.0, infos=[ProcInfo(pid=me, environ={"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": stem})]))
        assert not node.flight.has_pipe(me)  # no rank yet: no pipe to write to
        node.request(Requests(fr_dumps=[me], ranks={me: 3}))
        assert node.flight.has_pipe(me)
        snap = node.sample()
        assert [a.what for a in snap.actions if a.pid == me] == ["fr_dump_requested"], snap.actions
        assert os.read(reader, 16) == b"1"
    finally:
        os.close(reader)
