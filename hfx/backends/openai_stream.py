"""One streamed completion from an OpenAI-compatible server, read at little cost per token.

Shared by every backend whose instances are OpenAI-compatible servers (vLLM's, hfx/backends/
vllm/; any other's, hfx/backends/openai/), and by the front processes that run their streams
(hfx/serving/front.py, hub.py). It reads OpenAI's ``/v1/completions`` SSE events and the
``token_ids`` field that vLLM (and ``hfx serve``) add with ``return_token_ids``: the tokens
sampled, which records and a retry's continuation need. A server that streams text alone has
each event's text tokenized where the stream is read (``text_ids``, the gateway's tokenizer):
the text is exact, the token count as close as the tokenizer's round trip.

The hot path of HFX over vLLM: every token of the fleet passes here. It uses aiohttp, whose
HTTP parser is C and whose connection pool does no work per event (httpx's pool checked every
open connection on each read: O(open streams) per token, and its parser is pure Python). Events
are split from the raw bytes as they come, several per read under load, and only the two fields
HFX needs (``token_ids`` and ``finish_reason``) are taken from each (orjson).

What can go wrong is told apart, because it decides who pays for it:

- ``ServerUnreachable``: no connection at all. The server may be gone; its health check says.
- ``UpstreamFault``: the server answered but this stream broke (dropped mid-response, a
  malformed or error event, a 5xx, no finish reason, silent past the idle bound). The request
  is lost on this server; the server itself may be fine.
- ``RequestRefused``: a 4xx, the request's own fault; no other server would do better.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

log = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT = 120.0  # seconds a stream may be silent (vLLM may queue it that long)
# Seconds an idle pooled connection is kept: under uvicorn's (so vLLM's) 5 s keep-alive, so the
# client lets a connection go before the server closes it under a request just sent.
KEEPALIVE = 4.0
_DATA = b"data: "
_DONE = b"[DONE]"


class ServerUnreachable(Exception):
    """No connection could be made to the server."""


class UpstreamFault(Exception):
    """The stream of one request broke; ``kind`` names how (for logs and metrics)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class RequestRefused(Exception):
    """The server refused the request itself (a 4xx): ``status`` and its answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# (token ids, finish reason or None) of each event, in order.
OnTokens = Callable[[list[int], "str | None"], None]
# A text piece's token ids, for a server that streams text alone (the gateway's tokenizer).
TextIds = Callable[[str], list[int]]


def new_session(fresh: bool = False) -> aiohttp.ClientSession:
    """One per server: no connection limit (each stream holds its connection for its whole
    life), no total timeout (a stream lasts as long as its output). ``fresh``: a new
    connection for each request, none kept."""
    connector = (aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, force_close=True) if fresh
                 else aiohttp.TCPConnector(limit=0, ttl_dns_cache=None,
                                           keepalive_timeout=KEEPALIVE))
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None, connect=5.0),
        skip_auto_headers=("User-Agent",), json_serialize=lambda o: orjson.dumps(o).decode())


async def stream_completion(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                            headers: dict[str, str], on_tokens: OnTokens,
                            idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                            text_ids: TextIds | None = None) -> str:
    """POST a streaming completion and call ``on_tokens`` per event; returns the finish reason.
    An event without ``token_ids`` gives ``text_ids`` of its text (none: no tokens). A
    connection that breaks before any answer is sent once more on a new connection, not one
    from the pool: the server closed it, idle, just as the request went out (it never saw it),
    and the pool's other idle connections may be as old."""
    data = orjson.dumps(body)
    timeout = aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=idle_timeout)
    headers = {**headers, "Content-Type": "application/json"}
    async with contextlib.AsyncExitStack() as stack:
        for attempt in range(2):
            try:
                response = await session.post(url, data=data, headers=headers, timeout=timeout)
                break
            except aiohttp.ClientConnectorError as e:
                raise ServerUnreachable(f"{type(e).__name__}: {e}") from None
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                if attempt:
                    raise UpstreamFault("dropped", f"no answer: {type(e).__name__}: {e}"
                                        ) from None
                log.warning("%s had no answer (%s); sending it again", url, type(e).__name__)
                session = await stack.enter_async_context(new_session(fresh=True))
            except asyncio.TimeoutError:
                raise UpstreamFault("stalled", f"no answer in {idle_timeout:g} s") from None
        async with response:
            if response.status != 200:
                detail = (await response.read()).decode(errors="replace")[:500]
                message = f"the server answered {response.status}: {detail}"
                if 400 <= response.status < 500:
                    raise RequestRefused(response.status, message)
                raise UpstreamFault("status", message)
            try:
                return await _events(response, on_tokens, text_ids)
            except asyncio.TimeoutError:
                raise UpstreamFault("stalled", f"the stream was silent for {idle_timeout:g} s"
                                    ) from None
            except aiohttp.ClientPayloadError as e:
                raise UpstreamFault("dropped", f"the stream broke off: {e}") from None
            except (aiohttp.ClientConnectionError, ConnectionError) as e:
                raise UpstreamFault("dropped", f"the stream broke off: {type(e).__name__}: {e}"
                                    ) from None
    raise AssertionError("unreachable")  # the loop breaks with a response or raises


