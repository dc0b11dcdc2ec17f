from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request

from hangd.incidents import KINDS
from hangd.server.deps import AuthDep, DaemonDep, IncidentReadDep, WriteDep, is_authenticated
from hangd.server.schemas import IncidentDetail, IncidentList

router = APIRouter(prefix="/incidents", tags=["incidents"],
                   responses={401: {"description": "a token is required (hangd listens off loopback)"}})
NOT_FOUND: dict[int | str, dict[str, str]] = {404: {"description": "no such incident"}}


def _public(d: dict[str, Any], request: Request) -> dict[str, Any]:
    """Stack dumps only to authenticated callers (a token or the incident's signed link) when hangd
    listens off loopback."""
    if not request.app.state.loopback and not is_authenticated(request) and not request.query_params.get("sig"):
        ev = dict(d.get("evidence") or {})
        ev.pop("stacks", None)
        d = {**d, "evidence": ev}
    return d


@router.get("", response_model=IncidentList, summary="Incidents, newest first")
def list_incidents(daemon: DaemonDep, _: AuthDep,
                   status: Annotated[str | None, Query(pattern="^(open|resolved)$")] = None,
                   kind: Annotated[str | None, Query(description="one of " + ", ".join(KINDS), max_length=32)] = None,
                   job: Annotated[str | None, Query(max_length=255)] = None,
                   since: Annotated[float | None, Query(ge=0, le=1e11, description="opened at or after (Unix seconds)")] = None,
                   limit: Annotated[int, Query(ge=1, le=500)] = 50,
                   offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0) -> dict[str, Any]:
    total, rows = daemon.list_incidents(status=status, kind=kind, job=job, since=since, limit=limit, offset=offset)
    return {"total": total, "limit": limit, "offset": offset, "incidents": rows}


@router.get("/{incident_id}", response_model=IncidentDetail, responses=NOT_FOUND,
            summary="One incident: summary, culprit, timeline, evidence")
def get_incident(incident_id: Annotated[int, Path(ge=1, le=2**62)], daemon: DaemonDep, _: IncidentReadDep,
                 request: Request,
                 sig: Annotated[str | None, Query(max_length=64, description="the signature of the incident's own link "
                                                  "(hangd_incident_info's url): opens this incident without a token")] = None,
                 ) -> dict[str, Any]:
    d = daemon.incident(incident_id)
    if d is None:
        raise HTTPException(status_code=404, detail=f"no incident {incident_id}")
    return _public(d, request)


@router.post("/{incident_id}/ack", response_model=IncidentDetail,
             responses={**NOT_FOUND, 403: {"description": "the read token (or a link) may not ack: send the write token"}},
             summary="Acknowledge an incident")
def ack_incident(incident_id: Annotated[int, Path(ge=1, le=2**62)], daemon: DaemonDep, _: WriteDep,
                 request: Request) -> dict[str, Any]:
    d = daemon.ack(incident_id)
    if d is None:
        raise HTTPException(status_code=404, detail=f"no incident {incident_id}")
    return _public(d, request)
