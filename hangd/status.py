"""``hangd status``: a one-shot look at the node, as a table like nvidia-smi's, or JSON."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from hangd.config import ConfigError, Settings
from hangd.daemon import live_loop
from hangd.humanize import ago, command_line, gpus_unseen, iso_field, iso_local
from hangd.snapshot import Snapshot


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


def _daemon_get(settings: Settings, path: str, timeout: float) -> dict[str, Any]:
    """GET ``path`` of this node's own daemon (``hangd serve`` at the ``listen`` setting). Returns
    ``{"url", "answered", "error", "doc"}``; a daemon that does not answer (none listening, too slow,
    refusing) has ``answered`` false and ``error`` saying why: what it knows is unknown, not none
    (``hangd status`` exits 4)."""
    host, port = settings.host_port()
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    ctx = None
    try:
        tls = settings.tls()
    except ConfigError:
        tls = None
    if tls:
        # the node's own daemon: trust the certificate it serves, whatever name it was made for
        ctx = ssl.create_default_context(cafile=tls[0])
        ctx.check_hostname = False
    scheme = "https" if tls else "http"
    base = f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
    out: dict[str, Any] = {"url": base, "answered": False, "error": None}
    req = urllib.request.Request(base + path)
    try:  # it only reads: the read token when there is one, else the write token
        token = settings.resolved_read_token() or settings.resolved_token()
    except ConfigError as e:
        token = None
        out["error"] = f"no token to ask it with: {e}"
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:  # noqa: S310 - the node's own daemon
            doc = json.loads(r.read(8 << 20))
    except urllib.error.HTTPError as e:
        hint = (" HINT: set HANGD_TOKEN or HANGD_READ_TOKEN (or HANGD_TOKEN_FILE, HANGD_READ_TOKEN_FILE) as hangd serve"
                " has it") if e.code == 401 else ""
        out["error"] = f"hangd serve at {base} answered HTTP {e.code}{hint}"
        return out
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, ConnectionRefusedError):  # none listens: say so, "no incident" would read as all clear
            out["error"] = (f"hangd serve at {base} did not answer: connection refused HINT: start it (systemctl "
                            "start hangd, or hangd serve), or set listen (HANGD_LISTEN) to where it listens")
            return out
        out["error"] = f"hangd serve at {base} did not answer: {reason}"
        return out
    except ValueError as e:
        out["error"] = f"hangd serve at {base} answered something that is not its JSON: {e}"
        return out
    out["answered"] = True
    out["doc"] = doc
    return out


def daemon_incidents(settings: Settings, timeout: float = 2.0) -> dict[str, Any]:
    """The incidents open in this node's own daemon (``hangd serve`` at the ``listen`` setting).

    A one-shot look of a few seconds cannot see a hang (that takes 10 s and more without progress);
    the daemon has watched the jobs all along. Returns ``{"url", "answered", "error", "incidents"}``."""
    out = _daemon_get(settings, "/incidents?status=open&limit=100", timeout)
    doc = out.pop("doc", None)
    out["incidents"] = [{**i, "source": "hangd serve"} for i in (doc or {}).get("incidents") or []] \
        if isinstance(doc, dict) else []
    return out


def daemon_gpu_history(settings: Settings, minutes: int, timeout: float = 5.0) -> dict[str, Any]:
    """This node's GPU history over the last ``minutes``, one row per GPU and minute, as its
    daemon recorded it (a look of a few seconds has none). Returns ``{"url", "answered",
    "error", "minutes", "gpu_history"}``."""
    out = _daemon_get(settings, f"/gpus/history?minutes={minutes}", timeout)
    doc = out.pop("doc", None)
    out["minutes"] = minutes
    out["gpu_history"] = doc if isinstance(doc, list) else []
    return out


def render_gpu_history(h: dict[str, Any]) -> str:
    """One line per GPU and minute, oldest first per GPU; '-' where the minute had no reading."""
    lines = [f"GPU history of the last {h['minutes']} min at {h['url']} (per-minute means; the minute under way "
             "is not in it yet)"]
    if not h["gpu_history"]:
        lines.append("No minute recorded yet.")
        return "\n".join(lines)
    lines.append(f"{'GPU':>3}  {'MINUTE':<25} {'UTIL':>5}  {'SM':>5}  {'POWER':>6}  {'MEMORY':>9}")
    for r in h["gpu_history"]:
        util = f"{r['util']:.0f}%" if r.get("util") is not None else "-"
        sm = f"{r['sm']:.0f}%" if r.get("sm") is not None else "-"
        power = f"{r['power_w']:.0f}W" if r.get("power_w") is not None else "-"
        mem = _fmt_bytes(int(r["mem_used"])) if r.get("mem_used") is not None else "-"
        lines.append(f"{r['gpu']:>3}  {iso_local(r['t']):<25} {util:>5}  {sm:>5}  {power:>6}  {mem:>9}")
    return "\n".join(lines)


def collect_status(settings: Settings, seconds: float = 2.0) -> dict[str, Any]:
    samples = max(2, int(seconds) + 1)
    loop = live_loop(settings, interval=seconds / (samples - 1), keep_going=False)
    seen: list[Snapshot] = []
    loop.run(lambda snap, _changes, _incidents: seen.append(snap), ticks=samples)
    front, snap, first_t = loop.front, seen[-1], seen[0].t
    now = snap.t
    gpus = [{"index": g.index, "name": g.name, "uuid": g.uuid, "util_gpu": g.util_gpu, "mem_used": g.mem_used,
             "mem_total": g.mem_total, "power_w": g.power_w,
             "gpm": g.gpm, "procs": [{"pid": p.pid, "used": p.used} for p in g.procs]} for g in snap.gpus]
    procs = []
    for rec in front.processes():
        st = rec.to_dict()
        grew = st.get("log_grew_at")
        if "nvml" in snap.unavailable:
            st = {**st, "gpu_mem_bytes": None}  # GPUs unseen: their memory is unknown, not 0 B
        cmd = front.cmdline(st["pid"])
        # a state already there at the first look began before hangd looked: its age is a lower bound
        # (a process "started 9 s ago" and still starting has not been so for only the 2 s watched)
        held_before = first_t is not None and st["since"] <= round(first_t, 3)
        procs.append({**st, "for_s": round(now - st["since"], 1), "for_at_least": held_before,
                      "since_iso": iso_field(st["since"]),
                      "last_progress_iso": iso_field(st.get("last_progress")),
                      "command": command_line(cmd) if cmd else None,
                      "log_growing": grew is not None and now - grew <= 5.0})
    daemon = daemon_incidents(settings)
    incidents = list(daemon.pop("incidents"))
    known = {(i["job"], i["kind"]) for i in incidents}
    for own in front.incidents(open_only=True):  # this look's own, unless the daemon already has it
        if (own.job, own.kind) not in known:
            d = {k: v for k, v in own.to_dict().items() if k != "evidence"}
            d.update({f"{k}_iso": iso_field(d.get(k)) for k in ("opened_at", "updated_at", "resolved_at", "hang_started_at")})
            incidents.append({**d, "source": "this look"})
    return {"t": now, "t_iso": iso_field(now), "gpus": gpus, "gpus_unseen": gpus_unseen(snap.unavailable),
            "processes": procs, "jobs": [j.to_dict() for j in front.jobs()], "incidents": incidents, "daemon": daemon,
            "unavailable": snap.unavailable}


def status_found(st: dict[str, Any]) -> bool:
    """Something needs a person: an incident is open or a job is judged hung."""
    return bool(st.get("incidents")) or any(j.get("state") == "hung" for j in st.get("jobs") or [])


def nothing_to_watch(st: dict[str, Any]) -> bool:
    """No GPU can be seen and /proc shows no distributed job either: hangd is blind here."""
    return st.get("gpus_unseen") is not None and not st["processes"] and not st.get("jobs") and not st.get("incidents")


def render_status(st: dict[str, Any]) -> str:
    lines = [f"hangd status at {iso_local(st['t'])}"]
    if st.get("gpus_unseen"):
        lines.append(st["gpus_unseen"])
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
        if name != "nvml" or not st.get("gpus_unseen"):
            lines.append(f"{name}: {why}")
    if st.get("unavailable"):
        lines.append("")
    if not st["processes"]:
        lines.append("No GPU processes or distributed jobs found.")
        lines.extend(_render_incidents(st))
        return "\n".join(lines)
    # job keys are shown whole: one is what /jobs and /incidents are asked about
    jw = max(24, *(len(str(p["job"])) for p in st["processes"]))
    hdr = f"{'GPU':>4} {'PID':>7} {'JOB':<{jw}} {'RANK':>4} {'STATE':<13} {'FOR':>6} {'GPU-MEM':>9} {'CPU':>5} {'LOG':<4} {'COMMAND':<40} WHY"
    lines.append(hdr)
    for p in st["processes"]:
        gpu = ",".join(map(str, p.get("gpus") or [])) or "-"
        cpu = f"{p['cpu_cores'] * 100:.0f}%" if p.get("cpu_cores") is not None else "-"
        cmd = str(p.get("command") or "-")
        cmd = cmd if len(cmd) <= 40 else cmd[:39] + "…"
        lines.append(f"{gpu:>4} {p['pid']:>7} {str(p['job']):<{jw}} {p['rank']!s:>4} {p['state']:<13} "
                     f"{('≥' if p.get('for_at_least') else '') + _duration(p['for_s']):>6} {_fmt_bytes(p.get('gpu_mem_bytes')):>9} {cpu:>5} "
                     f"{'yes' if p['log_growing'] else 'no':<4} {cmd:<40} {p['reason'][:120]}")
    lines.extend(_render_incidents(st))
    return "\n".join(lines)


def _render_incidents(st: dict[str, Any]) -> list[str]:
    out: list[str] = []
    daemon = st.get("daemon") or {}
    for inc in st.get("incidents") or []:
        out.append("")
        if inc.get("source") == "hangd serve":
            inc = {**inc, "summary": f"{inc.get('summary', '')} (from hangd serve at {daemon.get('url')}/incidents/{inc['id']})"}
        out.extend(render_incident(inc, st["t"]))
    return out


def render_job(job: dict[str, Any], now: float) -> str:
    """A job that spans nodes, as every node reports it: its nodes, its ranks, its open incidents."""
    parts = ", ".join(f"{k}={v}" for k, v in (job.get("identity") or {}).items())
    lines = [f"JOB {job['job']} ({job.get('spans_nodes') or 'one node'}; key from {parts or '-'}), world size "
             f"{job.get('world_size') or '-'}"]
    for n in job["nodes"]:
        said = f"last report {iso_local(n['last_report'])} ({ago(n['last_report'], now)})"
        lines.append(f"  {n['node']}: {'NO REPORT since ' + iso_local(n['last_report']) if n['stale'] else said}; "
                     f"ranks {', '.join(sorted(n['ranks'], key=int)) or '-'}")
    lines.append(f"{'RANK':>5} {'NODE':<20} {'PID':>7} {'STATE':<13} {'IN-COLL':<7} {'LAST-PROGRESS':<14} WHY")
    for r, x in sorted(job["fleet_ranks"].items(), key=lambda kv: int(kv[0])):
        lp = ago(x["last_progress"], now) if x.get("last_progress") else "-"
        waits = "-" if x.get("waits") is None else ("yes" if x["waits"] else "no")
        lines.append(f"{r:>5} {x['node'][:20]:<20} {x['pid']:>7} {str(x.get('state') or '-'):<13} {waits:<7} {lp:<14} "
                     f"{str(x.get('reason') or '')[:120]}")
    if "flight_recorder" in job:
        lines.append("")
        lines.extend(render_job_fr(job.get("flight_recorder") or {}, job.get("fr_findings") or [], now))
    for inc in job.get("incidents") or []:
        lines.append("")
        lines.extend(render_incident(inc, now))
    return "\n".join(lines)


def _fr_state(x: dict[str, Any]) -> str:
    state = str(x.get("state") or "-")
    # gloo's entries stay "scheduled"; the recorder marks them retired once they finished
    return "retired" if x.get("completed") and state != "completed" else state


def render_job_fr(ranks: dict[str, list[dict[str, Any]]], findings: list[dict[str, Any]], now: float) -> list[str]:
    """Where each rank stands in its flight recorder, per process group, as each node last read
    its dump; then the cross-rank findings of the job's open incidents."""
    if not ranks:
        return ["no flight-recorder dumps written for this job"]
    out = [f"{'RANK':>5} {'NODE':<20} {'PG':<12} {'LAST-SEQ':>8} {'OP':<28} {'STATE':<9} {'READ':<12} SIZES"]
    for r, groups in sorted(ranks.items(), key=lambda kv: int(kv[0])):
        for x in groups:
            seq, op, state = x.get("seq"), x.get("op"), _fr_state(x)
            if seq is None and x.get("p2p"):  # a group of point-to-point entries only
                p = x["p2p"]
                seq, op, state = p.get("seq"), f"{p.get('op')} (p2p)", _fr_state(p)
            note = ""
            if x.get("behind"):
                note = f"  {x['behind']} behind the furthest rank in pg {x['pg']}"
            elif x.get("completed_seq") is not None and seq is not None and x["completed_seq"] < seq:
                note = f"  completed #{x['completed_seq']}"
            sizes = "-" if x.get("sizes") is None else str(x["sizes"])
            seq_s = "-" if seq is None else str(seq)
            out.append(f"{r:>5} {str(x.get('node'))[:20]:<20} {str(x.get('pg'))[:12]:<12} {seq_s:>8} "
                       f"{str(op or '-')[:28]:<28} {state[:9]:<9} {ago(x.get('read_at'), now):<12} {sizes[:60]}{note}")
    for f in findings:
        out.append(f"flight recorder (incident #{f['incident']}): {f['message']}")
    return out


def render_incident(inc: dict[str, Any], now: float) -> list[str]:
    """An incident as a person on call reads it: what, since when, who, and what to do next."""
    state = "open" if inc.get("resolved_at") is None else f"resolved {iso_local(inc['resolved_at'])}"
    out = [f"INCIDENT #{inc['id']} {inc['kind']} ({inc.get('severity', '-')}, {state}) job {inc['job']}: "
           f"opened {iso_local(inc['opened_at'])} ({ago(inc['opened_at'], now)}); culprit ranks "
           f"{inc.get('culprit_ranks') or '-'} (pids {inc.get('culprit_pids') or '-'})",
           f"    {inc.get('summary', '')}"]
    if inc.get("next_step"):
        out.append(f"    next step: {inc['next_step']}")
    return out
