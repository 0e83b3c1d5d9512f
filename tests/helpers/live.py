"""A live ``hfx serve`` gateway for tests: a free loopback port, served from a thread."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import uvicorn

from hfx.config import ServeConfig
from hfx.serving.build import build_server
from hfx.serving.gateway import create_app
from hfx.serving.gateway.access import Access


class Running:
    """A gateway on a free loopback port, served from a background thread."""

    def __init__(self, **options) -> None:
        config = ServeConfig(port=0, **options)
        self.server = build_server(config)
        access = Access.of(config, self.server.options.tenant_keys)
        config = uvicorn.Config(create_app(self.server, access), host="127.0.0.1", port=0,
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Tree:
    """``hfx serve ... --api-workers 2`` as a process tree (its own session, killed whole)."""

    def __init__(self, *args: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from hfx.cli import main; sys.exit(main())",
             "serve", "--port", str(self.port), "--api-workers", "2", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, self.proc.stdout.read()
            assert time.monotonic() < deadline, "the tree did not start"
            try:
                if httpx.get(f"{self.url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        key = args[args.index("--api-key") + 1] if "--api-key" in args else "none"
        self.model = httpx.get(f"{self.url}/v1/models", headers={
            "Authorization": f"Bearer {key}"}).json()["data"][0]["id"]

    def fronts(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True,
                             text=True).stdout.split()
        pids = [int(p) for p in out]
        # The spawn start method's resource tracker is a child too; fronts run the gateway.
        return [p for p in pids if "hfx-front" in _cmdline(p) or _is_front(p)]

    def metric(self, name: str) -> float:
        """A sample's value, summed over labels unless ``name`` gives them."""
        total = 0.0
        for line in httpx.get(f"{self.url}/metrics").text.splitlines():
            key, _, value = line.rpartition(" ")
            if key == name or (key.startswith(name + "{") and "{" not in name):
                total += float(value)
        return total

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode(errors="replace")
    return ""


def _is_front(pid: int) -> bool:
    return "resource_tracker" not in _cmdline(pid)
