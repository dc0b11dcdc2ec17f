from __future__ import annotations

from fastapi import APIRouter, Response

from hangd.server.deps import DaemonDep
from hangd.server.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="The process is alive")
async def healthz() -> Health:  # async: answered on the event loop, never queued behind busy threads
    return Health(status="ok")


@router.get("/readyz", response_model=Health, summary="The loop runs and has sampled the node",
            description="`ok`; `degraded` (still serving, 200) when the store fails, the GPUs cannot be seen "
                        "or another source (/proc, logs, flight recorder) cannot read, "
                        "with the reason in `detail`; `not ready` (503) before the first sample.",
            responses={503: {"model": Health}})
async def readyz(daemon: DaemonDep, response: Response) -> Health:  # reads flags only: never blocks
    ok, why = daemon.ready()
    if not ok:
        response.status_code = 503
    status = "not ready" if not ok else "degraded" if "degraded" in why else "ok"
    return Health(status=status, detail=why)
