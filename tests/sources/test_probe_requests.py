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
