"""XIDs and clock-event reasons on /metrics and /gpus of a real `hangd serve`, replaying a trace
recorded with an XID and throttle reasons injected at the NVML boundary."""

from __future__ import annotations

import re
import shutil
import subprocess

import pynvml
import pytest

from ..conftest import TRACES
from ..fake_nvml import FakeNvml, analyze_through_nvml
from ..served import serve
from ..sources.test_hardware import hung_at, uuid_of, xid_once

NCCL_STALL = TRACES / "nccl_stall"


@pytest.mark.prometheus  # promtool
def test_xids_and_throttle_reasons_on_metrics_and_gpus(tmp_path, served, monkeypatch):
    post, posted = xid_once(1, 79, hung_at(NCCL_STALL) - 4)

    def inject(t: float, fake: FakeNvml) -> None:
        post(t, fake)
        fake.extra_reasons[0] = pynvml.nvmlClocksEventReasonSwPowerCap

    analyze_through_nvml(monkeypatch, NCCL_STALL, inject, record_to=tmp_path / "rec")
    s = serve(tmp_path, "--replay", str(tmp_path / "rec"), "--speed", "10")
    served.append(s)
    u0, u1 = uuid_of(NCCL_STALL, 0), uuid_of(NCCL_STALL, 1)
    want = f'hangd_gpu_xid_events_total{{gpu="1",uuid="{u1}",xid="79"}} 1.0'
    text = s.wait_for(lambda s: (t := s.get("/metrics").text) and want in t and t, 60, "the XID on /metrics")
    assert 'xid="79"' not in text.replace(want, "")  # on GPU 1 only, counted once
    assert f'hangd_gpu_clock_event_active{{gpu="0",reason="sw_power_cap",uuid="{u0}"}} 1.0' in text
    # GPU 1 reports its own reasons, as recorded (it ran near its power cap at times): the series is there
    assert re.search(rf'hangd_gpu_clock_event_active\{{gpu="1",reason="sw_power_cap",uuid="{u1}"\}} [01]\.0', text)
    assert f'hangd_gpu_ecc_errors_total{{gpu="1",type="uncorrected",uuid="{u1}"}} 0.0' in text
    res = subprocess.run([shutil.which("promtool") or "promtool", "check", "metrics"], input=text,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    gpus = {g["index"]: g for g in s.get("/gpus").json()}
    assert [x["xid"] for x in gpus[1]["xids"]] == [79] and gpus[1]["xids"][0]["meaning"] == "GPU has fallen off the bus"
    assert gpus[0]["xids"] == [] and "sw_power_cap" in gpus[0]["clock_events"]
