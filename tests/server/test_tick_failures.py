"""A tick that throws is counted and said: /metrics counts it, /readyz says degraded with why, and
the loop goes on (the next good tick clears it)."""

from __future__ import annotations

from hangd.config import Settings
from hangd.daemon import Loop
from hangd.server.runtime import Daemon
from hangd.store.db import Store


def test_failing_ticks_are_counted_and_make_readyz_degraded(tmp_path, monkeypatch):
    settings = Settings(db=f"sqlite:///{tmp_path / 'h.db'}", nvml=False, stacks=False, interval=0.05)
    d = Daemon(settings, store=Store(settings.db))
    assert isinstance(d.loop, Loop)
    calls = {"n": 0}
    real_step = d.front.analyzer.step

    def step(snap):
        calls["n"] += 1
        if calls["n"] <= 3:
            raise RecursionError("maximum recursion depth exceeded")  # what a 100,000-deep dump once did
        return real_step(snap)

    monkeypatch.setattr(d.front.analyzer, "step", step)
    d.loop.stop.clear()
    for _ in range(3):
        d.loop.run(d._after_tick, seconds=0.06)
    assert d.tick_failures >= 3
    ok, why = d.ready()
    assert calls["n"] >= 3
    if calls["n"] > 3:  # a good tick came after the failures: it cleared
        assert "ticks are failing" not in why
    d.last_tick_at = None
    d.loop.last_failure = (1e18, "RecursionError: maximum recursion depth exceeded")
    d.last_tick_at = 1.0
    d.thread = type("T", (), {"is_alive": lambda self: True})()  # the loop runs
    ok, why = d.ready()
    assert ok and why.startswith("degraded: ticks are failing") and "RecursionError" in why
    d.store.close()
