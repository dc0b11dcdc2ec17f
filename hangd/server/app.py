"""The HTTP side of `hangd serve`: FastAPI routes by resource, /metrics, limits and auth."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from hangd import __version__
from hangd.redact import redact_obj
from hangd.server.deps import is_authenticated
from hangd.server.metrics import HangdCollector
from hangd.server.routes import health, incidents, node
from hangd.server.runtime import Daemon

MAX_BODY = 64 * 1024
OPEN_PATHS = ("/healthz", "/readyz")


class PrettyJSON(JSONResponse):
    """Indented JSON, so `curl /incidents` reads well in a terminal. Every response passes
    through ``redact_obj``: what the API serves is redacted whichever path produced it."""

    def render(self, content: Any) -> bytes:
        import json

        return (json.dumps(redact_obj(content), indent=2, ensure_ascii=False, allow_nan=False, default=str)
                + "\n").encode()


def create_app(daemon: Daemon, token: str | None, loopback: bool) -> FastAPI:
    app = FastAPI(title="hangd", version=__version__, default_response_class=PrettyJSON,
                  description="What every GPU process is doing, whether a distributed job is hung, why, and who is to blame.")
    app.state.daemon = daemon
    app.state.token = token
    app.state.loopback = loopback
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HangdCollector(daemon))
    # hangd's own CPU and memory, like every Prometheus exporter (process_cpu_seconds_total, ...)
    ProcessCollector(registry=registry)

    @app.middleware("http")
    async def limits(request: Request, call_next: Any) -> Response:
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > MAX_BODY):
            return PrettyJSON({"detail": f"request body over {MAX_BODY} bytes"}, status_code=413)
        if request.method not in ("GET", "POST", "HEAD", "OPTIONS"):
            return PrettyJSON({"detail": "method not allowed"}, status_code=405)
        return await call_next(request)

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        if not is_authenticated(request):
            return PlainTextResponse("a token is required\n", status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    def root() -> dict[str, Any]:
        return {"hangd": __version__, "see": ["/incidents", "/jobs", "/processes", "/gpus", "/timeline", "/metrics", "/docs"]}

    app.include_router(health.router)
    app.include_router(incidents.router)
    app.include_router(node.router)
    return app
