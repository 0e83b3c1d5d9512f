"""vLLM servers under Ray actors: ``hfx serve --engine vllm --ray``.

Each server is a child process of a Ray actor, so Ray places it on any node with the CPUs (or
the GPU) asked for; the server listens on its node's address, and the control plane reaches it
over HTTP exactly as it reaches a server it started itself (``VLLMInstance`` does not know the
difference). The actor owns the process: it starts it (bound to the cores or GPU Ray gave the
actor), answers health and liveness, and stops the process group; when the actor dies its
server dies with it (the child is started to receive SIGTERM when its parent goes).

``RayVLLMServer`` is the control plane's handle, with ``VLLMServer``'s interface. Its
``alive()`` never blocks the loop: it reads the answer of the last liveness call and sends the
next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from hfx.backends.vllm.process import VLLMLaunch, VLLMServer

KILL_TIMEOUT_SECONDS = 30.0  # the actor's own grace period (10 s) and a margin


class VLLMServerActor:
    """In the actor's process: one vLLM server, listening on this node's address."""

    def __init__(self, launch: VLLMLaunch, index: int, count: int) -> None:
        # This node's address, and a log directory here (the launch's is on HFX's host).
        launch = replace(launch, host=ray.util.get_node_ip_address(),
                         log_dir=Path(tempfile.mkdtemp(prefix="hfx-vllm-")))
        gpus = ray.get_gpu_ids()
        # Ray sets CUDA_VISIBLE_DEVICES to the GPU it gave this actor: keep it (the launch's
        # own rule numbers devices by instance, for servers on this host alone).
        env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))} if gpus else {}
        self.server = VLLMServer(launch, index, count, env=env).start()

    def where(self) -> tuple[str, int | None, str]:
        """(url, pid, log path) of the server."""
        return self.server.url, self.server.pid, str(self.server.log_path)

    async def wait_ready(self) -> None:
        await self.server.wait_ready()

    def alive(self) -> bool:
        return self.server.alive()

    def kill(self) -> None:
        self.server.kill()


class RayVLLMServer:
    """A vLLM server started by a Ray actor, seen from the control plane."""

    def __init__(self, launch: VLLMLaunch, index: int, count: int,
                 actor_options: dict[str, Any]) -> None:
        self.launch = launch
        self.index = index
        self._count = count
        self._options = actor_options
        self.actor: Any = None
        self._where: Any = None  # (url, pid, log path), once the actor has started the server
        self._alive = True
        self._probe: Any = None  # the liveness call in flight

    def start(self) -> RayVLLMServer:
        """Ask Ray for the actor and return at once: a fleet's actors start in parallel."""
        self.actor = ray.remote(VLLMServerActor).options(**self._options).remote(
            self.launch, self.index, self._count)
        self._where = self.actor.where.remote()
        return self

    def _resolved(self) -> tuple[str, int | None, str]:
        if not isinstance(self._where, tuple):
            self._where = ray.get(self._where)
        return self._where

    @property
    def url(self) -> str:
        return self._resolved()[0]

    @property
    def pid(self) -> int | None:
        """On the actor's node."""
        return self._resolved()[1]

    @property
    def log_path(self) -> str:
        """On the actor's node."""
        return self._resolved()[2]

    def wait_ready_blocking(self) -> None:
        ray.get(self.actor.wait_ready.remote())

    async def wait_ready(self) -> None:
        await self.actor.wait_ready.remote()

    def alive(self) -> bool:
        """False once the actor said so or died; never waits for an answer."""
        if not self._alive or self.actor is None:
            return False
        if self._probe is not None:
            ready, _ = ray.wait([self._probe], timeout=0)
            if not ready:
                return True  # no answer yet: as alive as last time
            try:
                self._alive = ray.get(self._probe)
            except RayActorError:
                self._alive = False
        self._probe = self.actor.alive.remote() if self._alive else None
        return self._alive

    def kill(self) -> None:
        """Stop the server (its process group, on its node), then the actor."""
        if self.actor is None:
            return
        with contextlib.suppress(RayActorError, GetTimeoutError):
            ray.get(self.actor.kill.remote(), timeout=KILL_TIMEOUT_SECONDS)
        ray.kill(self.actor, no_restart=True)
        self._alive = False

    async def stop(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.kill)

    def log_tail(self) -> str:
        return f"(on the actor's node: {self.log_path})"


def ray_server_factory(num_cpus: float, num_gpus: float) -> Any:
    """What ``VLLMPlacement`` calls for each server: one actor per server, with these
    resources (a GPU server asks Ray for its GPU)."""
    options = {"num_cpus": num_cpus, "num_gpus": num_gpus}

    def new(launch: VLLMLaunch, index: int, count: int) -> RayVLLMServer:
        return RayVLLMServer(launch, index, count, options)

    return new
