"""The gateway's ASGI application: access checks first, then the completion routes (raw ASGI,
completions.py) or FastAPI for the rest (health, readiness, models, metrics)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.types import Message

from hfx.serving.gateway.access import Access, Receive, Scope, Send, header_dict, respond
from hfx.serving.gateway.completions import PATHS, Completions
from hfx.serving.metrics import CONTENT_TYPE
from hfx.serving.protocol import RETRY_AFTER_SECONDS, APIError
from hfx.serving.server import ServingCore


class Gateway:
    """The OpenAI-compatible HTTP gateway. Every refusal is an OpenAI-style error object;
    nothing a client sends stops the server."""

    def __init__(self, server: ServingCore, access: Access) -> None:
        self.server, self.access = server, access
        self.api = _api(server)
        self.state = self.api.state  # ``state.server``: for tests and operators' hooks
        self.completions = Completions(server)
        self._app: Any = self._route
        if access.cors_origins:  # outermost, so that refusals carry its headers too
            self._app = CORSMiddleware(self._route, allow_origins=list(access.cors_origins),
                                       allow_methods=["GET", "POST", "OPTIONS"],
                                       allow_headers=["*"], allow_credentials=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: the server's start and stop
            await self.api(scope, receive, send)
            return
        method = scope["method"]
        path = scope["path"].rstrip("/") or "/"  # /v1/completions/ is /v1/completions
        headers = header_dict(scope)
        refusal = self.access.refusal(path, headers)
        if refusal is not None:
            await respond(send, refusal)
            return
        if path in PATHS:
            if method != "POST":
                await respond(send, APIError(405, f"{path} takes POST", code="method_not_allowed",
                                             headers={"Allow": "POST"}))
                return
            body = await self.access.read_body(receive, send)
            if body is not None:
                await self.completions(path, headers, body, receive, send)
            return
        if method not in ("POST", "PUT", "PATCH"):
            await self.api(scope, receive, send)
            return
        body = await self.access.read_body(receive, send)  # the limit holds on every route
        if body is None:
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # the disconnect, when it comes

        await self.api(scope, replay, send)


def create_app(server: ServingCore, access: Access | None = None) -> Gateway:
    return Gateway(server, access or Access())


def _api(server: ServingCore) -> FastAPI:
    """Everything but the completions: the server's lifespan, health, readiness, models and
    metrics."""
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await server.start()
        yield
        await server.stop()

    app = FastAPI(title="HFX", lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(Exception)
    async def internal(_: Request, e: Exception) -> JSONResponse:
        # A bug, not the client's doing: still an OpenAI-style error (Starlette logs the
        # traceback and the server goes on).
        return JSONResponse(APIError(500, f"internal error: {type(e).__name__}: {e}",
                                     kind="server_error", code="internal_error").body(),
                            status_code=500)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return JSONResponse(APIError(400, "; ".join(str(err.get("msg")) for err in e.errors())
                                     or "invalid request").body(), status_code=400)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness: the process serves HTTP. Whether it can serve requests is /ready."""
        return {"status": "ok", **server.readiness()}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """Readiness: 200 while an instance accepts work (or one is starting); else 503 with
        the reason and Retry-After, so a load balancer sends traffic elsewhere."""
        state = server.readiness()
        if state["ready"]:
            return JSONResponse({"status": "ready", **state})
        return JSONResponse({"status": "unavailable", **state}, status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER_SECONDS)})

    def model_card() -> dict[str, Any]:
        return {"id": server.options.model_name, "object": "model", "created": 0,
                "owned_by": "hfx", "max_model_len": server.options.max_model_len}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != server.options.model_name:
            raise APIError(404, f"the model {model_id!r} does not exist; this server serves "
                           f"{server.options.model_name!r}", param="model",
                           code="model_not_found")
        return model_card()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(await server.render_metrics(), media_type=CONTENT_TYPE)

    return app
