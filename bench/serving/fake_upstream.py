"""A cheap stand-in for a vLLM OpenAI server, for relay benchmarks (bench/serving/relay_speed.py).

Raw asyncio (``asyncio.start_server``, a minimal HTTP/1.1 parser, keep-alive) and byte templates
built once, so that a streamed token costs it far less than it costs the relay in front of it.

- ``GET /health``: 200, empty.
- ``GET /v1/models``: the one model, ``max_model_len`` 4096.
- ``GET /metrics``: the few vLLM gauges and counters HFX scrapes, and ``vllm:cache_config_info``.
- ``POST /v1/completions``: ``"stream": true`` answers SSE, chunked, one event per token as vLLM
  writes them (``token_ids`` in every choice; ``finish_reason`` "length" on the last), then
  ``data: [DONE]``. Tokens come ``--tokens-per-tick`` at a time every ``--tick-ms`` per stream,
  each still its own event and its own HTTP chunk (as vLLM's events arrive under load: several
  together). ``X-Request-Id`` is echoed and names the completion (``cmpl-ID``), as in vLLM.
  Without ``"stream": true``: one JSON body with every token.
- ``--faults``: a prompt whose first token id is one of ``FAULTS``' keys meets that fault on
  every server, after ``FAULT_AFTER`` tokens: the connection dropped, a malformed event, a 500,
  the end without a finish reason, or silence (bench/serving/fault_mix.py).

    python bench/serving/fake_upstream.py --port 8100 --model bench-model
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
from collections.abc import Coroutine
from typing import Any

MAX_MODEL_LEN = 4096
# --faults: the prompt's first token id (a byte, as HFX's byte tokenizer encodes) → the fault.
FAULTS = {ord("#"): "drop", ord("$"): "malformed", ord("%"): "status500",
          ord("&"): "no-finish", ord("*"): "stall"}
FAULT_AFTER = 3  # tokens streamed before the fault


class Templates:
    """Every byte string a response needs, built once (per request only the id changes)."""

    def __init__(self, model: str, token_id: int, text: str, tokens_per_tick: int) -> None:
        self.model = model
        self.token_id = token_id
        self.text = text
        self.tokens_per_tick = tokens_per_tick
        m = json.dumps(model)
        t = json.dumps(text)
        # An event is HEAD + id + MID (not the last token) or HEAD + id + LAST.
        self.head = b'data: {"id":"cmpl-'
        tail = (f'","object":"text_completion","created":0,"model":{m},"choices":[{{"index":0,'
                f'"text":{t},"logprobs":null,"finish_reason":')
        self.mid = (tail + f'null,"stop_reason":null,"token_ids":[{token_id}]}}]}}\n\n').encode()
        self.last = (tail + f'"length","stop_reason":null,"token_ids":[{token_id}]}}]}}\n\n'
                     ).encode()
        self.done = chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        self.models = json.dumps({"object": "list", "data": [
            {"id": model, "object": "model", "created": 0, "owned_by": "bench",
             "max_model_len": MAX_MODEL_LEN}]}).encode()
        labels = f'{{engine="0",model_name="{model}"}}'
        self.metrics_head = (
            f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{labels} ")
        self.metrics_tail = (
            f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{labels} 0.0\n"
            f"# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total{labels} 0.0\n"
            "# TYPE vllm:cache_config_info gauge\n"
            'vllm:cache_config_info{block_size="16",engine="0",num_cpu_blocks="None",'
            'num_gpu_blocks="100000"} 1.0\n')

    def stream_head(self, rid: bytes | None) -> bytes:
        extra = b"x-request-id: " + rid + b"\r\n" if rid else b""
        return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                b"transfer-encoding: chunked\r\n" + extra + b"\r\n")

    def groups(self, rid: bytes, max_tokens: int) -> list[bytes]:
        """The stream's writes, one per tick: its events (each a chunk), the last with [DONE]."""
        mid = chunk(self.head + rid + self.mid)
        k = self.tokens_per_tick
        full, rest = divmod(max_tokens - 1, k)
        out = [mid * k] * full
        last = chunk(self.head + rid + self.last)
        out.append(mid * rest + last + self.done)
        return out

    def completion(self, rid: bytes, max_tokens: int) -> bytes:
        return json.dumps({
            "id": f"cmpl-{rid.decode()}", "object": "text_completion", "created": 0,
            "model": self.model, "choices": [{
                "index": 0, "text": self.text * max_tokens, "logprobs": None,
                "finish_reason": "length", "stop_reason": None,
                "token_ids": [self.token_id] * max_tokens}],
            "usage": {"prompt_tokens": 0, "completion_tokens": max_tokens,
                      "total_tokens": max_tokens}}).encode()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def response(status: str, body: bytes, content_type: bytes = b"application/json",
             extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: " + content_type
            + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n" + extra + b"\r\n"
            + body)


