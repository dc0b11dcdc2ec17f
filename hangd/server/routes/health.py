from __future__ import annotations

from fastapi import APIRouter, Response

from hangd.server.deps import DaemonDep
from hangd.server.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="The process is alive")
async def healthz() -> Health:  # async: answered on the event loop, never queued behind busy threads
    return Health(status="ok")


@router.get("/readyz", response_model=Health, summary="The loop runs and has sampled the node",
            responses={503: {"model": Health}})
async def readyz(daemon: DaemonDep, response: Response) -> Health:  # reads flags only: never blocks
    ok, why = daemon.ready()
    if not ok:
        response.status_code = 503
    return Health(status="ok" if ok else "not ready", detail=why)
