"""The completion routes, ``POST /v1/completions`` and ``/v1/chat/completions``: every token
of the fleet leaves through here, so they are raw ASGI from the server's ``send`` to the
stream's tokens. No framework wraps each chunk (FastAPI's and Starlette's middleware
and ``StreamingResponse`` cost a task group per response and several frames per chunk), the
reader wakes once per batch of tokens, and each chunk is pre-encoded bytes with only the text
piece encoded per token.

The SLO applied to a request is echoed in the ``x-hfx-slo-ttft-ms`` / ``x-hfx-slo-tpot-ms`` /
``x-hfx-slo-source`` response headers and in the body's ``slo`` field (the last chunk of a
stream).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import orjson
from pydantic import ValidationError

from hfx.cluster.control import TokenEvent
from hfx.request import Outcome
from hfx.sampling import SamplingParams
from hfx.serving.gateway.access import Receive, Send, respond, respond_json
from hfx.serving.gateway.generation import Generation
from hfx.serving.protocol import (
    RETRY_AFTER_SECONDS,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    chat_prompt,
)
from hfx.serving.server import ServingCore, Stream

log = logging.getLogger(__name__)

PATHS = {"/v1/completions": "cmpl", "/v1/chat/completions": "chatcmpl"}  # path → id prefix
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_CHAT_TOKENS = 256  # ours: a random-weight model rarely samples its end token
TOKENIZE_INLINE_CHARS = 16_384  # longer prompts are tokenized off the event loop
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache")]
_DONE = b"data: [DONE]\n\n"
_MARK = "\x00piece\x00"
# Wakes a stream's reader when its client leaves (the request is then aborted).
_CLIENT_LEFT = TokenEvent(None, "abort", "the client disconnected")


def slo_fields(stream: Stream) -> dict[str, Any]:
    slo = stream.applied.slo
    return {"ttft_ms": None if slo is None else slo.ttft * 1e3,
            "tpot_ms": None if slo is None else slo.tpot * 1e3,
            "source": stream.applied.source, "priority": stream.applied.priority,
            "task": stream.applied.task}


def slo_headers(stream: Stream) -> dict[str, str]:
    f = slo_fields(stream)
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


def _usage(gen: Generation) -> dict[str, Any]:
    p = gen.stream.request.prompt_len
    usage: dict[str, Any] = {"prompt_tokens": p, "completion_tokens": len(gen.tokens),
                             "total_tokens": p + len(gen.tokens)}
    cached = gen.stream.record.cached_tokens
    if cached:  # OpenAI's field for prompt tokens served from a cache
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def _template(chunk: Callable[[str], dict[str, Any]]) -> Callable[[str], bytes]:
    """An SSE event per text piece, from a chunk encoded once: the piece's JSON string is the
    only part that changes between tokens, so it alone is encoded per token."""
    head, tail = orjson.dumps(chunk(_MARK)).split(orjson.dumps(_MARK))
    head, tail = b"data: " + head, tail + b"\n\n"
    return lambda piece: head + orjson.dumps(piece) + tail


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class _Ids:
    """The token ids a stream's choices carry, when asked for, and how many went out."""

    def __init__(self, asked: bool) -> None:
        self.asked, self.sent = asked, 0

    def choice(self, choice: dict[str, Any], ids: list[int] | None) -> dict[str, Any]:
        if self.asked and ids is not None:
            choice["token_ids"] = ids
            self.sent += len(ids)
        return choice

    def rest(self, gen: Generation) -> list[int] | None:
        return gen.tokens[self.sent:] if self.asked else None


class Shape(Protocol):
    """What one route's answers look like. With ``return_token_ids`` (vLLM's extension) each
    choice also carries the token ids it adds: ``pieces`` then sends them, and the final chunk
    the ids not sent yet (a stop string's, or held back)."""

    ids: _Ids

    def piece(self, text: str) -> bytes: ...  # one streamed chunk, an SSE event

    def pieces(self, texts: list[str], ids: list[list[int]]) -> bytes: ...  # with token ids

    def final(self, gen: Generation) -> dict[str, Any]: ...  # the stream's last chunk

    def usage(self, gen: Generation) -> dict[str, Any]: ...  # stream_options.include_usage

    def whole(self, gen: Generation) -> dict[str, Any]: ...  # the non-streamed answer


