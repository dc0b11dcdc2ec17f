"""Hardware causes of a job's hang or straggling: what the GPUs of its ranks reported (XID
errors, ECC, remapped rows, clock-event (throttle) reasons), in sentences and evidence. The
readings come from the node view; what each code means, from ``hardware`` (which the node view
uses to keep its log, and which therefore imports none of the analysis).
"""

from __future__ import annotations

from typing import Any

from hangd.analysis.hardware import (
    SEVERITIES,
    THROTTLED_FRACTION,
    XID_LOOKBACK_S,
    HardwareLog,
    XidSeen,
    clock_event_words,
    throttle_reasons,
    xid,
)
from hangd.analysis.nodeview import NodeView
from hangd.analysis.report import clock
from hangd.analysis.views import JobView


def _gpu_name(gpu: int, uuid: str | None) -> str:
    return f"GPU {gpu} ({uuid})" if uuid else f"GPU {gpu}"


def _ranks(jv: JobView, pids: list[int]) -> str:
    ranks = sorted(jv.job.ranks[p] for p in pids if p in jv.job.ranks)
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _by_gpu(log: HardwareLog, jv: JobView, pids: list[int]) -> dict[int, list[int]]:
    """GPU index -> the pids of ``pids`` that use it (now, or before it stopped answering)."""
    out: dict[int, list[int]] = {}
    for p in pids:
        s = jv.sigs.get(p)
        for i in sorted({*(s.gpu_indexes if s is not None else []), *log.gpus_of(p)}):
            out.setdefault(i, []).append(p)
    return out


def _xid_items(log: HardwareLog, jv: JobView, pids: list[int], since: float,
               stopped: dict[int, float] | None) -> tuple[list[str], list[dict[str, Any]]]:
    """The XIDs the GPUs of ``pids`` reported since ``since``, grouped per GPU and code: sentences
    (worst first) and evidence. ``stopped``: pid -> when it stopped progressing (a hang), for the
    timing; None: the XIDs came while it straggled."""
    sentences: list[tuple[int, float, str]] = []
    items: list[dict[str, Any]] = []
    for gpu, users in sorted(_by_gpu(log, jv, pids).items()):
        groups: dict[int, list[XidSeen]] = {}
        for x in log.recent(gpu, since):
            groups.setdefault(x.xid, []).append(x)
        for code, seen in groups.items():
            info = xid(code)
            first, last = seen[0], seen[-1]
            who = _ranks(jv, users)
            item: dict[str, Any] = {"gpu": gpu, "uuid": first.uuid or log.uuids.get(gpu), "xid": code,
                                    "meaning": info.meaning, "severity": info.severity, "cause": info.cause,
                                    "t": round(first.t, 3), "last_t": round(last.t, 3), "count": len(seen),
                                    "ranks": sorted(jv.job.ranks[p] for p in users if p in jv.job.ranks)}
            text = f"{_gpu_name(gpu, item['uuid'])} reported XID {code} ({info.meaning}) at {clock(first.t)}"
            if len(seen) > 1:
                text += f" ({len(seen)} times, the last at {clock(last.t)})"
            if stopped is not None:
                at = max((stopped[p] for p in users if p in stopped), default=None)
                if at is not None:
                    dt = at - first.t
                    item["before_stall_s"] = round(dt, 1)
                    when = (f"{dt:.0f} s before" if dt >= 0.5 else f"{-dt:.0f} s after" if dt <= -0.5 else "as")
                    text += f", {when} {who} stopped progressing"
                else:
                    text += f", on the GPU of {who}"
            else:
                text += f", while {who} straggled"
            if info.note:
                text += f" ({info.note})"
            items.append(item)
            sentences.append((SEVERITIES.index(info.severity), first.t, text))
    sentences.sort(key=lambda x: (x[0], x[1]))
    return [s for _, _, s in sentences], items