async def _events(response: aiohttp.ClientResponse, on_tokens: OnTokens,
                  text_ids: TextIds | None) -> str:
    """The SSE events of one response, split from each read's bytes."""
    reason: str | None = None
    rest = b""
    async for data in response.content.iter_any():
        events = (rest + data).split(b"\n\n") if rest else data.split(b"\n\n")
        rest = events.pop()  # an event not yet whole (or b"")
        for event in events:
            if not event.startswith(_DATA):
                continue  # comments, blank keep-alives
            payload = event[6:]
            if payload == _DONE:
                if reason is None:
                    raise UpstreamFault("no-finish", "the stream ended without a finish reason")
                return reason
            reason = _event(payload, on_tokens, text_ids) or reason
    if reason is None:
        raise UpstreamFault("no-finish", "the stream ended without a finish reason")
    return reason  # a finish reason and then the end, without [DONE]: still whole


def _event(payload: bytes, on_tokens: OnTokens, text_ids: TextIds | None) -> str | None:
    try:
        chunk = orjson.loads(payload)
        if "error" in chunk and not chunk.get("choices"):
            raise UpstreamFault("error-event", f"stream error: {chunk['error']}")
        if not chunk["choices"]:
            return None  # a usage-only chunk (stream_options.include_usage)
        choice = chunk["choices"][0]
        tokens = choice.get("token_ids")
        if tokens is None:
            text = choice.get("text")
            tokens = text_ids(text) if text and text_ids is not None else []
        reason = choice.get("finish_reason")
        if not isinstance(tokens, list) or not (reason is None or isinstance(reason, str)):
            raise TypeError("token_ids must be a list, finish_reason a string")
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as e:
        raise UpstreamFault("malformed", f"a malformed event ({type(e).__name__}: {e}): "
                            f"{payload[:200]!r}") from None
    on_tokens(tokens, reason)
    return reason


@dataclass(frozen=True, slots=True)
class Ending:
    """How one relayed stream ended, as the instance that owns the request is told: ``kind`` is
    "finished" (``reason``: vLLM's finish reason), "aborted" (cancelled here), "refused" (the
    request's own fault, ``message``), or "fault" (the stream broke: ``reason`` names how,
    ``UpstreamFault.kind`` or "unreachable", and ``message`` says what happened)."""

    kind: str
    reason: str | None = None
    message: str | None = None

    def wire(self) -> tuple[str, str | None, str | None]:
        return self.kind, self.reason, self.message


ABORTED = Ending("aborted")