class TextShape:
    """``/v1/completions``."""

    def __init__(self, rid: str, model: str, created: int, token_ids: bool = False) -> None:
        self.rid, self.model, self.created = rid, model, created
        self.ids = _Ids(token_ids)
        self.piece = _template(lambda mark: self.chunk(mark, None))

    def chunk(self, text: str, finish: str | None, ids: list[int] | None = None,
              **extra: Any) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {"id": self.rid, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": [self.ids.choice(choice, ids)], **extra}

    def pieces(self, texts: list[str], ids: list[list[int]]) -> bytes:
        return b"".join(_event(self.chunk(t, None, i)) for t, i in zip(texts, ids, strict=True))

    def final(self, gen: Generation) -> dict[str, Any]:
        return self.chunk(gen.rest, gen.finish_reason, self.ids.rest(gen),
                          slo=slo_fields(gen.stream), timing=_timing(gen.stream))

    def usage(self, gen: Generation) -> dict[str, Any]:
        return self.chunk("", None, usage=_usage(gen))

    def whole(self, gen: Generation) -> dict[str, Any]:
        return self.chunk(gen.text, gen.finish_reason, self.ids.rest(gen), usage=_usage(gen),
                          slo=slo_fields(gen.stream), timing=_timing(gen.stream))


class ChatShape:
    """``/v1/chat/completions``: the first streamed chunk names the assistant's role."""

    def __init__(self, rid: str, model: str, created: int, token_ids: bool = False) -> None:
        self.rid, self.model, self.created = rid, model, created
        self.ids = _Ids(token_ids)
        self._opening = _template(lambda mark: self.chunk({"role": "assistant",
                                                           "content": mark}, None))
        self._later = _template(lambda mark: self.chunk({"content": mark}, None))
        self._first = True

    def chunk(self, delta: dict[str, Any], finish: str | None, ids: list[int] | None = None,
              **extra: Any) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"id": self.rid, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [self.ids.choice(choice, ids)], **extra}

    def piece(self, text: str) -> bytes:
        if self._first:
            self._first = False
            return self._opening(text)
        return self._later(text)

    def pieces(self, texts: list[str], ids: list[list[int]]) -> bytes:
        out = []
        for text, i in zip(texts, ids, strict=True):
            delta = {"role": "assistant", "content": text} if self._first else {"content": text}
            self._first = False
            out.append(_event(self.chunk(delta, None, i)))
        return b"".join(out)

    def final(self, gen: Generation) -> dict[str, Any]:
        return self.chunk({"content": gen.rest} if gen.rest else {}, gen.finish_reason,
                          self.ids.rest(gen), slo=slo_fields(gen.stream),
                          timing=_timing(gen.stream))

    def usage(self, gen: Generation) -> dict[str, Any]:
        return {**self.chunk({}, None), "choices": [], "usage": _usage(gen)}

    def whole(self, gen: Generation) -> dict[str, Any]:
        return {"id": self.rid, "object": "chat.completion", "created": self.created,
                "model": self.model,
                "choices": [self.ids.choice(
                    {"index": 0, "message": {"role": "assistant", "content": gen.text},
                     "logprobs": None, "finish_reason": gen.finish_reason}, self.ids.rest(gen))],
                "usage": _usage(gen), "slo": slo_fields(gen.stream), "timing": _timing(gen.stream)}


