"""GPU history: one row per GPU and minute in the store, read back by GET /gpus/history and by
``hangd status --gpu-history``, on real SQLite and a real ``hangd serve`` replaying a recording."""

from __future__ import annotations

import json
import os
import subprocess
from collections import defaultdict

from hangd.store.db import Batch, Store
from hangd.trace import TraceReader

from ..conftest import ROOT, TRACES, hangd_cmd
from ..realpg import free_port
from ..served import serve

T0 = 1_700_000_040.0  # the start of a minute


def _gpu(index: int, util: int | None, sm: float | None, power_w: float | None) -> dict:
    return {"index": index, "uuid": f"GPU-{index}", "name": "NVIDIA H200", "mem_total": 150754820096,
            "util_gpu": util, "gpm": {"SM_UTIL": sm} if sm is not None else None, "mem_used": 4 << 30,
            "power_w": power_w}


def test_each_node_keeps_one_row_per_gpu_and_minute_and_reads_its_own(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    a, b = Store(url, hostname="node-a"), Store(url, hostname="node-b")
    for i, t in enumerate((T0, T0 + 20, T0 + 40, T0 + 60, T0 + 120)):  # three readings in the first minute
        a.submit(Batch(t=t, gpus=[_gpu(0, 100 - 10 * i, 18.0 if i else None, 700.0), _gpu(1, 0, None, None)]))
        b.submit(Batch(t=t, gpus=[_gpu(0, 5, 5.0, 100.0)]))
    got = a.gpu_history(T0 - 60)
    # the minute under way (T0 + 120) is not written yet
    assert [(r["gpu"], r["t"]) for r in got] == [(0, T0), (0, T0 + 60), (1, T0), (1, T0 + 60)]
    first = got[0]
    assert first["util"] == 90.0 and first["sm"] == 18.0 and first["power_w"] == 700.0 and first["mem_used"] == 4 << 30
    assert got[2]["util"] == 0.0 and got[2]["sm"] is None and got[2]["power_w"] is None  # not read is not 0
    assert [r["gpu"] for r in a.gpu_history(T0 - 60, index=1)] == [1, 1]
    assert a.gpu_history(T0 + 60) == got[1:2] + got[3:4]
    assert [(r["gpu"], r["t"], r["util"]) for r in b.gpu_history(T0 - 60)] == [(0, T0, 5.0), (0, T0 + 60, 5.0)]
    a.close()
    b.close()


def _expected(trace) -> dict[tuple[int, float], float]:
    """Per (GPU, minute) over: the mean of the recording's GPU utilization readings."""
    readings: dict[tuple[int, float], list[int]] = defaultdict(list)
    last = 0.0
    for snap in TraceReader(trace).snapshots():
        last = snap.t
        for g in snap.gpus:
            if g.util_gpu is not None:
                readings[(g.index, (snap.t // 60) * 60)].append(g.util_gpu)
    return {k: sum(v) / len(v) for k, v in readings.items() if k[1] < (last // 60) * 60}


def test_gpus_history_and_status_show_what_the_daemon_recorded(tmp_path, served):
    trace = TRACES / "cpu_hang"
    want = _expected(trace)
    assert want, "the recording spans a minute that is over"
    s = serve(tmp_path, "--replay", str(trace), "--speed", "20", env={"HANGD_TOKEN": "history-token"})
    served.append(s)
    auth = {"Authorization": "Bearer history-token"}
    s.wait_for(lambda s: s.get("/readyz", headers=auth).json()["detail"].startswith("replay finished"), 60, "replay end")
    rows = s.wait_for(lambda s: s.get("/gpus/history", headers=auth).json(), 30, "the GPU history")
    assert {(r["gpu"], r["t"]): r["util"] for r in rows} == want
    assert all(r["t_iso"] and r["power_w"] is not None for r in rows)
    assert {r["gpu"] for r in s.get("/gpus/history", params={"gpu": 1}, headers=auth).json()} == {1}
    assert s.get("/gpus/history", params={"minutes": 0}, headers=auth).status_code == 422
    assert s.get("/gpus/history").status_code == 401

    env = dict(os.environ, HANGD_CONFIG=os.devnull, HANGD_LISTEN=s.url.removeprefix("http://"),
               HANGD_TOKEN="history-token")

    def status(*args: str, **kw) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*hangd_cmd(), "status", *args], capture_output=True, text=True, timeout=60, cwd=ROOT,
                              env={**env, **kw})

    out = status("--gpu-history")
    doc = json.loads(status("--gpu-history", "60", "--json").stdout)
    nobody = status("--gpu-history", HANGD_LISTEN=f"127.0.0.1:{free_port()}")
    bad = status("--gpu-history", "0")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"GPU history of the last 30 min at {s.url}")
    table = [line.split() for line in lines[2:]]
    assert [(int(r[0]), r[2]) for r in table] == [(gpu, f"{util:.0f}%") for (gpu, _), util in sorted(want.items())]
    assert doc["minutes"] == 60 and {(r["gpu"], r["t"]): r["util"] for r in doc["gpu_history"]} == want
    # nothing recorded it here: said in one line, with what to do, and exit 3
    assert nobody.returncode == 3 and nobody.stdout == ""
    assert "GPU history is what hangd serve records. HINT: run hangd serve" in nobody.stderr
    assert bad.returncode == 2 and "is not a whole number of minutes from 1 to 1440" in bad.stderr
