"""Who may call the gateway, and how much they may send: the API key and the body limit,
checked before any route runs. Raw ASGI, so that the completion routes (completions.py) need
no framework between the socket and their tokens."""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from starlette.types import Receive, Scope, Send

from hfx.serving.protocol import APIError
from hfx.serving.tenancy import bearer

if TYPE_CHECKING:
    from hfx.config import GatewaySection

__all__ = ["Access", "Receive", "Scope", "Send", "header_dict", "respond", "respond_json"]


@dataclass(frozen=True, slots=True)
class Access:
    """Who may call the gateway, from where, with how much."""

    api_key: str | None = None  # a Bearer token on /v1/* (as vLLM's --api-key)
    auth_metrics: bool = False
    auth_health: bool = False
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = 8 << 20
    tenant_keys: tuple[str, ...] = ()  # --tenants' API keys: each one valid too

    @classmethod
    def of(cls, config: GatewaySection, tenant_keys: Iterable[str] = ()) -> Access:
        """``tenant_keys``: the keys the server's --tenants declares (ServeOptions)."""
        origins = tuple(o.strip() for o in (config.cors_origins or "").split(",") if o.strip())
        return cls(config.api_key, config.auth_metrics, config.auth_health, origins,
                   config.max_body_bytes, tuple(sorted(tenant_keys)))

    def guards(self, path: str) -> bool:
        if self.api_key is None and not self.tenant_keys:
            return False
        if path.startswith("/v1/"):
            return True
        return (self.auth_metrics and path == "/metrics") or (
            self.auth_health and path in ("/health", "/ready"))

    def refusal(self, path: str, headers: dict[str, str]) -> APIError | None:
        """Why a request may not be served before its body is read: no valid key, or a
        Content-Length over the limit."""
        if self.guards(path) and not self._authorized(bearer(headers)):
            return APIError(401, "a valid API key is required (Authorization: Bearer KEY)",
                            code="invalid_api_key")
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return self.too_large()
        return None

    def _authorized(self, token: str | None) -> bool:
        if token is None:
            return False
        keys = (self.api_key, *self.tenant_keys) if self.api_key is not None else self.tenant_keys
        # Every key compared (in constant time each): which one matched is not timed.
        return any([hmac.compare_digest(token.encode(), key.encode()) for key in keys])

    def too_large(self) -> APIError:
        return APIError(413, f"the request body exceeds {self.max_body_bytes} bytes",
                        code="request_too_large")

    async def read_body(self, receive: Receive, send: Send) -> bytes | None:
        """The whole body, refused (413) as soon as its chunks pass the limit, before it is
        read whole; None when refused or when the client went away mid-body."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None  # the client went away mid-body
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body_bytes:
                await respond(send, self.too_large())
                return None
            chunks.append(body)
            if not message.get("more_body", False):
                return b"".join(chunks)


def header_dict(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1")
            for k, v in scope.get("headers", ())}


async def respond_json(send: Send, status: int, body: Any,
                       headers: dict[str, str] | None = None) -> None:
    """A whole JSON response."""
    data = orjson.dumps(body)
    raw = [(b"content-type", b"application/json"),
           (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1"))
            for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


async def respond(send: Send, e: APIError) -> None:
    """An OpenAI-style error object."""
    await respond_json(send, e.status, e.body(), e.headers)
