"""NVML: its unavailable path on this machine, and its readings through replay of real traces."""

from __future__ import annotations

import pytest

from hangd.snapshot import Snapshot
from hangd.sources.base import SourceRunner, Unavailable
from hangd.sources.nvml import NvmlSource
from hangd.sources.procfs import ProcSource
from hangd.trace import TraceReader

from ..conftest import TRACES


def _has_gpu() -> bool:
    try:
        NvmlSource().gpus()
        return True
    except Unavailable:
        return False


@pytest.mark.skipif(_has_gpu(), reason="this host has an NVIDIA GPU")
def test_no_driver_means_unavailable_with_hint_and_proc_goes_on():
    src = NvmlSource()
    with pytest.raises(Unavailable) as e:
        src.collect(Snapshot(t=0))
    assert "HINT:" in str(e.value)
    runner = SourceRunner([NvmlSource(), ProcSource()])
    snap = runner.collect()
    assert snap.unavailable["nvml"].startswith("unavailable:")
    assert runner.stats["nvml"].success is False and runner.stats["proc"].success is True


def test_replayed_gpu_readings_are_typed():
    snaps = list(TraceReader(TRACES / "nccl_stall").snapshots())
    gpus = [g for s in snaps for g in s.gpus]
    assert gpus and all(g.index in (0, 1) for g in gpus)
    spin = [g for g in gpus if g.util_gpu == 100 and g.gpm and g.gpm["ANY_TENSOR_UTIL"] == 0]
    assert spin, "the stalled rank's spinning kernel is in the readings"
    assert all(g.power_mw is None or g.power_mw > 0 for g in gpus)
    assert any(g.procs and g.procs[0].used for g in gpus)


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs an NVIDIA GPU (run on a GPU host)")
def test_live_nvml_sample():
    src = NvmlSource()
    s1, s2 = Snapshot(t=0), Snapshot(t=1)
    src.collect(s1)
    src.collect(s2)
    assert s2.gpus and s2.gpus[0].uuid and s2.gpus[0].mem_total


@pytest.mark.parametrize("code,why,hint", [
    ("NVML_ERROR_LIBRARY_NOT_FOUND", "libnvidia-ml.so.1 (the driver's NVML library) cannot be found", "install the NVIDIA driver"),
    ("NVML_ERROR_DRIVER_NOT_LOADED", "the NVIDIA kernel driver is not loaded", "install the NVIDIA driver"),
    ("NVML_ERROR_NO_PERMISSION", "no permission to open the GPU devices", "run hangd as root"),
    ("NVML_ERROR_LIB_RM_VERSION_MISMATCH", "different versions", "reboot"),
    ("NVML_ERROR_UNKNOWN", "NVML cannot start: Unknown Error", "install the NVIDIA driver"),
])
def test_nvml_init_errors_say_what_is_wrong_and_what_to_do(code, why, hint):
    """NVML's own error objects (the boundary), turned into an operator's words with a HINT."""
    import pynvml

    from hangd.sources.nvml import _init_error

    u = _init_error(pynvml.NVMLError(getattr(pynvml, code)))
    assert why in u.why and u.hint.startswith("HINT:") and hint in u.hint, str(u)
