"""The floor of a Python streaming relay, for bench/serving/relay_speed.py: what relaying a vLLM
stream costs at the least, in the same language and the same kind of HTTP stack as HFX's gateway.

An aiohttp server whose ``POST /v1/completions`` forwards the body to the upstream on one shared
``aiohttp.ClientSession``, reads the upstream's SSE line by line, parses each ``data:`` event
with orjson and writes one OpenAI completion chunk (id, object, created, model, choices[index,
text, logprobs, finish_reason]) per event to the client, then ``data: [DONE]``. Nothing else: no
validation, no queue, no dispatch, no records. On uvloop when it is installed (``--no-uvloop``:
plain asyncio, as HFX's gateway runs).

    python bench/serving/relay_floor.py --port 8200 --upstream http://127.0.0.1:8100
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import orjson
from aiohttp import web

DONE = b"data: [DONE]\n\n"


def make_app(upstream: str) -> web.Application:
    url = upstream.rstrip("/") + "/v1/completions"
    session_key = web.AppKey("session", aiohttp.ClientSession)

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        app[session_key] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))
        yield
        await app[session_key].close()

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        session = app[session_key]
        async with session.post(url, data=body,
                                headers={"content-type": "application/json"}) as up:
            if up.status != 200:
                return web.Response(status=up.status, body=await up.read(),
                                    content_type="application/json")
            out = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await out.prepare(request)
            async for line in up.content:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].rstrip()
                if data == b"[DONE]":
                    break
                event = orjson.loads(data)
                choice = event["choices"][0]
                chunk = {"id": event["id"], "object": "text_completion",
                         "created": event["created"], "model": event["model"],
                         "choices": [{"index": choice["index"], "text": choice["text"],
                                      "logprobs": choice.get("logprobs"),
                                      "finish_reason": choice.get("finish_reason")}]}
                await out.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            await out.write(DONE)
            await out.write_eof()
            return out

    app = web.Application()
    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    return app


async def health(_: web.Request) -> web.Response:
    return web.Response()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8200)
    p.add_argument("--upstream", required=True, help="base URL of the vLLM(-like) server")
    p.add_argument("--no-uvloop", action="store_true", help="plain asyncio even if uvloop is")
    args = p.parse_args()
    loop = None
    if not args.no_uvloop:
        with contextlib.suppress(ImportError):
            import uvloop

            loop = uvloop.new_event_loop()
    web.run_app(make_app(args.upstream), host=args.host, port=args.port, access_log=None,
                print=None, loop=loop or asyncio.new_event_loop(), backlog=4096)


if __name__ == "__main__":
    main()
