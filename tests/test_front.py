"""The analyzer behind its front: callers read typed records and never its lock, the analyzer or
the store; one loop runs a live node and a trace alike; every command judges with the
configured thresholds."""

from __future__ import annotations

import ast
import dataclasses
import socket
import time
from pathlib import Path

import pytest

from hangd.analysis.thresholds import Thresholds
from hangd.config import THRESHOLD_SETTINGS, Settings, thresholds_from
from hangd.replay import run_replay
from hangd.server.runtime import Daemon
from hangd.store.db import Store

from .conftest import ROOT, TRACES

# what the API, /metrics and the commands are made of
CALLERS = [*sorted((ROOT / "hangd/server/routes").glob("*.py")), ROOT / "hangd/server/metrics.py",
           ROOT / "hangd/status.py", ROOT / "hangd/cli.py"]
FORBIDDEN = ("lock", "analyzer", "store")


def reaches_in(path: Path) -> list[str]:
    """Every ``x.lock``, ``x.analyzer`` and ``x.store`` (and so ``x.store.y``) in a module."""
    tree = ast.parse(path.read_text(), str(path))
    hits = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in FORBIDDEN]
    return [f"{path.name}:{n.lineno}:{n.col_offset}: .{n.attr}" for n in sorted(hits, key=lambda n: (n.lineno, n.col_offset))]


def test_no_route_metric_or_command_reaches_into_the_analyzer_or_the_store():
    assert len(CALLERS) >= 6
    found = [hit for p in CALLERS for hit in reaches_in(p)]
    assert not found, "go through Daemon / hangd.front.Front instead:\n" + "\n".join(found)


def test_the_check_sees_a_reach_in(tmp_path):
    bad = tmp_path / "route.py"
    bad.write_text("from hangd.store.db import Store\n\ndef f(daemon):\n    with daemon.lock:\n"
                   "        return daemon.analyzer.jobs(), daemon.store.healthy\n")
    assert [h.split(": ")[1] for h in reaches_in(bad)] == [".lock", ".analyzer", ".store"]


def test_every_threshold_that_has_a_setting_takes_its_value():
    shared = {f.name: THRESHOLD_SETTINGS.get(f.name, f.name) for f in dataclasses.fields(Thresholds)
              if THRESHOLD_SETTINGS.get(f.name, f.name) in Settings.model_fields}
    assert {"hang_gpu_s", "hang_host_s", "hang_io_s", "gone_after_s", "node_stale_s"} <= set(shared)
    given = {setting: float(getattr(Thresholds(), field)) + 1.5 for field, setting in shared.items()}
    th = thresholds_from(Settings(**given))
    assert {field: getattr(th, field) for field in shared} == {field: given[s] for field, s in shared.items()}
    # the others keep their defaults
    rest = [f.name for f in dataclasses.fields(Thresholds) if f.name not in shared]
    assert {f: getattr(th, f) for f in rest} == {f: getattr(Thresholds(), f) for f in rest}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("command", ["status", "record"])
def test_status_and_record_judge_with_the_configured_thresholds(command, monkeypatch, tmp_path):
    import hangd.daemon
    from hangd.record import record
    from hangd.status import collect_status

    built: list[Thresholds] = []

    def spy(settings: Settings) -> Thresholds:
        built.append(thresholds_from(settings))
        return built[-1]

    monkeypatch.setattr(hangd.daemon, "thresholds_from", spy)
    s = Settings(nvml=False, stacks=False, listen=f"127.0.0.1:{_free_port()}", hang_gpu_s=3.5, gone_after_s=9.0,
                 db=f"sqlite:///{tmp_path / 'h.db'}")
    if command == "status":
        st = collect_status(s, seconds=0.2)
        assert st["daemon"]["answered"] is False
    else:
        res = record(s, str(tmp_path / "trace"), seconds=0.3, hz=10)
        assert res["snapshots"] >= 1
    assert [(t.hang_gpu_s, t.gone_after_s) for t in built] == [(3.5, 9.0)]


def test_serve_replay_runs_the_loop_of_hangd_replay(tmp_path):
    """hangd serve --replay and hangd replay: one loop, the same incidents and state changes."""
    trace = str(TRACES / "nccl_stall")
    an, info = run_replay(trace)
    settings = Settings(db=f"sqlite:///{tmp_path / 'h.db'}", replay=trace, speed=0.0, nvml=False, stacks=False)
    d = Daemon(settings, store=Store(settings.db))
    try:
        d.start()
        deadline = time.monotonic() + 120
        while not d.replay_done and time.monotonic() < deadline:
            time.sleep(0.05)
        assert d.replay_done and d.tick_failures == 0
        assert d.ticks == d.loop.ticks == info["snapshots"] > 0
        want = [{k: v for k, v in i.to_dict().items() if k != "acked"} for i in an.incidents()]
        got = [{k: v for k, v in i.to_dict().items() if k != "acked"} for i in d.front.incidents()]
        assert got == want and any(i["kind"] == "nccl_stall" for i in got)
        assert [p.to_dict() for p in d.front.processes()] == an.processes()
        assert [j.to_dict() for j in d.front.jobs()] == an.jobs()
    finally:
        d.shutdown()
        d.store.close()
