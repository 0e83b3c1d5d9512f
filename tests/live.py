"""A live ``hfx serve`` gateway for tests: a free loopback port, served from a thread."""

from __future__ import annotations

import threading
import time

import openai
import uvicorn

from hfx.config import ServeConfig
from hfx.serving.build import build_server
from hfx.serving.gateway import create_app


class Running:
    """A gateway on a free loopback port, served from a background thread."""

    def __init__(self, **options) -> None:
        self.server = build_server(ServeConfig(port=0, **options))
        config = uvicorn.Config(create_app(self.server), host="127.0.0.1", port=0,
                                log_level="warning")
        self.uv = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.uv.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.uv.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        port = self.uv.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0)
        self.model = self.server.options.model_name

    def call(self, fn, timeout: float = 30.0):
        """``fn()`` on the server's event loop (where the control plane lives); its result."""
        async def run():
            return fn()

        return self.call_async(run, timeout)

    def call_async(self, fn, timeout: float = 30.0):
        """Await ``fn()`` on the server's event loop; its result."""
        import asyncio

        loop = self.uv.servers[0].get_loop()
        return asyncio.run_coroutine_threadsafe(fn(), loop).result(timeout)

    def engines(self):
        return [inst.engine for inst in self.server.control.instances.values()]

    def close(self) -> None:
        self.uv.should_exit = True
        self.thread.join(timeout=30)


def pid_alive(pid: int) -> bool:
    """Whether a process of this id exists (a server HFX should have stopped)."""
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
