"""Running the gateway: uvicorn, with HFX's own signal handling."""

from __future__ import annotations

import socket
from typing import Any

from hfx.serving.gateway.access import Access
from hfx.serving.gateway.app import create_app
from hfx.serving.server import ServingCore


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
