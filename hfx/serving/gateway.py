"""The OpenAI-compatible HTTP gateway (FastAPI): completions, chat completions, models, health,
metrics. Every refusal is an OpenAI-style error object; nothing a client sends stops the server.

The SLO applied to a request is echoed in the ``x-hfx-slo-ttft-ms`` / ``x-hfx-slo-tpot-ms`` /
``x-hfx-slo-source`` response headers and in the body's ``slo`` field (the last chunk of a
stream).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hfx.request import Outcome
from hfx.sampling import SamplingParams
from hfx.serving.metrics import CONTENT_TYPE
from hfx.serving.protocol import (
    RETRY_AFTER_SECONDS,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    chat_prompt,
)
from hfx.serving.server import ServingCore, Stream

if TYPE_CHECKING:
    from hfx.config import GatewaySection

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default for /v1/completions
DISCONNECT_POLL_SECONDS = 0.5  # how soon a non-streaming client that left is noticed
TOKENIZE_INLINE_CHARS = 16_384  # longer prompts are tokenized off the event loop
DEFAULT_CHAT_TOKENS = 256  # ours: a random-weight model rarely samples its end token


def _slo_fields(stream: Stream) -> dict[str, Any]:
    slo = stream.applied.slo
    return {"ttft_ms": None if slo is None else slo.ttft * 1e3,
            "tpot_ms": None if slo is None else slo.tpot * 1e3,
            "source": stream.applied.source, "priority": stream.applied.priority,
            "task": stream.applied.task}


def _slo_headers(stream: Stream) -> dict[str, str]:
    f = _slo_fields(stream)
    if f["ttft_ms"] is None:
        return {"x-hfx-slo-source": f["source"]}
    return {"x-hfx-slo-ttft-ms": f"{f['ttft_ms']:g}", "x-hfx-slo-tpot-ms": f"{f['tpot_ms']:g}",
            "x-hfx-slo-source": f["source"]}


def _timing(stream: Stream) -> dict[str, float | None]:
    """Server-side latency of the request, milliseconds (clients subtract it from theirs to
    see what the network and the gateway add)."""
    r = stream.record
    return {k: None if v is None else v * 1e3
            for k, v in (("queue_ms", r.queue_time), ("ttft_ms", r.ttft), ("e2e_ms", r.e2e))}


def _usage(stream: Stream, completion_tokens: int) -> dict[str, int]:
    p = stream.request.prompt_len
    return {"prompt_tokens": p, "completion_tokens": completion_tokens,
            "total_tokens": p + completion_tokens}


class _Generation:
    """Tokens of one stream turned into text pieces, with stop strings applied.

    Text is detokenized incrementally (vLLM's prefix/read offsets): each token decodes a short
    window of recent tokens, not the whole output. With stop strings, the last
    ``longest stop − 1`` characters are held back until they cannot begin a stop string, so a
    stream never shows text that the stop string then cuts; they come in the final chunk
    (``rest``).
    """

    def __init__(self, server: ServingCore, stream: Stream, stop: list[str]) -> None:
        self.server, self.stream, self.stop = server, stream, stop
        self.tokens: list[int] = []
        self.text = ""  # the output so far, cut at a stop string
        self.finish_reason: str | None = None
        self.error: str | None = None
        self._sent = 0  # characters of ``text`` already yielded
        self._hold = max(map(len, stop), default=1) - 1
        self._prefix = self._read = 0  # detokenization window: tokens[_prefix:] decode anew

    @property
    def rest(self) -> str:
        """Text not yielded yet (held back for stop strings); for the final chunk."""
        return self.text[self._sent:]

    def _decode_new(self) -> str:
        prefix = self.server.text(self.tokens[self._prefix:self._read])
        new = self.server.text(self.tokens[self._prefix:])
        if len(new) <= len(prefix) or new.endswith("\ufffd"):
            return ""  # nothing yet, or an incomplete UTF-8 sequence: wait for the next token
        self._prefix, self._read = self._read, len(self.tokens)
        return new[len(prefix):]

    async def batches(self) -> AsyncIterator[list[str]]:
        """The text pieces of the tokens that arrived together: one per token, empty or not, so
        that clients can time every token."""
        async for events in self.stream.batches():
            pieces: list[str] = []
            for event in events:
                if event.token is None:
                    self.finish_reason, self.error = event.finish_reason, event.error
                    break
                self.tokens.append(event.token)
                start = max(0, len(self.text) - self._hold)  # a stop string may begin here
                self.text += self._decode_new()
                hits = [at for s in self.stop if (at := self.text.find(s, start)) >= 0]
                if hits:  # a stop string: the output ends before it
                    self.text = self.text[:min(hits)]
                    self.finish_reason = "stop"
                    self.server.stopped(self.stream)  # finished, not abandoned: served
                    break
                end = max(self._sent, len(self.text) - self._hold)
                pieces.append(self.text[self._sent:end])
                self._sent = end
            if pieces:
                yield pieces
            if self.finish_reason is not None:
                return


@dataclass(frozen=True, slots=True)
class Access:
    """Who may call the gateway, from where, with how much."""

    api_key: str | None = None  # a Bearer token on /v1/* (as vLLM's --api-key)
    auth_metrics: bool = False
    auth_health: bool = False
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = 8 << 20

    @classmethod
    def of(cls, config: GatewaySection) -> Access:
        origins = tuple(o.strip() for o in (config.cors_origins or "").split(",") if o.strip())
        return cls(config.api_key, config.auth_metrics, config.auth_health, origins,
                   config.max_body_bytes)

    def guards(self, path: str) -> bool:
        if self.api_key is None:
            return False
        if path.startswith("/v1/"):
            return True
        return (self.auth_metrics and path == "/metrics") or (
            self.auth_health and path in ("/health", "/ready"))


class _Guard:
    """ASGI middleware: the API key, then the body limit — a body over ``max_body_bytes`` is
    refused (413) from its Content-Length or as soon as its chunks pass the limit, before the
    app reads it whole."""

    def __init__(self, app: Any, access: Access) -> None:
        self.app, self.access = app, access

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        if self.access.guards(scope["path"]) and not _authorized(
                headers.get("authorization", ""), self.access.api_key or ""):
            return await _refuse(send, APIError(401, "a valid API key is required "
                                                "(Authorization: Bearer KEY)",
                                                code="invalid_api_key"))
        limit = self.access.max_body_bytes
        too_large = APIError(413, f"the request body exceeds {limit} bytes",
                             code="request_too_large")
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await _refuse(send, too_large)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away mid-body
            size += len(message.get("body", b""))
            if size > limit:
                return await _refuse(send, too_large)
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # the disconnect, when it comes

        await self.app(scope, replay, send)


def _authorized(header: str, key: str) -> bool:
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                              key.encode())


async def _refuse(send: Any, e: APIError) -> None:
    body = json.dumps(e.body()).encode()
    await send({"type": "http.response.start", "status": e.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def create_app(server: ServingCore, access: Access | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await server.start()
        yield
        await server.stop()

    access = access or Access()
    app = FastAPI(title="HFX", lifespan=lifespan)
    app.state.server = server
    app.add_middleware(_Guard, access=access)
    if access.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(access.cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["*"], allow_credentials=False)

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
        first = e.errors()[0] if e.errors() else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        message = "; ".join(
            f"{'.'.join(str(x) for x in err.get('loc', ()) if x != 'body') or 'body'}: "
            f"{err.get('msg')}" for err in e.errors())
        return JSONResponse(APIError(400, message or "invalid request",
                                     param=".".join(loc) or None).body(), status_code=400)

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

    async def open_stream(kind: str, body: CompletionRequest | ChatCompletionRequest,
                          prompt_ids: list[int], max_tokens: int, request: Request) -> Stream:
        applied = server.resolve_slo(body.slo, body.priority, body.task, request.headers)
        sampling = SamplingParams(body.temperature, body.top_p, body.seed)
        return await server.open_stream(kind, body.model, prompt_ids, max_tokens, sampling, applied,
                           body.ignore_eos)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        ids = await _encode(server, body.prompt)
        stream = await open_stream("cmpl", body, ids, body.max_tokens or DEFAULT_COMPLETION_TOKENS,
                             request)
        gen = _Generation(server, stream, body.stop_strings)
        created = int(time.time())  # the response's timestamp, not a scheduling input

        def chunk(text: str, finish: str | None, **extra: Any) -> dict[str, Any]:
            return {"id": stream.request.id, "object": "text_completion", "created": created,
                    "model": body.model, "choices": [{"index": 0, "text": text,
                                                      "logprobs": None,
                                                      "finish_reason": finish}], **extra}

        if body.stream:
            return _sse(gen, _template(lambda mark: chunk(mark, None)),
                        lambda: chunk(gen.rest, gen.finish_reason, slo=_slo_fields(stream),
                                      timing=_timing(stream)),
                        lambda: chunk("", None, usage=_usage(stream, len(gen.tokens)))
                        if body.include_usage else None)
        return await _whole(gen, request, lambda: chunk(
            gen.text, gen.finish_reason, usage=_usage(stream, len(gen.tokens)),
            slo=_slo_fields(stream), timing=_timing(stream)))

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        ids = await _encode(server, chat_prompt(body.messages))
        max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_CHAT_TOKENS
        stream = await open_stream("chatcmpl", body, ids, max_tokens, request)
        gen = _Generation(server, stream, body.stop_strings)
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None, **extra: Any) -> dict[str, Any]:
            return {"id": stream.request.id, "object": "chat.completion.chunk",
                    "created": created, "model": body.model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                 "finish_reason": finish}], **extra}

        if body.stream:
            first = [True]
            opening = _template(lambda mark: chunk({"role": "assistant", "content": mark}, None))
            later = _template(lambda mark: chunk({"content": mark}, None))

            def piece_chunk(piece: str) -> bytes:
                if first[0]:
                    first[0] = False
                    return opening(piece)
                return later(piece)

            return _sse(gen, piece_chunk,
                        lambda: chunk({"content": gen.rest} if gen.rest else {},
                                      gen.finish_reason, slo=_slo_fields(stream),
                                      timing=_timing(stream)),
                        lambda: {**chunk({}, None), "choices": [],
                                 "usage": _usage(stream, len(gen.tokens))}
                        if body.include_usage else None)
        return await _whole(gen, request, lambda: {
            "id": stream.request.id, "object": "chat.completion", "created": created,
            "model": body.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": gen.text},
                         "logprobs": None, "finish_reason": gen.finish_reason}],
            "usage": _usage(stream, len(gen.tokens)), "slo": _slo_fields(stream),
            "timing": _timing(stream)})

    return app


def _error_of(gen: _Generation) -> APIError | None:
    """A request that ended without being served: rejected by the policy or shed by admission
    control (overload, 503), or failed on an instance (it broke, or could not hold the request:
    500, with the reason). What a client can get wrong is refused before submission, as a
    4xx."""
    if gen.finish_reason != "error":
        return None
    outcome = gen.stream.record.outcome
    if outcome is Outcome.REJECTED:
        return APIError(503, gen.error or "rejected", kind="server_error", code="rejected")
    if outcome is Outcome.SHED:  # waited past the bound (admission.py): try again later
        return APIError(503, f"overloaded: {gen.error}", kind="server_error", code="shed",
                        headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    return APIError(500, gen.error or "request failed", kind="server_error",
                    code="instance_failed")


async def _whole(gen: _Generation, request: Request, body) -> JSONResponse:
    """A non-streaming answer. Nothing is sent until the end, so the server would not notice a
    client that went away; a watcher polls the connection and aborts the request then, which
    frees its KV as a streaming disconnect does (issue 16)."""
    collect = asyncio.ensure_future(_drain(gen))
    watch = asyncio.ensure_future(_watch_disconnect(request))
    try:
        await asyncio.wait({collect, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not collect.done():  # the client left (or the handler was cancelled)
            collect.cancel()
        gen.server.abort(gen.stream)  # a no-op for a request that ended
    if not collect.done() or collect.cancelled():
        return JSONResponse({}, status_code=499)  # nobody is listening any more
    collect.result()
    err = _error_of(gen)
    if err is not None:
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)
    return JSONResponse(body(), headers=_slo_headers(gen.stream))


async def _encode(server: ServingCore, prompt: str | list[int]) -> list[int]:
    """Tokenize; a long prompt on a worker thread, so that other streams keep flowing while it
    is tokenized (tokenizers releases the GIL)."""
    if isinstance(prompt, str) and len(prompt) > TOKENIZE_INLINE_CHARS:
        return await asyncio.to_thread(server.encode, prompt)
    return server.encode(prompt)


async def _drain(gen: _Generation) -> None:
    async for _ in gen.batches():
        pass


async def _watch_disconnect(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_SECONDS)


_MARK = "\x00piece\x00"


def _template(chunk: Callable[[str], dict[str, Any]]) -> Callable[[str], bytes]:
    """An SSE event per text piece, from a chunk encoded once: the piece's JSON string is the
    only part that changes between tokens, so it alone is encoded per token."""
    head, tail = orjson.dumps(chunk(_MARK)).split(orjson.dumps(_MARK))
    head, tail = b"data: " + head, tail + b"\n\n"
    return lambda piece: head + orjson.dumps(piece) + tail


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _sse(gen: _Generation, piece_chunk: Callable[[str], bytes], final_chunk, usage_chunk
         ) -> StreamingResponse:
    """The stream as server-sent events: the tokens that arrived together in one write."""
    interval = gen.server.options.stream_interval

    async def events() -> AsyncIterator[bytes]:
        held: list[str] = []  # pieces not sent yet (--stream-interval > 1)
        try:
            async for pieces in gen.batches():
                if interval == 1:
                    yield b"".join(map(piece_chunk, pieces))
                    continue
                held += pieces
                whole = len(held) - len(held) % interval
                if whole:
                    yield b"".join(piece_chunk("".join(held[i:i + interval]))
                                   for i in range(0, whole, interval))
                    del held[:whole]
            if held:
                yield piece_chunk("".join(held))
            err = _error_of(gen)
            if err is not None:
                yield _event(err.body())
            else:
                extra = usage_chunk()
                yield _event(final_chunk()) + (b"" if extra is None else _event(extra))
            yield b"data: [DONE]\n\n"
        finally:
            gen.server.abort(gen.stream)  # the client disconnected: free the request's KV

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers=_slo_headers(gen.stream))


def serve(server: ServingCore, access: Access, host: str, port: int, shutdown_timeout: float,
          sockets: list[socket.socket] | None = None) -> None:
    """Run the gateway until a signal. The first SIGTERM or SIGINT drains: new requests get 503,
    in-flight ones have ``shutdown_timeout`` seconds to finish; a second signal exits at once.
    The asyncio loop, not uvloop: uvloop's loop.time() has millisecond resolution, too coarse
    for token timestamps of millisecond steps. httptools parses HTTP when installed."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # Not uvicorn's own: it re-raises the signal after the shutdown (the process then
            # dies of it, exit status -15), and only a second SIGINT forces the exit.
            if self.should_exit:  # the second signal, whichever it is
                self.force_exit = True
            self.should_exit = True
            server.draining = True

    # The ignore: uvicorn annotates the timeout int but passes it to asyncio.wait_for, which
    # takes seconds as a float (server.py); int() would cut 0.5 s to 0.
    config = uvicorn.Config(create_app(server, access), host=host, port=port,
                            log_level="warning", loop="asyncio",
                            timeout_graceful_shutdown=shutdown_timeout)  # type: ignore[arg-type]
    _Server(config).run(sockets=sockets)
