"""``hfx serve`` as a subprocess on a free loopback port, for the benchmarks that talk HTTP to
it (soak, guidellm, long prompts): started, waited on until ``/ready``, stopped with SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Live:
    url: str
    model: str  # the served model id
    process: subprocess.Popen
    args: list[str]  # hfx serve's arguments, the port excluded


@contextmanager
def hfx_serve(*args: str, start_timeout: float = 60.0) -> Iterator[Live]:
    """``hfx serve ARGS --port P`` until the block ends."""
    port = free_port()
    cmd = [sys.executable, "-m", "hfx.cli", "serve", *args, "--port", str(port)]
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.2)
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        yield Live(url, model, process, list(args))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """/metrics parsed: (sample name, sorted labels) → value."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}
