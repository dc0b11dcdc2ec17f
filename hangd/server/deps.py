"""Dependencies shared by the routes: the daemon, and who the caller is."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from hangd.server.runtime import Daemon


# async: a plain-def dependency runs on the thread pool, and /readyz must not wait for a thread
async def get_daemon(request: Request) -> Daemon:
    return request.app.state.daemon


def is_authenticated(request: Request) -> bool:
    """True when a token is configured and the caller presented it (compared in constant time),
    or when no token is configured (then hangd only listens on loopback)."""
    token: str | None = request.app.state.token
    if token is None:
        return True
    auth = request.headers.get("authorization", "")
    given = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-hangd-token", "")
    return hmac.compare_digest(given.encode(), token.encode())


async def require_auth(request: Request) -> None:
    if not is_authenticated(request):
        raise HTTPException(status_code=401, detail="a token is required: send 'Authorization: Bearer <token>'",
                            headers={"WWW-Authenticate": "Bearer"})


DaemonDep = Annotated[Daemon, Depends(get_daemon)]
AuthDep = Annotated[None, Depends(require_auth)]
