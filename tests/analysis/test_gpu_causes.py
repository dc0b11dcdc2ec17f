"""What a hang or straggler incident says of the GPUs of its ranks (XIDs, a failed row remapping,
throttling), and the XIDs of a GPU's record in the API: the words and evidence an operator reads,
from readings fed to the node view as NVML gives them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hangd.analysis import gpucause
from hangd.analysis.hardware import HardwareLog, gpu_record
from hangd.analysis.identity import Job
from hangd.analysis.nodeview import NodeView
from hangd.analysis.report import clock
from hangd.snapshot import GpuProc, GpuSample, Snapshot

GiB = 1 << 30
RANK0, RANK1 = 11, 12  # rank r's pid, on GPU r


def _gpu(index: int, **kw: Any) -> GpuSample:
    return GpuSample(index=index, procs=[GpuProc(pid=RANK0 + index, used=GiB)], **kw)


def _view(*readings: tuple[float, list[GpuSample]]) -> NodeView:
    view = NodeView()
    for t, gpus in readings:
        view.feed(Snapshot(t=t, gpus=gpus))
    return view


def _job(t: float) -> Any:
    """The job as a detector sees it at ``t``: 2 ranks, which GPU each uses known from NVML."""
    return SimpleNamespace(job=Job(id="j", name="train", ranks={RANK0: 0, RANK1: 1}), t=t,
                           live=[RANK0, RANK1], sigs={})


def _hang(view: NodeView, t: float, stopped_at: float) -> tuple[list[str], dict[str, Any]]:
    return gpucause.hang(view, _job(t), stopped_at, {RANK0: stopped_at, RANK1: stopped_at})


def test_an_xid_read_before_the_gpu_gave_its_uuid_is_named_with_the_uuid_learned_later():
    # wrong: the incident names "GPU 1" without the UUID the operator needs to find the card
    view = _view((1000.0, [_gpu(0, uuid="GPU-0000"), _gpu(1, xid=[{"xid": 79, "t": 1000.0}])]),
                 (1001.0, [_gpu(0, uuid="GPU-0000"), _gpu(1, uuid="GPU-1111")]))
    sentences, ev = _hang(view, 1002.0, 1001.0)
    assert sentences == [f"GPU 1 (GPU-1111) reported XID 79 (GPU has fallen off the bus) at {clock(1000.0)}, "
                         "1 s before rank 1 stopped progressing"]
    assert ev["xids"][0]["uuid"] == "GPU-1111"


def test_an_xid_half_a_second_after_the_stall_is_said_to_come_after_it():
    # wrong: "as rank 1 stopped" while before_stall_s says it came 0.5 s after
    view = _view((1001.0, [_gpu(0), _gpu(1, uuid="GPU-1111", xid=[{"xid": 79, "t": 1000.5}])]))
    sentences, ev = _hang(view, 1002.0, 1000.0)
    assert sentences[0].endswith(", 0 s after rank 1 stopped progressing"), sentences
    assert ev["xids"][0]["before_stall_s"] == -0.5


def test_an_xid_that_is_often_the_jobs_own_fault_says_so():
    # wrong: XID 31 is blamed on the GPU without the note that the job's own bad access causes it
    view = _view((1001.0, [_gpu(0), _gpu(1, uuid="GPU-1111", xid=[{"xid": 31, "t": 1000.0}])]))
    sentences, ev = _hang(view, 1002.0, 1001.0)
    assert sentences[0].endswith("stopped progressing (often the job's own fault (an illegal memory access))"), \
        sentences
    assert ev["xids"][0]["cause"] == "application"


def test_an_xid_hangd_does_not_know_has_an_unknown_cause():
    # wrong: the evidence gives an XID hangd's table lacks a made-up cause instead of "unknown"
    view = _view((1001.0, [_gpu(0), _gpu(1, uuid="GPU-1111", xid=[{"xid": 999, "t": 1000.0}])]))
    _, ev = _hang(view, 1002.0, 1001.0)
    (x,) = ev["xids"]
    assert (x["meaning"], x["severity"], x["cause"]) == ("not in hangd's XID table", "unknown", "unknown")


def test_a_failed_row_remapping_is_said_and_in_the_evidence_of_that_gpu():
    # wrong: the sentence shouts, or the GPU's memory state is missing from the incident's "gpus"
    bad = {"uuid": "GPU-1111", "ecc_uncorrected": 0, "remap_pending": False, "remap_failure": True}
    view = _view((1000.0, [_gpu(0), _gpu(1, **bad)]), (1001.0, [_gpu(0), _gpu(1, **bad)]))
    sentences, ev = _hang(view, 1002.0, 1001.0)
    assert sentences == ["GPU 1 (GPU-1111) of rank 1 has a failed row remapping (its memory is bad: replace or "
                         "reset the GPU)"]
    assert list(ev) == ["gpus"] and ev["gpus"]["1"]["remap_failure"] is True
    assert ev["gpus"]["1"]["uuid"] == "GPU-1111" and "0" not in ev["gpus"]


def _throttled_straggler() -> tuple[list[str], dict[str, Any]]:
    """Rank 1 straggles; its GPU 1 was throttled in 2 of 3 readings (power cap in both, heat in one);
    rank 0's GPU 0 never was."""
    reasons = [["sw_power_cap", "hw_thermal_slowdown"], ["sw_power_cap", "gpu_idle"], ["gpu_idle"]]
    view = _view(*((1000.0 + i, [_gpu(0, uuid="GPU-0000", clock_events=[]),
                                 _gpu(1, uuid="GPU-1111", clock_events=r)]) for i, r in enumerate(reasons)))
    return gpucause.straggler(view, _job(1002.0), [RANK1], 60.0)


def test_a_throttled_straggler_gets_the_share_of_its_readings_per_reason():
    # wrong: the shares in the evidence are not the shares of the readings the sentence speaks of
    sentences, ev = _throttled_straggler()
    assert sentences == ["GPU 1 (GPU-1111) was throttled (SW power cap, HW thermal slowdown) in 67% of its "
                         "readings over the last 60 s while rank 1 straggled; the GPUs of the ranks waiting for "
                         "it were not"]
    th = ev["throttle"]["1"]
    assert th["throttled_fraction"] == 0.667 and th["readings"] == 3
    assert th["reasons"] == {"sw_power_cap": 0.667, "hw_thermal_slowdown": 0.333}


def test_the_throttle_evidence_says_whose_gpu_each_is():
    # wrong: the operator cannot tell which rank ran on the throttled GPU and which on its peer's
    _, ev = _throttled_straggler()
    assert ev["throttle"]["1"]["ranks"] == [1] and ev["throttle"]["0"]["ranks"] == [0]
    assert ev["throttle"]["0"]["throttled_fraction"] == 0.0


def test_a_gpus_api_record_lists_its_recent_xids_with_when_they_came():
    # wrong: /gpus drops the XIDs, or gives their time only to the second
    log = HardwareLog()
    g = GpuSample(index=0, uuid="GPU-a", ecc_uncorrected=0, xid=[{"xid": 79, "t": 1000.25}])
    log.feed(Snapshot(t=1000.5, gpus=[g]))
    assert gpu_record(log, 0, g, 1001.0) == {
        "ecc_uncorrected": 0,
        "xids": [{"xid": 79, "meaning": "GPU has fallen off the bus", "severity": "fatal", "t": 1000.25}]}