class Upstream:
    def __init__(self, templates: Templates, tick: float, faults: bool = False) -> None:
        self.t = templates
        self.tick = tick
        self.faults = faults
        self.running = 0
        self.ids = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.split(b"\r\n")
                parts = lines[0].split(b" ")
                if len(parts) != 3:
                    writer.write(response("400 Bad Request", b"bad request line"))
                    return
                method, target = parts[0], parts[1].split(b"?", 1)[0]
                length, rid, close = 0, None, parts[2] == b"HTTP/1.0"
                for line in lines[1:]:
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"x-request-id":
                        rid = value.strip()
                    elif name == b"connection":
                        close = value.strip().lower() == b"close"
                body = await reader.readexactly(length) if length else b""
                await self.route(method, target, body, rid, writer)
                if close:
                    await writer.drain()
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def route(self, method: bytes, target: bytes, body: bytes, rid: bytes | None,
                    writer: asyncio.StreamWriter) -> None:
        t = self.t
        if target == b"/v1/completions" and method == b"POST":
            try:
                req = json.loads(body)
                max_tokens = int(req.get("max_tokens") or 16)
                stream = bool(req.get("stream"))
                prompt = req.get("prompt")
                fault = (FAULTS.get(prompt[0]) if self.faults and isinstance(prompt, list)
                         and prompt else None)
            except (ValueError, TypeError, AttributeError) as e:
                msg = json.dumps({"error": {"message": str(e), "type": "BadRequestError"}})
                writer.write(response("400 Bad Request", msg.encode()))
                return
            if max_tokens < 1:
                writer.write(response("400 Bad Request", b'{"error":"max_tokens < 1"}'))
                return
            if rid is None:
                self.ids += 1
                rid = b"%d" % self.ids
            if fault == "status500":
                writer.write(response("500 Internal Server Error", b'{"error":"boom"}'))
                return
            if not stream:
                writer.write(response("200 OK", t.completion(rid, max_tokens),
                                      extra=b"x-request-id: " + rid + b"\r\n"))
                return
            if fault is not None:
                await self.misbehave(rid, fault, writer)
                return
            await self.stream(rid, max_tokens, writer)
        elif target == b"/health":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        elif target == b"/v1/models":
            writer.write(response("200 OK", t.models))
        elif target == b"/metrics":
            labels = f'{{engine="0",model_name="{t.model}"}}'
            text = (f"{t.metrics_head}{float(self.running)}\n"
                    f"# TYPE vllm:num_requests_waiting gauge\n"
                    f"vllm:num_requests_waiting{labels} 0.0\n{t.metrics_tail}")
            writer.write(response("200 OK", text.encode(),
                                  b"text/plain; version=0.0.4; charset=utf-8"))
        else:
            writer.write(response("404 Not Found", b'{"detail":"Not Found"}'))

    async def misbehave(self, rid: bytes, fault: str, writer: asyncio.StreamWriter) -> None:
        """A stream that breaks after ``FAULT_AFTER`` tokens, as ``fault`` says."""
        t = self.t
        writer.write(t.stream_head(rid))
        for _ in range(FAULT_AFTER):
            await asyncio.sleep(self.tick)
            writer.write(chunk(t.head + rid + t.mid))
        await writer.drain()
        if fault == "drop":
            writer.transport.abort()  # the connection closes mid-response
        elif fault == "malformed":
            writer.write(chunk(b"data: {not json\n\n") + t.done)
        elif fault == "no-finish":
            writer.write(t.done)
        elif fault == "stall":
            await asyncio.sleep(3600)

    async def stream(self, rid: bytes, max_tokens: int, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        groups = self.t.groups(rid, max_tokens)
        self.running += 1
        try:
            writer.write(self.t.stream_head(rid))
            due = loop.time()
            for data in groups:
                due += self.tick
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                writer.write(data)
                if writer.transport.get_write_buffer_size() > 1 << 20:
                    await writer.drain()  # a client that stopped reading: don't buffer forever
        finally:
            self.running -= 1


async def main(args: argparse.Namespace) -> None:
    t = Templates(args.model, args.token_id, args.text, args.tokens_per_tick)
    up = Upstream(t, args.tick_ms / 1e3, args.faults)
    server = await asyncio.start_server(up.handle, args.host, args.port, backlog=4096)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--model", default="bench-model")
    p.add_argument("--tokens-per-tick", type=int, default=4,
                   help="tokens (each its own SSE event) written together per stream")
    p.add_argument("--tick-ms", type=float, default=20.0, help="ms between a stream's groups")
    p.add_argument("--token-id", type=int, default=1234, help="the id every token carries")
    p.add_argument("--text", default=" tok", help="the text every token carries")
    p.add_argument("--no-uvloop", action="store_true", help="plain asyncio even if uvloop is")
    p.add_argument("--faults", action="store_true", help="prompts starting with # $ %% & * "
                   "meet a fault (FAULTS)")
    args = p.parse_args()
    if args.tokens_per_tick < 1:
        p.error("--tokens-per-tick must be at least 1")
    with contextlib.suppress(KeyboardInterrupt):
        run(main(args), uvloop=not args.no_uvloop)


def run(main: Coroutine[Any, Any, None], uvloop: bool = True) -> None:
    """``asyncio.run``, on uvloop when it is installed and wanted."""
    if uvloop:
        try:
            import uvloop as uv
        except ImportError:
            pass
        else:
            uv.run(main)
            return
    asyncio.run(main)


if __name__ == "__main__":
    cli()
