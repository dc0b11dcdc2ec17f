"""Ranks that issued different collectives at the same sequence number (``collective_mismatch``):
different ops, sizes or dtypes in their flight-recorder dumps. NCCL completes such a collective
with silently wrong results; gloo fails the job."""

from __future__ import annotations

from typing import Any

from hangd.analysis.detectors import Env
from hangd.analysis.identity import Job
from hangd.analysis.views import JobTrack
from hangd.flightrec.analyze import MISMATCH_KINDS, FindingKind
from hangd.incidents import Family, IncidentKind

FAMILY = Family.MISMATCH
KINDS = MISMATCH_KINDS


def step(env: Env, job_id: str, job: Job | None, tr: JobTrack, f: Any, t: float, wider: bool = False) -> None:
    """Open the job's mismatch incident on a finding, or judge it again on a ``wider`` one (the same
    collective compared over more ranks, once another node's dumps arrived)."""
    inc = env.book.get(job_id, FAMILY)
    rank_pid = {**tr.fr_pids, **(job.rank_pid() if job else {})}
    if inc is None or wider:
        if inc is None:
            inc = env.book.open_incident(IncidentKind.COLLECTIVE_MISMATCH, job_id, t)
        inc.ranks = sorted(f.ranks)
        inc.pids = [rank_pid[r] for r in inc.ranks if r in rank_pid and r not in f.nodes]
        inc.summary = (f"{f.message}. The ranks disagree on one collective: NCCL completes it with silently wrong "
                       "results, gloo fails the job.")
        # the odd one out: the rank whose size/op differs from the majority (else the higher rank)
        vals = f.sizes if f.kind == FindingKind.SIZE_MISMATCH else f.ops if f.kind == FindingKind.OP_MISMATCH else f.dtypes
        counts: dict[str, int] = {}
        for v in vals.values():
            counts[repr(v)] = counts.get(repr(v), 0) + 1
        odd = [r for r, v in vals.items() if counts[repr(v)] == 1 and len(vals) > 2] or [max(vals)]
        inc.culprit_ranks = sorted(odd)
        inc.culprit_pids = [rank_pid[r] for r in inc.culprit_ranks if r in rank_pid and r not in f.nodes]
        if f.nodes:  # a job that spans nodes: where its ranks on other nodes are (a pid means nothing elsewhere)
            inc.evidence["rank_nodes"] = {str(r): n for r, n in sorted(f.nodes.items())}
    same = (f.kind, f.pg, f.seq)
    if wider:  # the narrower finding of the same collective gives way
        inc.findings = [x for x in inc.findings if (x.get("kind"), x.get("pg"), x.get("seq")) != same]
    inc.findings.append(f.to_dict())
    inc.evidence["flight_recorder"] = inc.findings
    env.book.touch(inc, t, f.message)