async def relay(session: aiohttp.ClientSession, url: str, request_id: str,
                body: dict[str, Any], on_tokens: Callable[[list[int]], None],
                idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                text_ids: TextIds | None = None) -> Ending:
    """One request's stream from ``url`` to its end, whatever the end is; ``on_tokens`` hears
    each event's token ids: the server's where the body asks for them (``return_token_ids``),
    else ``text_ids`` of each event's text. Cancelling it closes the connection (vLLM then
    aborts the request and frees its KV) and ends it as aborted."""
    def tokens(ids: list[int], reason: str | None) -> None:
        if ids:
            on_tokens(ids)

    try:
        reason = await stream_completion(
            session, f"{url}/v1/completions", body, {"X-Request-Id": request_id}, tokens,
            idle_timeout, None if body.get("return_token_ids") else text_ids)
        return Ending("finished", reason)
    except asyncio.CancelledError:
        return ABORTED
    except RequestRefused as e:
        return Ending("refused", message=str(e))
    except ServerUnreachable as e:
        return Ending("fault", "unreachable", str(e))
    except UpstreamFault as e:
        return Ending("fault", e.kind, str(e))


def ending_of(task: asyncio.Task[Ending]) -> Ending:
    """How a relay task ended: its result; aborted if it was cancelled, even before it ran
    (a coroutine cancelled before its first step never enters its ``try``: hence a done
    callback, not a ``finally``, reports the end); a fault if it raised."""
    if task.cancelled():
        return ABORTED
    error = task.exception()
    if error is not None:
        log.error("a relayed stream raised", exc_info=error)
        return Ending("fault", "raised", f"{type(error).__name__}: {error}")
    return task.result()


class LocalRelay:
    """Streams run in this process: the one-process gateway (``--api-workers 1``)."""

    def __init__(self, idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                 text_ids: TextIds | None = None) -> None:
        self.idle_timeout = idle_timeout
        self.text_ids = text_ids  # for servers that stream text alone
        self._session: aiohttp.ClientSession | None = None
        self._tasks: dict[int, asyncio.Task[Ending]] = {}  # stream id → its task

    def open(self, owner: RelayOwner, request_id: str, stream_id: int,
             body: dict[str, Any]) -> None:
        if self._session is None:
            self._session = new_session()
        loop = asyncio.get_running_loop()

        def tokens(ids: list[int]) -> None:
            owner.on_tokens(request_id, stream_id, ids, [loop.time()] * len(ids))

        task = loop.create_task(relay(self._session, owner.url, request_id, body, tokens,
                                      self.idle_timeout, self.text_ids),
                                name=f"stream-{request_id}")
        self._tasks[stream_id] = task
        task.add_done_callback(lambda t: self._done(owner, request_id, stream_id, t))

    def _done(self, owner: RelayOwner, request_id: str, stream_id: int,
              task: asyncio.Task[Ending]) -> None:
        self._tasks.pop(stream_id, None)
        owner.on_ended(request_id, stream_id, ending_of(task))

    def cancel(self, request_id: str, stream_id: int) -> None:
        task = self._tasks.get(stream_id)
        if task is not None:
            task.cancel()

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()


class RelayOwner(Protocol):
    """The instance a relayed stream reports to (``VLLMInstance``). A stream id names one
    stream of a request: a request resumed elsewhere, or decoded after its prefill, has a new
    one, and word of an older stream is ignored."""

    url: str

    def on_tokens(self, request_id: str, stream_id: int, ids: list[int],
                  times: list[float]) -> None: ...

    def on_ended(self, request_id: str, stream_id: int, ending: Ending) -> None: ...


class Relay(Protocol):
    """Where an instance's streams run: this process (``LocalRelay``) or a front process
    (``hfx.serving.hub``); either way the instance hears tokens and the end."""

    def open(self, owner: RelayOwner, request_id: str, stream_id: int,
             body: dict[str, Any]) -> None: ...

    def cancel(self, request_id: str, stream_id: int) -> None: ...
