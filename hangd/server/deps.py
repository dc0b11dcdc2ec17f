"""Dependencies shared by the routes: the daemon, and who the caller is.

Two credentials: the write token (``token``/``token_file``) may do everything; the read token
(``read_token``/``read_token_file``) may scrape /metrics and GET, and is refused (403) where a
request changes something (ack, capture). An incident's own link (``?sig=``, see links.py) opens
that one incident page and nothing else."""

from __future__ import annotations

import hmac
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, Request

from hangd.server import links
from hangd.server.runtime import Daemon

Access = Literal["write", "read"]


# async: a plain-def dependency runs on the thread pool, and /readyz must not wait for a thread
async def get_daemon(request: Request) -> Daemon:
    return request.app.state.daemon


def _same(given: str, token: str | None) -> bool:
    return token is not None and hmac.compare_digest(given.encode(), token.encode())


def access(request: Request) -> Access | None:
    """What the caller may do: "write", "read" or nothing (None). Tokens are compared in constant
    time. With no token configured at all (hangd then listens only on loopback) everyone writes."""
    write: str | None = request.app.state.token
    read: str | None = request.app.state.read_token
    if write is None and read is None:
        return "write"
    auth = request.headers.get("authorization", "")
    given = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-hangd-token", "")
    if not given:
        return None
    if _same(given, write):
        return "write"
    return "read" if _same(given, read) else None


def is_authenticated(request: Request) -> bool:
    """True when the caller may read (either token, or none is configured)."""
    return access(request) is not None


def _unauthorized() -> HTTPException:
    return HTTPException(status_code=401, detail="a token is required: send 'Authorization: Bearer <token>'",
                         headers={"WWW-Authenticate": "Bearer"})


async def require_auth(request: Request) -> None:
    if not is_authenticated(request):
        raise _unauthorized()


async def require_write(request: Request) -> None:
    got = access(request)
    if got == "write":
        return
    if got is None:
        raise _unauthorized()
    why = ("this hangd has no write token: set HANGD_TOKEN or token_file to allow it" if request.app.state.token is None
           else "the read token may not change anything: send the write token (HANGD_TOKEN or token_file)")
    raise HTTPException(status_code=403, detail=why)


async def require_incident_read(request: Request) -> None:
    """Either token, or the incident's own signed link (``?sig=`` from hangd_incident_info's url)."""
    if is_authenticated(request):
        return
    key = request.app.state.link_key
    sig = request.query_params.get("sig", "")
    if key is not None and sig and links.valid(key, str(request.path_params.get("incident_id", "")), sig):
        return
    raise _unauthorized()


DaemonDep = Annotated[Daemon, Depends(get_daemon)]
AuthDep = Annotated[None, Depends(require_auth)]
WriteDep = Annotated[None, Depends(require_write)]
IncidentReadDep = Annotated[None, Depends(require_incident_read)]
