"""What the node looks like now: processes, jobs, GPUs, the state timeline, a capture on demand."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Response

from hangd.server.deps import AuthDep, DaemonDep, WriteDep
from hangd.server.schemas import GpuOut, JobOut, ProcessOut, TimelineEntry

router = APIRouter(tags=["node"], responses={401: {"description": "a token is required (hangd listens off loopback)"}})


@router.get("/processes", response_model=list[ProcessOut], summary="Current state of every GPU process / rank")
def processes(daemon: DaemonDep, _: AuthDep) -> list[dict[str, Any]]:
    now = daemon.last_snapshot_t or time.time()
    return [{**p.to_dict(), "for_s": round(max(0.0, now - p.since), 1)} for p in daemon.front.processes()]


@router.get("/jobs", response_model=list[JobOut], summary="Distributed jobs on this node and their state")
def jobs(daemon: DaemonDep, _: AuthDep) -> list[dict[str, Any]]:
    return daemon.jobs_view()


@router.get("/jobs/{key:path}", response_model=JobOut, responses={404: {"description": "no such job"}},
            summary="One job; with a shared database, a job that spans nodes as every node reports it")
def job(key: Annotated[str, Path(max_length=255)], daemon: DaemonDep, _: AuthDep) -> dict[str, Any]:
    found = daemon.jobs_view(key)
    if not found:
        raise HTTPException(status_code=404, detail=f"no job {key}")
    return found[0]


@router.get("/gpus", response_model=list[GpuOut], summary="Latest readings of every GPU",
            description="Empty when the GPUs cannot be seen; the `Hangd-Gpus-Unseen` header (and /readyz) then says why.")
def gpus(daemon: DaemonDep, _: AuthDep, response: Response) -> list[dict[str, Any]]:
    unseen = daemon.gpus_unseen()
    if unseen:
        # a header keeps the body a plain list of GPUs; latin-1 is what headers can carry
        response.headers["Hangd-Gpus-Unseen"] = unseen.encode("latin-1", "replace").decode("latin-1")[:1000]
    return [g.to_dict() for g in daemon.front.gpus()]


@router.get("/timeline", response_model=list[TimelineEntry], summary="State changes, oldest first")
def timeline(daemon: DaemonDep, _: AuthDep, pid: Annotated[int | None, Query(ge=0, le=2**31)] = None,
             since: Annotated[float | None, Query(ge=0, le=1e11)] = None,
             limit: Annotated[int, Query(ge=1, le=5000)] = 500) -> list[dict[str, Any]]:
    return daemon.timeline(pid=pid, since=since, limit=limit)


@router.post("/snapshot", status_code=202, summary="Capture evidence now (stacks, flight-recorder dumps)",
             responses={409: {"description": "nothing live to capture (hangd runs a replay)"},
                        403: {"description": "the read token may not capture: send the write token"}})
def snapshot(daemon: DaemonDep, _: WriteDep) -> dict[str, Any]:
    res = daemon.request_snapshot()
    if not res["accepted"]:
        raise HTTPException(status_code=409, detail=res["why"])
    return res
