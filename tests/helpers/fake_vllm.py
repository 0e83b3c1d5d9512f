"""A stand-in for a vLLM OpenAI server, for the fast suite: the endpoints and fields HFX uses
(/health, /v1/models, /metrics with vLLM's gauge names, streaming /v1/completions with
``return_token_ids``), deterministic tokens, a fixed time per token, and a record of what it was
sent. It answers what real vLLM 0.32 answers for these (checked by hand against it); the real
thing is tests/test_vllm.py's tier."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

BLOCKS, BLOCK_SIZE, MAX_LEN = 512, 32, 2048


def next_token(seq: list[int]) -> int:
    """The token after ``seq``: a function of the whole sequence, as greedy decoding is, so a
    continuation (prompt + the tokens so far) goes on exactly as the whole request would."""
    return (sum(seq) * 31 + len(seq)) % 90 + 32  # printable ASCII: text is easy to compare


def generate(prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(next_token(seq))
    return seq[len(prompt):]


@dataclass
class FakeVLLM:
    model: str = "fake"
    seconds_per_token: float = 0.005
    bodies: list[dict] = field(default_factory=list)
    headers: list[dict] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    cancelled: list[str] = field(default_factory=list)
    healthy: bool = True
    dead: bool = False  # streams break off mid-response, as when the process is killed
    fail_prompts_with: int | None = None  # a prompt starting with this id gets an error chunk
    # Faults on cue: a prompt starting with a key gets that fault once, whichever
    # fake it reaches (share one dict between fakes), after ``FAULT_AFTER`` tokens: "drop"
    # (the connection closes mid-response), "malformed" (an event that is not JSON),
    # "status500", "no-finish" (ends with [DONE] and no finish reason), "stall" (goes
    # silent), "error-event" (vLLM's error chunk).
    faults: dict[int, str] = field(default_factory=dict)
    # The same, every time and on every fake: a bad request (a buggy client, a bad template).
    bad_prompts: dict[int, str] = field(default_factory=dict)
    # Another OpenAI-compatible server than vLLM (``--engine openai``): without vLLM's extras,
    # it streams text alone (a token's text is its byte: chr(id)), and may have no /health,
    # no /metrics, or refuse token-id prompts.
    token_ids: bool = True
    health_route: bool = True
    metrics_route: bool = True
    token_prompts: bool = True
    owned_by: str = "vllm"  # /v1/models' owner: "hfx" stands for another hfx serve

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health():
            if not self.health_route:
                return PlainTextResponse("not found", status_code=404)
            return PlainTextResponse("", status_code=200 if self.healthy else 500)

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": self.model, "object": "model",
                                                "owned_by": self.owned_by,
                                                "max_model_len": MAX_LEN}]}

        @app.get("/metrics")
        async def metrics():
            if not self.metrics_route:
                return PlainTextResponse("not found", status_code=404)
            labels = f'engine="0",model_name="{self.model}"'
            used = sum(1 for _ in self.running) * 2
            return PlainTextResponse(
                f"# HELP vllm:num_requests_running x\n"
                f"vllm:num_requests_running{{{labels}}} {float(len(self.running))}\n"
                f"vllm:num_requests_waiting{{{labels}}} 0.0\n"
                f"vllm:kv_cache_usage_perc{{{labels}}} {used / BLOCKS}\n"
                f"vllm:num_preemptions_total{{{labels}}} 0.0\n"
                f'vllm:cache_config_info{{block_size="{BLOCK_SIZE}",engine="0",'
                f'num_cpu_blocks="None",num_gpu_blocks="{BLOCKS}"}} 1.0\n')

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            self.bodies.append(body)
            self.headers.append(dict(request.headers))
            if body.get("priority", 0) and not isinstance(body["priority"], int):
                return JSONResponse({"error": {"message": "bad priority"}}, status_code=400)
            rid = request.headers.get("x-request-id", f"r{len(self.bodies)}")
            if not self.token_prompts and not isinstance(body["prompt"], str):
                return JSONResponse({"error": {"message": "prompt must be a string"}},
                                    status_code=400)
            prompt: list[int] = body["prompt"]
            n = body["max_tokens"]
            fault = self.faults.pop(prompt[0], None) or self.bad_prompts.get(prompt[0])
            if fault == "status500":
                return JSONResponse({"error": {"message": "boom"}}, status_code=500)

            async def stream():
                self.running.add(rid)
                try:
                    if self.fail_prompts_with is not None and prompt[0] == self.fail_prompts_with:
                        err = {"error": {"message": "EngineCore encountered an issue",
                                         "type": "InternalServerError", "code": 500}}
                        yield f"data: {json.dumps(err)}\n\n"
                        yield "data: [DONE]\n\n"
                        return
                    seq = list(prompt)
                    for i in range(n):
                        await asyncio.sleep(self.seconds_per_token)
                        if self.dead or (fault == "drop" and i == FAULT_AFTER):
                            raise ConnectionAbortedError("killed")  # uvicorn drops the socket
                        if i == FAULT_AFTER and fault is not None:
                            async for line in _misbehave(fault):
                                yield line
                            return
                        tok = next_token(seq)
                        seq.append(tok)
                        stop = tok in body.get("stop_token_ids", [])
                        reason = "stop" if stop else ("length" if i == n - 1 else None)
                        choice = {"index": 0, "text": "", "finish_reason": reason,
                                  "token_ids": [tok]}
                        if not self.token_ids or not body.get("return_token_ids"):
                            choice = {"index": 0, "text": chr(tok), "finish_reason": reason}
                        yield f"data: {json.dumps({'id': rid, 'choices': [choice]})}\n\n"
                        if reason is not None:
                            break
                    yield "data: [DONE]\n\n"
                except asyncio.CancelledError:
                    self.cancelled.append(rid)  # the client went away: vLLM aborts it
                    raise
                finally:
                    self.running.discard(rid)

            return StreamingResponse(stream(), media_type="text/event-stream")

        return app


FAULT_AFTER = 3  # tokens streamed before a fault on cue


async def _misbehave(fault: str):
    if fault == "malformed":
        yield "data: {not json\n\n"
    elif fault == "no-finish":
        yield "data: [DONE]\n\n"
    elif fault == "stall":
        await asyncio.sleep(3600)
    elif fault == "error-event":
        err = {"error": {"message": "EngineCore encountered an issue", "code": 500}}
        yield f"data: {json.dumps(err)}\n\n"
        yield "data: [DONE]\n\n"


class Served:
    """A FakeVLLM on a free loopback port, from a thread; ``stop()`` takes it down (the server
    'dies': connections drop, new ones are refused)."""

    def __init__(self, fake: FakeVLLM) -> None:
        self.fake = fake
        self.uv = uvicorn.Server(uvicorn.Config(fake.app(), host="127.0.0.1", port=0,
                                                log_level="warning"))
        self.thread = threading.Thread(target=self.uv.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.uv.started:
            assert time.monotonic() < deadline, "fake vLLM did not start"
            time.sleep(0.01)
        port = self.uv.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def die(self) -> None:
        """As a killed vLLM: open streams break off, new connections are refused."""
        self.fake.dead = True
        self.fake.healthy = False
        self.stop()

    def stop(self) -> None:
        self.uv.should_exit = True
        self.uv.force_exit = True  # drop open streams, as a killed process does
        self.thread.join(timeout=30)


class DropsFirstPost:
    """A TCP relay to a server that closes its first ``POST`` connection as the request arrives,
    with no answer: what a client sees when the server closes an idle keep-alive connection just
    as a request is sent on it. ``reused_only``: only a ``POST`` on a connection that has carried
    a request before is closed so (a new connection is never idle at the limit)."""

    def __init__(self, target: str, drops: int = 1, reused_only: bool = False) -> None:
        host, port = target.removeprefix("http://").rsplit(":", 1)
        self.drops, self.dropped = drops, 0
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       requests: bool) -> None:
            carried = False
            try:
                while data := await reader.read(65536):
                    if (requests and data.startswith(b"POST") and self.dropped < self.drops
                            and (carried or not reused_only)):
                        self.dropped += 1
                        return  # both sides close below, the request never forwarded
                    carried = carried or (requests and data.startswith(b"POST"))
                    writer.write(data)
                    await writer.drain()
            except ConnectionError:
                pass
            finally:
                writer.close()

        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
            up = asyncio.ensure_future(pipe(reader, up_writer, requests=True))
            down = asyncio.ensure_future(pipe(up_reader, writer, requests=False))
            await up  # a dropped request ends the upstream pipe: close the client's side too
            writer.close()
            await asyncio.gather(down, return_exceptions=True)

        async def main() -> None:
            server = await asyncio.start_server(relay, "127.0.0.1", 0)
            self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            ready.set()
            await server.serve_forever()

        threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True).start()
        assert ready.wait(10), "relay did not start"


def as_vllm_python(root) -> str:
    """An interpreter path for ``VLLMLaunch.python`` under which ``python -m
    vllm.entrypoints.openai.api_server`` is this fake as a process: what HFX starts, health
    polls, streams from and kills, with no vLLM installed. ``root``: a directory to write it in.
    """
    from pathlib import Path

    from bench.common import stand_in_vllm_python

    return stand_in_vllm_python(Path(root), "from fake_vllm import main\n\nmain()\n",
                                [str(Path(__file__).resolve().parent)])


def main() -> None:
    """The fake as ``python -m vllm.entrypoints.openai.api_server``: the flags HFX passes that
    it needs (--host, --port, --served-model-name); the rest are accepted and ignored."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--served-model-name", default="fake")
    args, _ = ap.parse_known_args()
    uvicorn.run(FakeVLLM(model=args.served_model_name).app(), host=args.host, port=args.port,
                log_level="warning")
