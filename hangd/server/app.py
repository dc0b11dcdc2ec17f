"""The HTTP side of `hangd serve`: FastAPI routes by resource, /metrics, limits and auth."""

from __future__ import annotations

import contextlib
import importlib.resources
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from hangd import __version__
from hangd.redact import redact_obj
from hangd.server import links
from hangd.server.deps import AuthDep, is_authenticated
from hangd.server.metrics import HangdCollector
from hangd.server.routes import health, incidents, node, runbook
from hangd.server.runtime import Daemon

MAX_BODY = 64 * 1024
OPEN_PATHS = ("/healthz", "/readyz")
DOCS_STATIC = "/docs/static"
# /metrics gets threads of its own: under a crowd of API clients the shared pool is busy, and a
# scrape that waits behind them looks like hangd down to Prometheus
METRICS_THREADS = 2
# Threads for the (blocking, database-reading) routes. Few: they share one GIL with the event loop,
# and with 40 of them (anyio's default) a crowd of readers starves the loop that answers /healthz.
API_THREADS = 8


def docs_assets() -> str:
    """The directory of the Swagger UI and ReDoc files, shipped by the fastapi-offline package
    (the docs pages must load on air-gapped clusters, where a CDN is out of reach)."""
    return str(importlib.resources.files("fastapi_offline") / "static")


class PrettyJSON(JSONResponse):
    """Indented JSON, so `curl /incidents` reads well in a terminal. Every response passes
    through ``redact_obj``: what the API serves is redacted whichever path produced it."""

    def render(self, content: Any) -> bytes:
        import json

        return (json.dumps(redact_obj(content), indent=2, ensure_ascii=False, allow_nan=False, default=str)
                + "\n").encode()


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    anyio.to_thread.current_default_thread_limiter().total_tokens = API_THREADS
    yield


def create_app(daemon: Daemon, token: str | None, loopback: bool, read_token: str | None = None,
               external_base: str = "http://127.0.0.1:9877") -> FastAPI:
    # the docs pages are added below: behind the token like every other route, assets served locally
    app = FastAPI(title="hangd", version=__version__, default_response_class=PrettyJSON,
                  docs_url=None, redoc_url=None, openapi_url=None, lifespan=_lifespan,
                  description="What every GPU process is doing, whether a distributed job is hung, why, and who is to blame.")
    app.state.daemon = daemon
    app.state.token = token
    app.state.read_token = read_token
    app.state.link_key = links.link_key(token, read_token)
    app.state.loopback = loopback
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HangdCollector(daemon, external_base, app.state.link_key))
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

    metrics_threads = anyio.CapacityLimiter(METRICS_THREADS)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        if not is_authenticated(request):
            return PlainTextResponse("a token is required\n", status_code=401, headers={"WWW-Authenticate": "Bearer"})
        body = await anyio.to_thread.run_sync(generate_latest, registry, limiter=metrics_threads)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(_: AuthDep) -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def docs(_: AuthDep) -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="hangd API",
                                   swagger_js_url=f"{DOCS_STATIC}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{DOCS_STATIC}/swagger-ui.css",
                                   swagger_favicon_url=f"{DOCS_STATIC}/favicon.png",
                                   swagger_ui_parameters={"validatorUrl": None})  # no call to an online validator

    @app.get("/redoc", include_in_schema=False)
    async def redoc(_: AuthDep) -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title="hangd API",
                              redoc_js_url=f"{DOCS_STATIC}/redoc.standalone.js",
                              redoc_favicon_url=f"{DOCS_STATIC}/favicon.png", with_google_fonts=False)

    # the stock Swagger UI and ReDoc files: no data in them, so no token either
    app.mount(DOCS_STATIC, StaticFiles(directory=docs_assets()), name="docs-static")

    @app.get("/", include_in_schema=False)
    def root() -> dict[str, Any]:
        return {"hangd": __version__, "see": ["/incidents", "/jobs", "/processes", "/gpus", "/timeline", "/metrics", "/docs",
                                              links.RUNBOOK_PATH]}

    app.include_router(health.router)
    app.include_router(incidents.router)
    app.include_router(node.router)
    app.include_router(runbook.router)
    return app