def _memory_items(view: NodeView, log: HardwareLog, jv: JobView, pids: list[int],
                  since: float) -> tuple[list[str], dict[str, Any]]:
    """Uncorrected ECC errors that rose since ``since``, and row remapping pending or failed."""
    sentences: list[str] = []
    ev: dict[str, Any] = {}
    by_gpu = _by_gpu(log, jv, pids)
    for gpu in sorted(by_gpu):
        window = [g for _, g in view.gpu_window_t(gpu, jv.t, jv.t - since)]
        if not window:
            continue
        last = window[-1]
        uuid = last.uuid or log.uuids.get(gpu)
        counts = [g.ecc_uncorrected for g in window if g.ecc_uncorrected is not None]
        rec = {"uuid": uuid, "ecc_uncorrected": last.ecc_uncorrected, "ecc_corrected": last.ecc_corrected,
               "remap_pending": last.remap_pending, "remap_failure": last.remap_failure,
               "nvlink_errors": last.nvlink_errors}
        if any(v is not None for k, v in rec.items() if k != "uuid"):
            ev[str(gpu)] = rec
        bits = []
        if len(counts) >= 2 and counts[-1] > counts[0]:
            bits.append(f"{counts[-1] - counts[0]} new uncorrected ECC error{'s' if counts[-1] - counts[0] > 1 else ''} "
                        f"({counts[-1]} since the driver loaded)")
        if last.remap_failure:
            bits.append("a failed row remapping (its memory is bad: replace or reset the GPU)")
        elif last.remap_pending:
            bits.append("a row remapping pending (a GPU reset applies it)")
        if bits:
            sentences.append(f"{_gpu_name(gpu, uuid)} of {_ranks(jv, by_gpu[gpu])} has " + " and ".join(bits))
    return sentences, ev


def hang(view: NodeView, jv: JobView, stalled_at: float, stopped: dict[int, float]) -> tuple[list[str], dict[str, Any]]:
    """What the GPUs of a hung job's ranks reported shortly before or during the hang: sentences for
    the summary (worst first) and the incident's ``hardware`` evidence (empty when nothing)."""
    log: HardwareLog = view.hw
    since = stalled_at - XID_LOOKBACK_S
    pids = list(jv.job.pids)
    sentences, xids = _xid_items(log, jv, pids, since, stopped)
    mem_sentences, mem = _memory_items(view, log, jv, pids, since)
    return sentences + mem_sentences, {k: v for k, v in (("xids", xids), ("gpus", mem)) if v}


def _throttled(view: NodeView, gpu: int, t: float, window_s: float) -> tuple[float, dict[str, float], int] | None:
    """The share of its readings in the window a GPU was throttled, the share per reason, and how
    many readings said; None when no reading had its clock-event reasons."""
    known = [g.clock_events for _, g in view.gpu_window_t(gpu, t, window_s) if g.clock_events is not None]
    if not known:
        return None
    per: dict[str, int] = {}
    hit = 0
    for names in known:
        th = throttle_reasons(names)
        hit += bool(th)
        for n in th:
            per[n] = per.get(n, 0) + 1
    return hit / len(known), {n: round(c / len(known), 3) for n, c in sorted(per.items(), key=lambda x: -x[1])}, len(known)


def straggler(view: NodeView, jv: JobView, culprits: list[int], window_s: float) -> tuple[list[str], dict[str, Any]]:
    """Whether the GPUs of the straggling ranks were power- or thermal-throttled (or reported an
    XID) while they straggled, beside their peers' GPUs: sentences and ``hardware`` evidence."""
    log: HardwareLog = view.hw
    by_gpu = _by_gpu(log, jv, culprits)
    peers = _by_gpu(log, jv, [p for p in jv.live if p not in culprits])
    throttle: dict[str, Any] = {}
    sentences: list[str] = []
    for gpu in sorted({*by_gpu, *peers}):
        got = _throttled(view, gpu, jv.t, window_s)
        if got is not None:
            frac, per, n = got
            throttle[str(gpu)] = {"uuid": log.uuids.get(gpu), "throttled_fraction": round(frac, 3),
                                  "reasons": per, "readings": n,
                                  "ranks": sorted(jv.job.ranks[p] for p in by_gpu.get(gpu, peers.get(gpu, []))
                                                  if p in jv.job.ranks)}
    for gpu, users in sorted(by_gpu.items()):
        th = throttle.get(str(gpu))
        if th is None or th["throttled_fraction"] < THROTTLED_FRACTION or th["readings"] < 2:
            continue
        reasons = ", ".join(clock_event_words(n) for n in th["reasons"])
        text = (f"{_gpu_name(gpu, th['uuid'])} was throttled ({reasons}) in {th['throttled_fraction']:.0%} of its "
                f"readings over the last {window_s:.0f} s while {_ranks(jv, users)} straggled")
        others = [throttle[str(g)]["throttled_fraction"] for g in peers if g not in by_gpu and str(g) in throttle]
        if others:
            worst = max(others)
            text += ("; the GPUs of the ranks waiting for it were not" if worst < THROTTLED_FRACTION / 2 else
                     f"; the GPUs of the ranks waiting for it were throttled in up to {worst:.0%}")
        sentences.append(text)
    xid_sentences, xids = _xid_items(log, jv, culprits, jv.t - window_s, None)
    return xid_sentences + sentences, {k: v for k, v in (("throttle", throttle), ("xids", xids)) if v}
