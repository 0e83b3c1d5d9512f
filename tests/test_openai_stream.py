"""A request sent on a pooled connection the server has just closed goes again on a new one.

vLLM's server (uvicorn) closes a connection idle for 5 s; a request that goes out on it as it
closes gets no answer. The server below answers the first request of each connection and closes
the connection under any later one, so every pooled connection is such a one.
"""

from __future__ import annotations

import asyncio

import pytest

aiohttp = pytest.importorskip("aiohttp")

from hfx.backends.openai_stream import (  # noqa: E402
    KEEPALIVE,
    new_session,
    stream_completion,
)

EVENTS = (b'data: {"choices":[{"text":"ab","token_ids":[7,8],"finish_reason":null}]}\n\n'
          b'data: {"choices":[{"text":"c","token_ids":[9],"finish_reason":"length"}]}\n\n'
          b"data: [DONE]\n\n")


async def _one_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                              seen: list[int]) -> None:
    served = 0
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)
            seen.append(served)
            if served:
                break  # closed under the request: it gets no answer
            served += 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(EVENTS) + EVENTS)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()


async def _scenario() -> tuple[list[list[int]], list[int]]:
    seen: list[int] = []
    server = await asyncio.start_server(lambda r, w: _one_per_connection(r, w, seen),
                                        "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"
    got: list[list[int]] = []
    async with server, new_session() as session:
        async def one() -> str:
            tokens: list[int] = []
            reason = await stream_completion(session, url, {"prompt": "x"}, {},
                                             lambda ids, _r: tokens.extend(ids))
            got.append(tokens)
            return reason

        # Two at once: two connections, both pooled once answered.
        assert await asyncio.gather(one(), one()) == ["length", "length"]
        assert len(session.connector._conns[next(iter(session.connector._conns))]) == 2
        assert await one() == "length"
    return got, seen


def test_a_request_the_server_closed_under_is_sent_again_on_a_new_connection() -> None:
    got, seen = asyncio.run(_scenario())
    assert got == [[7, 8, 9]] * 3
    # Two first requests, one sent on a closed pooled connection, its resend on a new one.
    assert sorted(seen) == [0, 0, 0, 1]


def test_pooled_connections_are_let_go_before_vllms_keep_alive_ends() -> None:
    assert KEEPALIVE < 5.0  # uvicorn's timeout_keep_alive, vLLM's default

    async def kept() -> float:
        async with new_session() as session:
            return session.connector._keepalive_timeout

    assert asyncio.run(kept()) == KEEPALIVE
