"""The HTTP connection handling of `hangd serve`: bounded time for idle connections and request
headers, a bounded number of connections, and the listening socket bound before anything else.

uvicorn alone closes an idle keep-alive connection after ``timeout_keep_alive`` but waits forever
for a client that connects and sends nothing, or sends its headers one byte at a time
(slowloris); with ``limit_concurrency`` those idle connections made every request, health checks
included, answer 503. Here a connection must deliver a request's headers within
``HEADER_TIMEOUT_S`` of its first byte (or of connecting), and past ``max_connections`` a new
connection is closed at once, so the requests already in flight keep their answers."""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("hangd.serve")

HEADER_TIMEOUT_S = 10.0  # to send a request's headers, from connect or from the request's first byte
KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this long
GRACEFUL_SHUTDOWN_S = 5  # on SIGTERM, in-flight requests get this long
MAX_INCOMPLETE_HEADERS = 16 * 1024  # bytes of headers buffered before the request is refused (400)
MAX_CONNECTIONS = 4096
BACKLOG = 2048


def raise_fd_limit(want: int = MAX_CONNECTIONS + 256) -> int:
    """Raise the soft limit of open files towards ``want`` (within the hard limit); returns the
    number of connections hangd can hold with room left for its database and /proc reads."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    limit = MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else soft - 256
    return max(16, min(MAX_CONNECTIONS, limit))


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for request headers and a cap on connections."""

    max_connections = MAX_CONNECTIONS
    header_timeout = HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            # the newest connection goes, not the work of those already here
            transport.abort()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            self._disarm()
        elif self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # the headers are in: the request is the app's now
        else:
            self._arm()  # between requests or inside unfinished headers: the clock runs

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._header_timeout)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # idle now: the keep-alive timeout takes over until the next request's first byte

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            return
        if not self.transport.is_closing():
            self.transport.close()


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound now so that a busy port is reported before anything starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def server_config(app: Any, max_connections: int, tls: tuple[str, str] | None = None) -> Any:
    """uvicorn's settings; with ``tls`` (certificate file, key file) it serves HTTPS."""
    import uvicorn

    GuardedH11Protocol.max_connections = max_connections
    cert, key = tls if tls else (None, None)
    return uvicorn.Config(app, http=GuardedH11Protocol, ssl_certfile=cert, ssl_keyfile=key, log_level="warning", access_log=False, lifespan="on",
                          # no limit_concurrency: past it uvicorn answers 503 to everything, health included
                          limit_concurrency=None, timeout_keep_alive=KEEP_ALIVE_S,
                          timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, backlog=BACKLOG,
                          h11_max_incomplete_event_size=MAX_INCOMPLETE_HEADERS,
                          # uvicorn's records (a 500's traceback) go through hangd's redacting handler
                          log_config=None)