def parse(model: type[CompletionRequest] | type[ChatCompletionRequest], body: bytes
          ) -> CompletionRequest | ChatCompletionRequest:
    """The body as the route's request model, or a 400 naming each bad field. JSON is read
    by orjson, and by the standard library where orjson refuses (a lone surrogate, NaN) so
    that the model's own checks say what is wrong."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as e:
            raise APIError(400, f"the body is not valid JSON: {e}") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errors = e.errors()
        where = [".".join(str(x) for x in err.get("loc", ())) for err in errors]
        message = "; ".join(f"{w or 'body'}: {err.get('msg')}"
                            for w, err in zip(where, errors, strict=True))
        param = (where[0] or None) if where else None
        raise APIError(400, message or "invalid request", param=param) from None


def error_of(gen: Generation) -> APIError | None:
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


class Completions:
    """Both completion routes over one serving core (in-process, or a front's)."""

    def __init__(self, server: ServingCore) -> None:
        self.server = server

    async def __call__(self, path: str, headers: Mapping[str, str], body: bytes,
                       receive: Receive, send: Send) -> None:
        try:
            gen, shape, request = await self._open(path, headers, body)
        except APIError as e:
            await respond(send, e)
            return
        except Exception as e:  # a bug, not the client's doing: still an OpenAI-style error
            log.exception("a completion request failed before its answer")
            await respond(send, APIError(500, f"internal error: {type(e).__name__}: {e}",
                                         kind="server_error", code="internal_error"))
            return
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            if request.stream:
                await self._stream(gen, shape, request.include_usage, receive, tracked)
            else:
                await self._whole(gen, shape, receive, tracked)
        except Exception as e:
            self.server.abort(gen.stream)
            if started:  # mid-stream: the connection ends, as any server's would
                raise
            log.exception("a completion request failed")
            await respond(send, APIError(500, f"internal error: {type(e).__name__}: {e}",
                                         kind="server_error", code="internal_error"))

    async def _open(self, path: str, headers: Mapping[str, str], body: bytes
                    ) -> tuple[Generation, Shape, CompletionRequest | ChatCompletionRequest]:
        kind = PATHS[path]
        request = parse(CompletionRequest if kind == "cmpl" else ChatCompletionRequest, body)
        if isinstance(request, ChatCompletionRequest):
            prompt: str | list[int] = chat_prompt(request.messages)
            max_tokens = (request.max_completion_tokens or request.max_tokens
                          or DEFAULT_CHAT_TOKENS)
        else:
            assert isinstance(request, CompletionRequest)
            prompt = request.prompt
            max_tokens = request.max_tokens or DEFAULT_COMPLETION_TOKENS
        server = self.server
        ids = await _encode(server, prompt)
        applied = server.resolve_slo(request.slo, request.priority, request.task, headers)
        sampling = SamplingParams(request.temperature, request.top_p, request.seed)
        stream = await server.open_stream(kind, request.model, ids, max_tokens, sampling,
                                          applied, request.ignore_eos)
        created = int(time.time())  # the response's timestamp, not a scheduling input
        rid = stream.request.id
        with_ids = request.return_token_ids
        shape: Shape = (TextShape(rid, request.model, created, with_ids) if kind == "cmpl"
                        else ChatShape(rid, request.model, created, with_ids))
        return Generation(server, stream, request.stop_strings), shape, request

    def _watch(self, stream: Stream, receive: Receive) -> asyncio.Future[Any]:
        """The client's disconnect, which wakes the stream's reader (and the request is then
        aborted: its KV freed)."""
        watch = asyncio.ensure_future(_disconnect(receive))

        def heard(t: asyncio.Future[Any]) -> None:
            if not t.cancelled() and t.exception() is None:
                stream.queue.put_nowait(_CLIENT_LEFT)

        watch.add_done_callback(heard)
        return watch

    async def _stream(self, gen: Generation, shape: Shape, include_usage: bool,
                      receive: Receive, send: Send) -> None:
        """Server-sent events: the tokens that arrived together in one write."""
        stream = gen.stream
        interval = self.server.options.stream_interval
        piece = shape.piece
        with_ids = shape.ids.asked
        held: list[str] = []  # pieces not sent yet (--stream-interval > 1)
        read = 0  # with token ids: the tokens given out with their pieces
        watch = self._watch(stream, receive)
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": _SSE_HEADERS + [(k.encode(), v.encode())
                                                   for k, v in slo_headers(stream).items()]})
            while gen.finish_reason is None:
                pieces = gen.feed(await stream.take())
                if with_ids:  # one event per piece, its token beside it
                    ids = [[t] for t in gen.tokens[read:read + len(pieces)]]
                    read += len(pieces)
                    if pieces:
                        await send({"type": "http.response.body",
                                    "body": shape.pieces(pieces, ids), "more_body": True})
                    continue
                if not pieces:
                    continue
                if interval == 1:
                    data = b"".join(map(piece, pieces))
                else:
                    held += pieces
                    whole = len(held) - len(held) % interval
                    if not whole:
                        continue
                    data = b"".join(piece("".join(held[i:i + interval]))
                                    for i in range(0, whole, interval))
                    del held[:whole]
                await send({"type": "http.response.body", "body": data, "more_body": True})
            if gen.end is _CLIENT_LEFT:
                return  # nobody to tell
            tail = piece("".join(held)) if held else b""
            err = error_of(gen)
            if err is not None:
                tail += _event(err.body())
            else:
                tail += _event(shape.final(gen))
                if include_usage:
                    tail += _event(shape.usage(gen))
            await send({"type": "http.response.body", "body": tail + _DONE,
                        "more_body": False})
        finally:
            watch.cancel()
            self.server.abort(stream)  # a no-op for a request that ended

    async def _whole(self, gen: Generation, shape: Shape, receive: Receive, send: Send
                     ) -> None:
        """A non-streamed answer. Nothing is sent until the end, so a client that leaves is
        noticed from its disconnect, and its request aborted: its KV freed as a streaming
        disconnect frees it."""
        watch = self._watch(gen.stream, receive)
        try:
            await gen.drain()
        finally:
            watch.cancel()
            self.server.abort(gen.stream)
        if gen.end is _CLIENT_LEFT:
            await respond_json(send, 499, {})  # nobody is listening any more
            return
        err = error_of(gen)
        if err is not None:
            await respond(send, err)
        else:
            await respond_json(send, 200, shape.whole(gen), slo_headers(gen.stream))


async def _disconnect(receive: Receive) -> None:
    """Until the client leaves. Any other message (a server that hands the body again, or
    more of it) is passed over rather than taken for the end of the watch, as Starlette's
    ``listen_for_disconnect`` does."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _encode(server: ServingCore, prompt: str | list[int]) -> list[int]:
    """Tokenize; a long prompt on a worker thread, so that other streams keep flowing while it
    is tokenized (tokenizers releases the GIL)."""
    if isinstance(prompt, str) and len(prompt) > TOKENIZE_INLINE_CHARS:
        return await asyncio.to_thread(server.encode, prompt)
    return server.encode(prompt)
