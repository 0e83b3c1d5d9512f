"""``hfx serve --api-workers N``: the process tree.

This process is the control process: it binds the listening socket, starts the control plane
and the hub (hub.py), and N front processes (front.py) that share the socket, as vLLM's
``--api-server-count`` and uvicorn's workers do. It supervises them: a front that dies is
started again, after the hub has aborted its requests (nothing left running upstream, no gauge
above 0). One SIGTERM or SIGINT drains: the fronts stop taking requests and finish theirs
within ``--shutdown-timeout``, then the control plane stops; a second signal ends everything at
once. If a front cannot be kept up (``MAX_RESTARTS`` in ``RESTART_WINDOW`` seconds) the tree
exits non-zero rather than serve on less than asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

from hfx.serving.front import FrontSpec, run_front
from hfx.serving.hub import FrontHub
from hfx.serving.ipc import front_identity

if TYPE_CHECKING:
    from hfx.serving.gateway import Access
    from hfx.serving.server import Server

log = logging.getLogger(__name__)

SUPERVISE_SECONDS = 0.2  # how often the fronts are looked at
MAX_RESTARTS = 5  # restarts of one front within RESTART_WINDOW before the tree gives up
RESTART_WINDOW = 60.0


def listening_socket(host: str, port: int) -> socket.socket:
    sock = socket.create_server((host, port), backlog=4096)
    sock.set_inheritable(True)
    return sock


class ProcessTree:
    def __init__(self, server: Server, access: Access, host: str, port: int, workers: int,
                 shutdown_timeout: float, idle_timeout: float, tokens_at_front: bool,
                 front_timeout: float = 10.0) -> None:
        self.server = server
        self.front_timeout = front_timeout  # a front silent this long is wedged
        self.access = access
        self.workers = workers
        self.shutdown_timeout = shutdown_timeout
        self.sock = listening_socket(host, port)
        self.port = self.sock.getsockname()[1]
        self._dir = tempfile.mkdtemp(prefix="hfx-ipc-")
        self.address = f"{self._dir}/control"  # a Unix socket (ipc.py)
        self.hub = FrontHub(server, self.address, tokens_at_front)
        placement = server.placement
        if tokens_at_front and placement is not None:  # vLLM streams run in the fronts
            placement.relay = self.hub
            for instance in server.control.instances.values():
                instance.relay = self.hub  # type: ignore[attr-defined]
        self.spec = FrontSpec(server.tokenizer, server.options, self.address, idle_timeout,
                              shutdown_timeout, os.getpid())
        self.fronts: dict[int, BaseProcess] = {}
        self.restarts: dict[int, list[float]] = {}
        self._context = multiprocessing.get_context("spawn")
        self._stopping = 0  # signals received
        self.exit_code = 0

    def run(self) -> int:
        try:
            asyncio.run(self._main())
        finally:
            self.sock.close()
            shutil.rmtree(self._dir, ignore_errors=True)
        return self.exit_code

    def _start_front(self, index: int) -> None:
        process = self._context.Process(target=run_front, name=f"hfx-front-{index}",
                                        args=(self.spec, self.sock, index, self.access),
                                        daemon=True)
        process.start()
        self.fronts[index] = process

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._signal)
        await self.server.start()
        await self.hub.start()
        for index in range(self.workers):
            self._start_front(index)
        try:
            await self._supervise()
        finally:
            for process in self.fronts.values():
                if process.is_alive():
                    process.kill()
            await self.hub.stop()
            await self.server.stop()

    def _signal(self) -> None:
        self._stopping += 1
        self.server.draining = True
        # Our copy of the listening socket goes, so that once the fronts close theirs new
        # connections are refused rather than left in a backlog nobody accepts.
        self.sock.close()
        for process in self.fronts.values():
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM if self._stopping == 1 else
                            signal.SIGKILL)

    def _kill_if_wedged(self, index: int, process: BaseProcess) -> None:
        """A front alive but silent past ``front_timeout`` (stopped, deadlocked, its loop
        blocked) answers no one: kill it, and the next look finds it dead, aborts what it held
        (closing its upstream connections: vLLM aborts those requests) and replaces it."""
        silent = self.hub.silent_for(front_identity(index))
        if silent is None or silent <= self.front_timeout:
            return
        log.error("front %d sent nothing for %.1f s; it is killed and replaced", index, silent)
        self.hub.heard.pop(front_identity(index), None)  # killed once
        process.kill()

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SUPERVISE_SECONDS)
            if self._stopping:
                if not any(p.is_alive() for p in self.fronts.values()):
                    return  # every front drained (or was killed by a second signal)
                continue
            for index, process in list(self.fronts.items()):
                if process.is_alive():
                    self._kill_if_wedged(index, process)
                    continue
                log.error("front %d exited (%s); its requests are aborted and it restarts",
                          index, process.exitcode)
                try:
                    self.hub.front_died(index)
                except Exception:  # a bug there must not stop supervising the others
                    log.exception("aborting front %d's requests failed", index)
                now = loop.time()
                recent = [t for t in self.restarts.get(index, []) if now - t < RESTART_WINDOW]
                if len(recent) >= MAX_RESTARTS:
                    log.error("front %d died %d times in %g s: giving up", index,
                              len(recent), RESTART_WINDOW)
                    self.exit_code = 1
                    self._signal()
                    break
                self.restarts[index] = [*recent, now]
                self._start_front(index)
