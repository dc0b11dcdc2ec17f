"""``hangd status``: a one-shot look at the node, as a table like nvidia-smi's, or JSON."""

from __future__ import annotations

import time
from typing import Any

from hangd.analysis.engine import Analyzer
from hangd.config import Settings
from hangd.sources.live import LiveNode


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n = n / 1024  # type: ignore[assignment]
    return str(n)


def _duration(s: float) -> str:
    s = max(0, int(s))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def collect_status(settings: Settings, seconds: float = 2.0) -> dict[str, Any]:
    node = LiveNode(settings)
    an = Analyzer()
    samples = max(2, int(seconds) + 1)
    snap = None
    for i in range(samples):
        snap = node.sample()
        an.step(snap)
        an.take_requests()
        if i < samples - 1:
            time.sleep(seconds / (samples - 1))
    assert snap is not None
    now = snap.t
    gpus = [{"index": g.index, "name": g.name, "uuid": g.uuid, "util_gpu": g.util_gpu, "mem_used": g.mem_used,
             "mem_total": g.mem_total, "power_w": (g.power_mw / 1000) if g.power_mw is not None else None,
             "gpm": g.gpm, "procs": [{"pid": p.pid, "used": p.used} for p in g.procs]} for g in snap.gpus]
    procs = []
    for st in an.processes():
        grew = st.get("log_grew_at")
        procs.append({**st, "for_s": round(now - st["since"], 1),
                      "log_growing": grew is not None and now - grew <= 5.0})
    return {"t": now, "gpus": gpus, "processes": procs, "jobs": an.jobs(),
            "unavailable": snap.unavailable}


def render_status(st: dict[str, Any]) -> str:
    lines = []
    if st["gpus"]:
        lines.append(f"{'GPU':>3}  {'NAME':<22} {'UTIL':>4}  {'SM':>5}  {'POWER':>6}  {'MEMORY':>19}")
        for g in st["gpus"]:
            sm = (g.get("gpm") or {}).get("SM_UTIL")
            util = f"{g['util_gpu']}%" if g["util_gpu"] is not None else "-"
            sm_s = f"{sm:.0f}%" if sm is not None else "-"
            power = f"{g['power_w']:.0f}W" if g["power_w"] is not None else "-"
            mem = _fmt_bytes(g["mem_used"]) + " / " + _fmt_bytes(g["mem_total"])
            lines.append(f"{g['index']:>3}  {str(g['name'] or '-')[:22]:<22} {util:>4}  {sm_s:>5}  {power:>6}  {mem:>19}")
        lines.append("")
    for name, why in (st.get("unavailable") or {}).items():
        lines.append(f"{name}: {why}")
    if st.get("unavailable"):
        lines.append("")
    if not st["processes"]:
        lines.append("No GPU processes or distributed jobs found.")
        return "\n".join(lines)
    hdr = f"{'GPU':>4} {'PID':>7} {'JOB':<24} {'RANK':>4} {'STATE':<13} {'FOR':>6} {'GPU-MEM':>9} {'CPU':>5} {'LOG':<4} {'COMMAND':<30} WHY"
    lines.append(hdr)
    for p in st["processes"]:
        gpu = ",".join(map(str, p.get("gpus") or [])) or "-"
        cpu = f"{p['cpu_cores'] * 100:.0f}%" if p.get("cpu_cores") is not None else "-"
        lines.append(f"{gpu:>4} {p['pid']:>7} {str(p['job'])[:24]:<24} {p['rank']:>4} {p['state']:<13} "
                     f"{_duration(p['for_s']):>6} {_fmt_bytes(p.get('gpu_mem_bytes')):>9} {cpu:>5} "
                     f"{'yes' if p['log_growing'] else 'no':<4} {str(p.get('command') or '-')[:30]:<30} {p['reason'][:120]}")
    return "\n".join(lines)
