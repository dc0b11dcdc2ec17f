"""Hardware causes: XIDs and clock-event (throttle) reasons injected at the NVML boundary, on top
of GPU readings recorded on 2 real H200s, reach the right GPU, the recorded trace, and the
incident's summary and evidence."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pynvml
import pytest

from hangd.analysis.report import clock
from hangd.replay import replay_result, run_replay
from hangd.sources.nvml import NvmlSource
from hangd.trace import TraceReader

from ..conftest import DATA, TRACES
from ..fake_nvml import FakeNvml, analyze_through_nvml, install, meta, through_nvml

NCCL_STALL = TRACES / "nccl_stall"  # rank r on GPU r; rank 1 stops calling collectives
STRAGGLER = DATA / "traces" / "h200x2-live" / "straggler"  # rank r on GPU r; rank 1 sleeps before every step


def uuid_of(trace: Path, index: int) -> str:
    return next(g["uuid"] for g in meta(trace)["gpus"] if g["index"] == index)


def hung_at(trace: Path) -> float:
    return min(x["t"] for x in map(json.loads, (trace / "truth.jsonl").read_text().splitlines()) if x["state"] == "hung")


def xid_once(index: int, code: int, at: float):
    posted: list[float] = []

    def inject(t: float, fake: FakeNvml) -> None:
        if not posted and t >= at:
            posted.append(t)
            fake.post_xid(index, code)
    return inject, posted


@pytest.mark.parametrize("gpu", [1, 0])
def test_xid_before_a_hang_is_in_the_incident_on_the_gpu_that_raised_it(monkeypatch, tmp_path, gpu):
    """XID 79 on one GPU 4 s before the stall: the hang names that GPU, its uuid, the XID, what it
    means and when, relative to when that GPU's rank stopped progressing; the snapshot and the
    recorded trace carry it on that GPU (not GPU 0 by default); a replay of the recording agrees."""
    inject, posted = xid_once(gpu, 79, hung_at(NCCL_STALL) - 4)
    res, snaps, _ = analyze_through_nvml(monkeypatch, NCCL_STALL, inject, record_to=tmp_path / "rec")
    uuid, other = uuid_of(NCCL_STALL, gpu), uuid_of(NCCL_STALL, 1 - gpu)

    carried = [(g.index, g.uuid, g.xid) for s in snaps for g in s.gpus if g.xid]
    assert carried == [(gpu, uuid, [{"xid": 79, "t": round(posted[0], 3)}])]

    hangs = [i for i in res["incidents"] if i["kind"] == "nccl_stall"]
    assert len(hangs) == 1 and hangs[0]["culprit_ranks"] == [1]
    inc = hangs[0]
    said = f"GPU {gpu} ({uuid}) reported XID 79 (GPU has fallen off the bus) at {clock(posted[0])}, "
    assert inc["summary"].startswith(said), inc["summary"]
    first = inc["summary"].split(". ")[0]
    assert first.endswith(f"s before rank {gpu} stopped progressing"), first
    assert other not in inc["summary"]
    (x,) = inc["evidence"]["hardware"]["xids"]
    assert {k: x[k] for k in ("gpu", "uuid", "xid", "meaning", "severity", "ranks", "count")} == {
        "gpu": gpu, "uuid": uuid, "xid": 79, "meaning": "GPU has fallen off the bus", "severity": "fatal",
        "ranks": [gpu], "count": 1}
    assert x["before_stall_s"] > 0

    # the recorded trace carries the XID on that GPU, and its replay says the same
    events = [json.loads(line) for line in (tmp_path / "rec" / "trace.jsonl").read_text().splitlines()]
    assert [(e["index"], e["uuid"]) for e in events if e.get("xid")] == [(gpu, uuid)]
    an, _ = run_replay(str(tmp_path / "rec"))
    again = [i for i in replay_result(an)["incidents"] if i["kind"] == "nccl_stall"]
    assert again and again[0]["summary"].startswith(said)
    assert again[0]["evidence"]["hardware"]["xids"] == inc["evidence"]["hardware"]["xids"]


def test_a_gpu_that_fell_off_the_bus_is_still_named_with_its_xid(monkeypatch):
    """After XID 79 the GPU answers nothing (GPU_IS_LOST): its reading carries only the XID, and the
    hang still names it and its rank, from the GPU that rank was last seen on."""
    at = hung_at(NCCL_STALL) - 4
    lost: list[float] = []

    def inject(t: float, fake: FakeNvml) -> None:
        if not lost and t >= at:
            lost.append(t)
            fake.post_xid(1, 79)
            fake.lost.add(1)

    res, snaps, _ = analyze_through_nvml(monkeypatch, NCCL_STALL, inject)
    after = [s for s in snaps if s.gpus and s.t >= lost[0]]
    assert all("nvml:1" in s.unavailable for s in after)
    (gone,) = [g for g in after[0].gpus if g.index == 1]
    assert gone.xid and gone.xid[0]["xid"] == 79 and gone.util_gpu is None and gone.mem_used is None
    hangs = [i for i in res["incidents"] if i["kind"] in ("nccl_stall", "host_stall")]
    assert hangs, res["incidents"]
    assert f"GPU 1 ({uuid_of(NCCL_STALL, 1)}) reported XID 79 (GPU has fallen off the bus)" in hangs[0]["summary"]
    assert hangs[0]["evidence"]["hardware"]["xids"][0]["ranks"] == [1]


THROTTLE = pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonSwPowerCap


@pytest.mark.parametrize("gpu", [1, 0])
def test_a_throttled_straggler_says_so_and_only_for_its_gpu(monkeypatch, gpu):
    """HW thermal slowdown and SW power cap on the straggler's GPU (1): the straggler incident says
    that GPU was throttled while rank 1 straggled, and that its peer's was not. The same reasons on
    the waiting rank's GPU (0): nothing is said of rank 1's GPU being throttled."""
    def inject(t: float, fake: FakeNvml) -> None:
        fake.extra_reasons[gpu] = THROTTLE

    res, snaps, _ = analyze_through_nvml(monkeypatch, STRAGGLER, inject)
    assert all({"sw_power_cap", "hw_thermal_slowdown"} <= set(g.clock_events or ())
               for s in snaps for g in s.gpus if g.index == gpu)
    (inc,) = [i for i in res["incidents"] if i["kind"] == "straggler"]
    assert inc["culprit_ranks"] == [1]
    th = inc["evidence"]["hardware"]["throttle"]
    assert set(th[str(gpu)]["reasons"]) == {"hw_thermal_slowdown", "sw_power_cap"}
    assert th[str(gpu)]["throttled_fraction"] == 1.0 and th[str(gpu)]["uuid"] == uuid_of(STRAGGLER, gpu)
    assert th[str(1 - gpu)]["throttled_fraction"] < 0.1
    if gpu == 1:
        assert (f"GPU 1 ({uuid_of(STRAGGLER, 1)}) was throttled (SW power cap, HW thermal slowdown) in 100% of its "
                "readings over the last 60 s while rank 1 straggled; the GPUs of the ranks waiting for it were not"
                ) in inc["summary"], inc["summary"]
    else:
        assert "throttled" not in inc["summary"], inc["summary"]


def test_health_is_read_at_a_low_rate_and_a_failing_call_is_unknown_logged_once(monkeypatch, caplog):
    """ECC counts and remapped rows are read every ``health_every`` ticks, carried between; a call
    that fails leaves its value unknown (None, never 0) and is logged once per GPU; one a GPU does
    not support is not asked again."""
    caplog.set_level(logging.INFO, logger="hangd.sources.nvml")

    def inject(t: float, fake: FakeNvml) -> None:
        fake.fail["nvmlDeviceGetRemappedRows"] = pynvml.NVML_ERROR_UNKNOWN
        fake.ecc = {0: (3, 0), 1: (0, 2)}

    _, snaps, fake = analyze_through_nvml(monkeypatch, STRAGGLER, inject, health_every=20)
    gpus = [g for s in snaps for g in s.gpus]
    ticks = len([s for s in snaps if s.gpus])
    assert all(g.remap_pending is None and g.remap_failure is None for g in gpus)
    assert {(g.index, g.ecc_corrected, g.ecc_uncorrected) for g in gpus} == {(0, 3, 0), (1, 0, 2)}
    reads = math.ceil(ticks / 20)
    assert fake.calls["nvmlDeviceGetRemappedRows"] == 2 * reads
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 2 * 2 * reads
    failed = [r for r in caplog.records if "remapped_rows failed" in r.getMessage()]
    assert sorted(r.getMessage()[:5] for r in failed) == ["GPU 0", "GPU 1"]

    fake2 = FakeNvml(meta(STRAGGLER)["gpus"])
    fake2.fail["nvmlDeviceGetTotalEccErrors"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    install(monkeypatch, fake2)
    snaps2 = list(through_nvml(STRAGGLER, fake2, NvmlSource(health_every=20)))
    assert all(g.ecc_uncorrected is None and g.ecc_corrected is None for s in snaps2 for g in s.gpus)
    assert fake2.calls["nvmlDeviceGetTotalEccErrors"] == 2 * 2  # once per GPU and counter, then never again


def test_traces_without_the_health_fields_read_them_as_unknown():
    """The committed traces predate these fields: a throttle bit in their bitmask is not guessed at,
    ECC is unknown, and no incident speaks of hardware."""
    gpus = [g for s in TraceReader(STRAGGLER).snapshots() for g in s.gpus]
    assert gpus and all(g.clock_events is None and g.ecc_uncorrected is None and g.remap_failure is None
                        and g.nvlink_errors is None and not g.xid for g in gpus)
    an, _ = run_replay(str(STRAGGLER))
    (inc,) = [i for i in replay_result(an)["incidents"] if i["kind"] == "straggler"]
    assert "hardware" not in inc["evidence"] and "throttled" not in inc["summary"]


def test_what_is_kept_of_gpus_and_xids_is_bounded():
    """A node that starts jobs all day: which GPU each process used and the XIDs are kept for
    ``KEEP_S`` and for at most ``MAX_PIDS`` processes; an XID's count on /metrics stays."""
    from hangd.analysis.hardware import KEEP_S, MAX_PIDS, HardwareLog
    from hangd.snapshot import GpuProc, GpuSample, Snapshot

    log = HardwareLog()
    t = 1.0e9
    for i in range(3 * MAX_PIDS):
        t += 0.01  # 100 new processes a second
        xid = [{"xid": 31, "t": t}] if i == 0 else None
        log.feed(Snapshot(t=t, gpus=[GpuSample(index=0, uuid="GPU-a", procs=[GpuProc(pid=10_000 + i, used=1)], xid=xid)]))
        assert len(log.pid_gpus) <= MAX_PIDS + 1
    assert log.gpus_of(10_000 + 3 * MAX_PIDS - 1) == [0]
    log.feed(Snapshot(t=t + KEEP_S + 61, gpus=[GpuSample(index=0, uuid="GPU-a")]))
    assert not log.pid_gpus and not log.xids
    assert log.totals == {(0, "GPU-a", 31): 1}
